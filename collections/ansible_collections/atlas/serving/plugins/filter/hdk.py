"""Filters of the driver role (logic in module_utils/hdk.py).

``hdk_plan``               installed + wanted driver/firmware + package files (+ allow_downgrade)
                           -> {steps, order, problem}
``hdk_same_version``       running version (npu-smi) + wanted -> bool
``hdk_installer_outcome``  an installer's exit status -> running | reboot | failed
``hdk_installer_errors``   an installer's output -> [{code, description}] of its ERR_NO lines
``hdk_pending``            wanted + running driver/firmware + steps whose installer exited 2 -> what waits for a reboot
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils import hdk


def hdk_plan(installed: dict, wanted: dict, files: dict, allow_downgrade: bool = False) -> dict:
    return hdk.plan(installed.get("driver") or "", installed.get("firmware") or "", wanted.get("driver") or "",
                    wanted.get("firmware") or "", files.get("driver") or "", files.get("firmware") or "",
                    allow_downgrade=bool(allow_downgrade))


def hdk_same_version(running: str, wanted: str) -> bool:
    return hdk.same_version(running, wanted)


def hdk_installer_outcome(rc) -> str:
    return hdk.installer_outcome(rc)


def hdk_installer_errors(output: str) -> list:
    return hdk.installer_errors(output)


def hdk_pending(wanted: dict, running: dict, reboot_steps: list | None = None) -> list:
    return hdk.pending(wanted, running, reboot_steps)


class FilterModule:
    def filters(self):
        return {"hdk_plan": hdk_plan, "hdk_same_version": hdk_same_version,
                "hdk_installer_outcome": hdk_installer_outcome, "hdk_installer_errors": hdk_installer_errors,
                "hdk_pending": hdk_pending}
