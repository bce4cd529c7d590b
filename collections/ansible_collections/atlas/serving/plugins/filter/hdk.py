"""Filters of the driver role (logic in module_utils/hdk.py).

``hdk_plan``          installed + wanted driver/firmware + package files -> {steps, order, problem}
``hdk_same_version``  running version (npu-smi) + wanted -> bool
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils import hdk


def hdk_plan(installed: dict, wanted: dict, files: dict) -> dict:
    return hdk.plan(installed.get("driver") or "", installed.get("firmware") or "", wanted.get("driver") or "",
                    wanted.get("firmware") or "", files.get("driver") or "", files.get("firmware") or "")


def hdk_same_version(running: str, wanted: str) -> bool:
    return hdk.same_version(running, wanted)


class FilterModule:
    def filters(self):
        return {"hdk_plan": hdk_plan, "hdk_same_version": hdk_same_version}
