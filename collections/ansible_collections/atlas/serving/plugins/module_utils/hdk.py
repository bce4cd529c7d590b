# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Ascend HDK (NPU driver and firmware) install plan: what to run, in which order.

Huawei's order (docs/ascend-platform.md, section 5): a first installation puts the driver in, then
the firmware (the firmware package flashes through the driver); an upgrade goes firmware
first, then driver. ``--upgrade`` does not go back to an older version: a downgrade is a
vendor procedure (uninstall the driver, install the older one, flash the firmware), so the
plan refuses it with that fix instead of half-doing it.
"""

from __future__ import annotations

import re

_DRIVER = re.compile(r"(\d+)\.(\d+)\.(?:rc(\d+)|(\d+))((?:\.\d+)*)", re.IGNORECASE)  # fullmatch
_FIRMWARE = re.compile(r"\d+(?:\.\d+)+")  # fullmatch


class HdkPlanError(ValueError):
    """A version that is not an HDK version; the message names it."""


def driver_key(version: str) -> tuple:
    """24.1.rc1 < 24.1.0 < 24.1.0.3 < 25.5.0 (a release candidate sorts before the release)."""
    match = _DRIVER.fullmatch(version or "")
    if not match:
        raise HdkPlanError(f"driver version {version!r} is not of the form 24.1.rc1, 24.1.0 or 25.5.0")
    major, minor, rc, patch, tail = match.groups()
    final, number = (0, int(rc)) if rc is not None else (1, int(patch))
    return (int(major), int(minor), final, number, *(int(p) for p in tail.split(".") if p))


def firmware_key(version: str) -> tuple:
    if not _FIRMWARE.fullmatch(version or ""):
        raise HdkPlanError(f"firmware version {version!r} is not of the form 7.1.0.6.220")
    return tuple(int(p) for p in version.split("."))


def same_version(running: str, wanted: str) -> bool:
    """The running version (npu-smi may add a build: 24.1.rc1.b030) is the wanted one."""
    running, wanted = (running or "").lower(), (wanted or "").lower()
    return bool(wanted) and (running == wanted or running.startswith(wanted + ".b"))


def _step(kind: str, have: str, want: str, file: str, key) -> dict | None:
    if not want:
        return None
    wanted = key(want)
    if have == want:
        return None
    if have and wanted < key(have):
        raise HdkPlanError(
            f"the {kind} installed is {have} and the bundle's is the older {want}: going back is not an upgrade. "
            f"Uninstall the driver (<path>/driver/script/uninstall.sh), reboot, then install {want} "
            f"(or set driver_version to {have} or newer)"
        )
    return {"kind": kind, "file": file, "op": "upgrade" if have else "install", "from": have or "", "to": want}


def plan(installed_driver: str, installed_firmware: str, want_driver: str, want_firmware: str,
         driver_file: str, firmware_file: str) -> dict:
    """Steps in Huawei's order; ``problem`` (non-empty) when the plan cannot be carried out.

    An empty wanted version leaves that part alone."""
    try:
        driver = _step("driver", installed_driver or "", want_driver or "", driver_file, driver_key)
        firmware = _step("firmware", installed_firmware or "", want_firmware or "", firmware_file, firmware_key)
    except HdkPlanError as exc:
        return {"steps": [], "order": "refused", "problem": str(exc)}
    first_install = not installed_driver
    if firmware and first_install and not driver:
        return {"steps": [], "order": "refused",
                "problem": "the firmware needs an installed driver and none is installed or planned: "
                           "set driver_version"}
    steps = [s for s in ((driver, firmware) if first_install else (firmware, driver)) if s]
    order = "none" if not steps else "first installation: driver, then firmware" if first_install \
        else "upgrade: firmware, then driver"
    return {"steps": steps, "order": order, "problem": ""}
