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
"""

from __future__ import annotations

import json
import os
import sys

STATE_PATH = os.environ.get("NPU_SMI_STATE", "/etc/atlas-lab/npu.json")
ASCEND = os.environ.get("ATLAS_LAB_ASCEND", "/usr/local/Ascend")
KINDS = ("driver", "firmware")


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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("running", "load"):
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
    kinds = tuple(argv[1:]) or KINDS
    if any(k not in KINDS for k in kinds):
        print(f"unknown kind in {kinds}; use driver or firmware", file=sys.stderr)
        return 1
    load(state, kinds)
    tmp = STATE_PATH + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, STATE_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
