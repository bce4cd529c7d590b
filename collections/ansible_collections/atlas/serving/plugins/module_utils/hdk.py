# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Ascend HDK (NPU driver and firmware): the install plan, the installers' exit statuses and error lines, and
what runs only after a reboot.

Huawei's order (docs/ascend-platform.md, section 5): a first installation puts the driver in, then the firmware;
an upgrade or an overwrite goes firmware first, then driver (hiascend CANN 9.0.0 install guide instg_0005;
Ascend/ascend-deployer install_npu.yml @ 0fbb89f1). Huawei's driver installer performs ``--upgrade`` to an older
version too (hicann/driver install.sh @ ef377e95 has no "older refused" rule; only a hardware anti-rollback on
some boards). The suite refuses a downgrade by default and plans one only when asked to
(``allow_downgrade``, the role's ``driver_allow_downgrade``): then it is ``--upgrade`` steps in the upgrade order.
"""

from __future__ import annotations

import re

_DRIVER = re.compile(r"(\d+)\.(\d+)\.(?:rc(\d+)|(\d+))((?:\.\d+)*)", re.IGNORECASE)  # fullmatch
_FIRMWARE = re.compile(r"\d+(?:\.\d+)+")  # fullmatch
_ERROR_LINE = re.compile(r"\[ERROR\]\s*ERR_NO:(0x[0-9A-Fa-f]{4});ERR_DES:\s*(.*?)\s*$")
DOWNGRADE_FIX = "driver_allow_downgrade=true (or atlas_allow_downgrade: atlasctl rollout --allow-downgrade)"
# The exit statuses of Huawei's HDK installers, as the role reads them.
RUNNING, REBOOT, FAILED = "running", "reboot", "failed"


class HdkPlanError(ValueError):
    """A version that is not an HDK version, or a downgrade not asked for; the message names it."""


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


def installer_outcome(rc: int | None) -> str:
    """The exit status of Huawei's driver installer: 0 installed and running (the hot reset worked, "The new version
    takes effect immediately"), 2 installed and running only after a reboot ("Reboot needed for
    installation/upgrade to take effect!"; a first install whose chips do not all report boot status 16 ends so),
    anything else failed (hicann/driver scripts/package/custom/driver/common/scripts/install.sh @ ef377e95). The
    firmware installer's statuses are not published; Ascend/ascend-deployer (task_firmware.yml @ 0fbb89f1) counts 0
    and 2 as success, and so does this. ``None`` (no run: check mode) is ``running``."""
    if rc is None or int(rc) == 0:
        return RUNNING
    return REBOOT if int(rc) == 2 else FAILED


def installer_errors(output: str) -> list[dict]:
    """The error lines of Huawei's driver installer, ``[Driver] [<date>] [ERROR]ERR_NO:0x0095;ERR_DES:<text>``
    (drvEcho/errorUsage in hicann/driver scripts/package/custom/driver/common/scripts/{install.sh,args_parse.sh}
    @ ef377e95), as ``{"code": "0x0095", "description": <text>}`` in output order; lines without a code are left
    out."""
    errors = []
    for line in (output or "").splitlines():
        match = _ERROR_LINE.search(line)
        if match:
            errors.append({"code": match.group(1).lower(), "description": match.group(2)})
    return errors


def pending(wanted: dict, running: dict, reboot_steps: list | None = None) -> list[str]:
    """What runs only after a reboot, one line per part (driver, then firmware): a wanted version npu-smi does not
    report running, or one whose installer exited 2 in this run ("reboot needed"). ``wanted`` and ``running`` map
    driver/firmware to versions ("" or None: not wanted / nothing running); ``reboot_steps`` are the plan steps whose
    installer exited 2."""
    exited_2 = {step["kind"]: step for step in reboot_steps or []}
    lines = []
    for kind in ("driver", "firmware"):
        want = str(wanted.get(kind) or "")
        if not want:
            continue
        now = str(running.get(kind) or "none")
        why = [] if same_version(now, want) else [f"running: {now}"]
        if kind in exited_2:
            why.append(f"its installer ({exited_2[kind]['op']}) exited 2: reboot needed")
        if why:
            lines.append(f"{kind} {want} ({'; '.join(why)})")
    return lines


def _step(kind: str, have: str, want: str, file: str, key, allow_downgrade: bool) -> dict | None:
    if not want:
        return None
    wanted = key(want)
    if have == want:
        return None
    op = "upgrade" if have else "install"
    if have and wanted < key(have):
        if not allow_downgrade:
            raise HdkPlanError(
                f"the {kind} installed is {have} and the bundle's is the older {want}: going back is a downgrade, "
                f"refused unless asked for. To run Huawei's installer with --upgrade to {want} (firmware, then "
                f"driver), set {DOWNGRADE_FIX}; or set the wanted version to {have} or newer"
            )
        op = "downgrade"
    return {"kind": kind, "file": file, "op": op, "from": have or "", "to": want}


def plan(installed_driver: str, installed_firmware: str, want_driver: str, want_firmware: str,
         driver_file: str, firmware_file: str, allow_downgrade: bool = False) -> dict:
    """Steps in Huawei's order; ``problem`` (non-empty) when the plan cannot be carried out.

    An empty wanted version leaves that part alone. A step's ``op`` is install (nothing installed: the installer's
    --full), upgrade or downgrade (both the installer's --upgrade); a downgrade only with ``allow_downgrade``."""
    try:
        driver = _step("driver", installed_driver or "", want_driver or "", driver_file, driver_key, allow_downgrade)
        firmware = _step("firmware", installed_firmware or "", want_firmware or "", firmware_file, firmware_key,
                         allow_downgrade)
    except HdkPlanError as exc:
        return {"steps": [], "order": "refused", "problem": str(exc)}
    first_install = not installed_driver
    if firmware and first_install and not driver:
        return {"steps": [], "order": "refused",
                "problem": "the firmware needs an installed driver and none is installed or planned: "
                           "set driver_version"}
    steps = [s for s in ((driver, firmware) if first_install else (firmware, driver)) if s]
    return {"steps": steps, "order": _order(steps, first_install), "problem": ""}


def _order(steps: list[dict], first_install: bool) -> str:
    if not steps:
        return "none"
    if first_install:
        return "first installation: driver, then firmware"
    going_back = any(s["op"] == "downgrade" for s in steps)
    return f"{'downgrade' if going_back else 'upgrade'}: firmware, then driver"
