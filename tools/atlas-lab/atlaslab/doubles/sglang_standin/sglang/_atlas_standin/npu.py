"""The NPUs the engine holds: ``/dev/davinciN`` open for as long as the process that plays the scheduler runs.

A real engine process that uses NPU N holds the driver's device ``/dev/davinciN`` open (torch_npu's device
init), and ``npu-smi info`` lists it in its process table (docs/ascend-platform.md section 6). The stand-in
does the same where the lab's driver made the devices (atlas-lab-driver): the ids in
``ASCEND_RT_VISIBLE_DEVICES`` when set, else every ``davinciN`` present; where none is present (a unit test,
a node without the driver) it holds nothing. ``ATLAS_STANDIN_DEV_DIR`` (default ``/dev``) is where it looks.

A device it cannot open (mode 0660, group HwHiAiUser, the serving user not in that group) ends the start
with a device-open failure like torch_npu's, exit status 1.
"""

from __future__ import annotations

import errno
import os
import re
import sys

_DEVICE = re.compile(r"^davinci(\d+)$")
_HELD: list[int] = []  # open for the life of the process: the engine "uses" these NPUs


class DeviceError(Exception):
    """A device the engine cannot open; ``npu``, ``path`` and the OSError's ``errno`` name it."""

    def __init__(self, npu: int, path: str, error: OSError):
        super().__init__(f"{path}: {error.strerror or error}")
        self.npu, self.path, self.errno, self.reason = npu, path, error.errno, error.strerror or str(error)


def dev_dir() -> str:
    return os.environ.get("ATLAS_STANDIN_DEV_DIR") or "/dev"


def present(directory: str) -> list[int]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in map(_DEVICE.match, names) if m)


def wanted(directory: str, visible: str | None) -> list[int]:
    """The NPUs to hold: ASCEND_RT_VISIBLE_DEVICES's ids, else every device present; none without devices."""
    found = present(directory)
    if not found:
        return []
    if visible is None or not visible.strip():
        return found
    return [int(part) for part in visible.split(",") if part.strip().isdigit()]


def hold(directory: str | None = None, visible: str | None = None) -> list[int]:
    """Open and keep open each NPU's device; raises DeviceError naming the first that cannot be opened."""
    directory = directory or dev_dir()
    if visible is None:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    held = []
    for npu in wanted(directory, visible):
        path = os.path.join(directory, f"davinci{npu}")
        try:
            _HELD.append(os.open(path, os.O_RDWR))
        except OSError as exc:
            raise DeviceError(npu, path, exc) from None
        held.append(npu)
    return held


def report(exc: DeviceError) -> None:
    """What the start prints when a device cannot be opened. The first line is the stand-in's own wording;
    the rest has the shape of torch_npu's device-open failure (Ascend/pytorch issue #67: ``NPU function
    error: c10_npu::SetDevice(device_id_), error code is 507033`` ... ``Failed to open device,
    retCode=0x7020014``); the exact text a permission failure prints was not verified."""
    fix = ("the serving user needs the group that owns the NPU devices (HwHiAiUser)"
           if exc.errno in (errno.EACCES, errno.EPERM) else
           "ASCEND_RT_VISIBLE_DEVICES must name NPUs the node has")
    sys.stderr.write(
        f"atlas stand-in: cannot open {exc.path} ({exc.reason}): {fix}\n"
        "RuntimeError: Initialize:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:146 NPU function error: "
        "c10_npu::SetDevice(device_id_), error code is 507033\n"
        f"[ERROR] (PID:{os.getpid()}, Device:{exc.npu}, RankID:-1) ERR00100 PTA call acl api failed\n"
        "[Error]: Failed to start the device.\n"
        "        Rectify the fault based on the error information in the ascend log.\n"
        f"        Failed to open device, retCode=0x7020014, deviceId={exc.npu}.[FUNC:InitRawDriver]"
        "[FILE:raw_device.cc][LINE:126]\n")
    sys.stderr.flush()
