#!/usr/bin/python3
"""The running NPU driver and firmware of a lab node, apart from the installed ones.

Installed on every lab node as /usr/local/sbin/atlas-lab-driver. On a real server the
loaded kernel driver and the flashed firmware only change at a reboot after an HDK
install; the simulated NPU layer does the same: npu-smi reports the running versions
from /etc/atlas-lab/npu.json, the installers write <Ascend>/driver|firmware/version.info,
and the node's atlas-lab-npu-boot unit runs ``load`` at every boot. Python 3 standard
library only.

    atlas-lab-driver running driver|firmware   # the running version, or "none"
    atlas-lab-driver load [driver|firmware]     # run what is installed (boot; a first driver install)
    atlas-lab-driver hot-reset                  # run the installed driver now, unless a process holds an NPU

``hot-reset`` is what the driver installer tries after an upgrade (Huawei's device_hot_reset.sh): it gives up,
exit 1 naming them, while any process holds a /dev/davinciN (the vendor checks with fuser; here npu-smi's
process table, which lists every process holding an NPU, is asked), and fails when npu-smi cannot answer;
otherwise the installed driver runs at once. New firmware still waits for the next boot.

``load`` also makes the loaded driver's device nodes, as the real driver's do at every boot:
/dev/davinci0..N-1 (N = the node's NPUs in npu.json), /dev/davinci_manager, /dev/devmm_svm,
/dev/hisi_hdc, mode 0660, group HwHiAiUser when the node has it (else root); with no driver loaded it
removes them. A lab node may only make and open /dev/null's kind of device (nspawn's device policy), so
each is a character device 1:3: an engine can hold it open, and npu-smi sees who does (/proc/PID/fd).
Run as another user than root (a unit test) it makes regular files instead; a test's own state file
(NPU_SMI_STATE) puts them beside it (``dev/``), never in /dev; ATLAS_LAB_DEV_DIR names the directory.
"""

from __future__ import annotations

import grp
import json
import os
import re
import shutil
import stat
import subprocess
import sys

NODE_STATE = "/etc/atlas-lab/npu.json"
STATE_PATH = os.environ.get("NPU_SMI_STATE", NODE_STATE)
ASCEND = os.environ.get("ATLAS_LAB_ASCEND", "/usr/local/Ascend")
KINDS = ("driver", "firmware")
DEV_DIR = os.environ.get("ATLAS_LAB_DEV_DIR") or (
    "/dev" if STATE_PATH == NODE_STATE else os.path.join(os.path.dirname(STATE_PATH), "dev"))
CONTROL_DEVICES = ("davinci_manager", "devmm_svm", "hisi_hdc")
DEVICE_GROUP = "HwHiAiUser"
DEVICE_MODE = 0o660
NULL_DEVICE = os.makedev(1, 3)
_NPU_DEVICE = re.compile(r"^davinci\d+$")
# A row of npu-smi info's process table: | NPU  Chip | pid | name | memory |
_PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+\d+\s*\|\s*(\d+)\s*\|\s*(.*?)\s*\|\s*\d+\s*\|$")


def installed(kind: str) -> str | None:
    try:
        with open(os.path.join(ASCEND, kind, "version.info"), encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Version="):
                    return line.split("=", 1)[1].strip()
    except FileNotFoundError:
        return None
    return None


def running(state: dict, kind: str) -> str:
    if kind == "driver":
        return state["driver_version"] if state.get("driver_loaded", True) else "none"
    return state["firmware_version"]


def load(state: dict, kinds: tuple[str, ...]) -> dict:
    for kind in kinds:
        version = installed(kind)
        if kind == "driver":
            state["driver_loaded"] = version is not None
        if version is not None:
            state[f"{kind}_version"] = version
    return state


def device_names(state: dict) -> list[str]:
    """The device nodes of the loaded driver (none when it is not loaded)."""
    if not state.get("driver_loaded", True):
        return []
    return [f"davinci{dev['id']}" for dev in state.get("devices", [])] + list(CONTROL_DEVICES)


def device_gid(group: str = DEVICE_GROUP) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return 0


def node_kind() -> tuple[int, int]:
    """(file type, device numbers) of a node: /dev/null's character device as root, else a regular file."""
    return (stat.S_IFCHR, NULL_DEVICE) if os.geteuid() == 0 else (stat.S_IFREG, 0)


def _is_node(st: os.stat_result, kind: tuple[int, int]) -> bool:
    return stat.S_IFMT(st.st_mode) == kind[0] and (kind[0] != stat.S_IFCHR or st.st_rdev == kind[1])


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def ensure_node(path: str, gid: int | None, kind: tuple[int, int]) -> None:
    """``path`` as a device node of ``kind``, mode 0660, group ``gid`` (None: as made); an existing right
    one is kept."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not _is_node(st, kind):
        _remove(path)
        st = None
    if st is None:
        os.mknod(path, kind[0] | DEVICE_MODE, kind[1])
        st = os.lstat(path)
    if gid is not None and st.st_gid != gid:
        os.chown(path, -1, gid)
    if stat.S_IMODE(st.st_mode) != DEVICE_MODE:
        os.chmod(path, DEVICE_MODE)


def sync_devices(state: dict, dev_dir: str = DEV_DIR, kind: tuple[int, int] | None = None,
                 gid: int | None = None) -> list[str]:
    """Make the loaded driver's device nodes in ``dev_dir`` and remove the ones it does not have
    (NPUs beyond its count, all of them when no driver is loaded). Returns the names wanted. The group:
    ``gid``, else HwHiAiUser's (root's without it) when run as root; another user leaves its own."""
    kind = kind or node_kind()
    if gid is None and os.geteuid() == 0:
        gid = device_gid()
    wanted = device_names(state)
    os.makedirs(dev_dir, exist_ok=True)
    for name in os.listdir(dev_dir):
        if (_NPU_DEVICE.match(name) or name in CONTROL_DEVICES) and name not in wanted:
            _remove(os.path.join(dev_dir, name))
    for name in wanted:
        ensure_node(os.path.join(dev_dir, name), gid, kind)
    return wanted


def npu_holders(npu_smi: str = "npu-smi") -> list[str]:
    """``NPU <n>: pid <pid> (<name>)`` for each process npu-smi says holds an NPU; OSError when it cannot say."""
    try:
        out = subprocess.run([npu_smi, "info"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OSError(f"npu-smi did not answer ({exc})") from None
    if out.returncode != 0:
        raise OSError(f"npu-smi info failed: {out.stdout.strip() or out.stderr.strip()}")
    return [f"NPU {m.group(1)}: pid {m.group(2)} ({m.group(3)})"
            for m in map(_PROCESS_ROW.match, out.stdout.splitlines()) if m]


def hot_reset(state: dict) -> tuple[bool, str]:
    """Run the installed driver at once unless a process holds an NPU: (done, why not)."""
    try:
        held = npu_holders(os.environ.get("ATLAS_LAB_NPU_SMI", "npu-smi"))
    except OSError as exc:
        return False, f"cannot tell which processes hold the NPUs: {exc}"
    if held:
        return False, "processes hold the NPUs: " + "; ".join(held)
    load(state, ("driver",))
    return True, ""


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("running", "load", "hot-reset"):
        print(__doc__, file=sys.stderr)
        return 1
    with open(STATE_PATH, encoding="utf-8") as handle:
        state = json.load(handle)
    if argv[0] == "running":
        if argv[1:] not in (["driver"], ["firmware"]):
            print("usage: atlas-lab-driver running driver|firmware", file=sys.stderr)
            return 1
        print(running(state, argv[1]))
        return 0
    if argv[0] == "hot-reset":
        done, why = hot_reset(state)
        if not done:
            print(why, file=sys.stderr)
            return 1
    else:
        kinds = tuple(argv[1:]) or KINDS
        if any(k not in KINDS for k in kinds):
            print(f"unknown kind in {kinds}; use driver or firmware", file=sys.stderr)
            return 1
        load(state, kinds)
    tmp = STATE_PATH + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, STATE_PATH)
    sync_devices(state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
