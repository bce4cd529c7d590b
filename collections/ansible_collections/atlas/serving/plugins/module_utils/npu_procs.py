# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who holds the NPUs, and whether they are back to idle before an instance's ranks start again.

A process that uses NPU N holds the driver's character device ``/dev/davinciN`` open (0660,
group HwHiAiUser); ``npu-smi info`` lists it in its process table and counts its memory in
HBM-Usage (docs/ascend-platform.md section 6). Leftovers are a known failure (docs/multinode-serving.md,
"NPUs free before a start"): a SIGKILLed API server leaves its engine core holding the NPUs (vllm
#55510); a zombie engine keeps NPU memory with no process left to stop (vllm-ascend #9888); HCCL
refuses a new process until about 10 s after the last one exited (EJ0001).

- :func:`scan`: /proc: every process holding a ``/dev/davinciN`` (``/proc/PID/fd``) and every engine
  process (``/proc/PID/exe`` or argv[0] under the engines root), with its name, command line and
  systemd unit (``/proc/PID/cgroup``);
- :func:`holders`: npu-smi's process rows and the scan, one entry per pid;
- :func:`leftovers`, :func:`npu_states`: what blocks a start on the NPUs checked;
- :func:`wait_free`: poll until nothing is left, or fail at the deadline with :func:`message`.

Standard library only, and no other module_utils: Ansible ships this file with ``npu_free``, and
``atlasctl doctor`` runs its source on a node with a small driver that prints the :func:`scan` as JSON.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

PROC_ROOT = "/proc"
DEV_PREFIX = "/dev/davinci"
# What an idle NPU uses is what the driver and firmware reserve: about 3.3 GB whatever the capacity (3318 of
# 65536 MB on a 910B3, docs/ascend-platform.md section 6): 5 % of a 64 GB NPU, 10.1 % of a 32 GB one. 15 % is
# idle on both, and far below what an engine left behind holds (its weights and KV cache).
IDLE_HBM_PCT = 15
HCCL_SETTLE_S = 10
CMDLINE_MAX = 300
_UNIT_SUFFIXES = (".service", ".scope")

# read_info() -> (parsed ``npu-smi info``, None) or (None, why it could not be read); npu_smi.read_info fits.
InfoReader = Callable[[], tuple]


class NpuFreeError(Exception):
    """An input the check cannot run with (the message names it and the fix)."""


# --- /proc -----------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def npu_of(target: str | None, dev_prefix: str = DEV_PREFIX) -> int | None:
    """``/dev/davinci3`` -> 3; the control devices (davinci_manager) and anything else -> None."""
    if not target or not target.startswith(dev_prefix):
        return None
    rest = target[len(dev_prefix):]
    return int(rest) if rest.isdigit() else None


def held_npus(fd_dir: str, dev_prefix: str = DEV_PREFIX) -> list[int] | None:
    """The NPUs whose device a process holds open (its ``/proc/PID/fd``); None when unreadable."""
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    found = {npu_of(_readlink(os.path.join(fd_dir, fd)), dev_prefix) for fd in fds}
    return sorted(n for n in found if n is not None)


def unit_of(cgroup: str | None) -> str | None:
    """The systemd unit (``x.service``, ``session-3.scope``) of a ``/proc/PID/cgroup``; the cgroup v2
    line (``0::``) first, else v1's ``name=systemd``; None outside any unit."""
    paths = {}
    for line in (cgroup or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            paths[parts[1]] = parts[2]
    path = paths.get("", paths.get("name=systemd", ""))
    units = [part for part in path.split("/") if part.endswith(_UNIT_SUFFIXES)]
    return units[-1] if units else None


def _under(path: str | None, root: str) -> bool:
    root = root.rstrip("/")
    return bool(path and root) and (path == root or path.startswith(root + "/"))


def is_engine(exe: str | None, argv0: str | None, engines_root: str) -> bool:
    """A process of an engine release: its executable or argv[0] lies under the engines root (argv[0]
    too: a virtualenv's python is a link to the system's, so exe alone names /usr/bin)."""
    if exe and exe.endswith(" (deleted)"):
        exe = exe[: -len(" (deleted)")]
    return _under(exe, engines_root) or _under(argv0, engines_root)


def read_process(proc_dir: str, pid: int, engines_root: str = "", dev_prefix: str = DEV_PREFIX) -> dict | None:
    """One process as the checks name it; None when it is gone (or a kernel thread)."""
    raw = _read(os.path.join(proc_dir, "cmdline"))
    if raw is None:
        return None
    argv = [a for a in raw.split("\0") if a]
    npus = held_npus(os.path.join(proc_dir, "fd"), dev_prefix)
    return {
        "pid": pid,
        "name": (_read(os.path.join(proc_dir, "comm")) or "?").strip(),
        "cmdline": " ".join(argv)[:CMDLINE_MAX],
        "npus": npus or [],
        "unit": unit_of(_read(os.path.join(proc_dir, "cgroup"))),
        "engine": is_engine(_readlink(os.path.join(proc_dir, "exe")), argv[0] if argv else None, engines_root),
        "readable": npus is not None,
    }


def scan(engines_root: str = "", proc_root: str = PROC_ROOT, dev_prefix: str = DEV_PREFIX) -> dict:
    """Every process holding an NPU or running an engine (this one left out), and the pids whose fds
    could not be read (another user's, when not run as root)."""
    processes, unreadable = [], []
    me = os.getpid()
    try:
        names = os.listdir(proc_root)
    except OSError as exc:
        raise NpuFreeError(f"cannot list {proc_root}: {exc.strerror}; the check needs the proc filesystem") from None
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit() or int(name) == me:
            continue
        proc = read_process(os.path.join(proc_root, name), int(name), engines_root, dev_prefix)
        if proc is None:
            continue
        if not proc.pop("readable"):
            unreadable.append(proc["pid"])
        if proc["npus"] or proc["engine"]:
            processes.append(proc)
    return {"processes": processes, "unreadable": unreadable}


# --- npu-smi and the scan together ----------------------------------------------------------


def holders(smi_rows: list, scanned: list, proc_root: str | None = None, engines_root: str = "") -> list[dict]:
    """One entry per pid from npu-smi's process rows and the scan, sorted by pid; ``memory_mb`` from
    npu-smi; ``seen`` says which saw it. With ``proc_root``, a pid only npu-smi lists is read there
    (name, command line, unit)."""
    by_pid = {p["pid"]: dict(p, npus=list(p["npus"]), memory_mb=None, seen=["proc"]) for p in scanned}
    for row in smi_rows:
        entry = by_pid.get(row["pid"])
        if entry is None:
            entry = by_pid[row["pid"]] = _smi_only(row, proc_root, engines_root)
        elif "npu-smi" not in entry["seen"]:
            entry["seen"].append("npu-smi")
        if row.get("npu") is not None and row["npu"] not in entry["npus"]:
            entry["npus"] = sorted(entry["npus"] + [row["npu"]])
        if row.get("memory_mb") is not None:
            entry["memory_mb"] = (entry["memory_mb"] or 0) + row["memory_mb"]
    return [by_pid[pid] for pid in sorted(by_pid)]


def _smi_only(row: dict, proc_root: str | None, engines_root: str) -> dict:
    found = read_process(os.path.join(proc_root, str(row["pid"])), row["pid"], engines_root) if proc_root else None
    entry = {"pid": row["pid"], "name": row.get("name") or "?", "cmdline": "", "npus": [], "unit": None,
             "engine": False}
    if found is not None:
        found.pop("readable")
        entry.update(found, npus=[])
    return dict(entry, memory_mb=None, seen=["npu-smi"])


def leftovers(processes: list, devices: list | None = None) -> list[dict]:
    """The processes that block a start on ``devices`` (None: any NPU): those holding one of them, and
    engine processes that hold no NPU."""
    wanted = None if devices is None else set(devices)
    return [p for p in processes
            if (p["npus"] and (wanted is None or wanted & set(p["npus"]))) or (p["engine"] and not p["npus"])]


def is_idle(used: int | None, total: int | None, idle_pct: int = IDLE_HBM_PCT) -> bool:
    return used is not None and bool(total) and used * 100 <= idle_pct * total


def npu_states(devices: list, wanted: list | None = None, idle_pct: int = IDLE_HBM_PCT) -> list[dict]:
    """Each NPU checked (``wanted``, None: every NPU listed): its HBM and whether it is back to idle."""
    listed = {d["id"]: d for d in devices}
    missing = sorted(set(wanted or []) - set(listed))
    if missing:
        raise NpuFreeError(f"devices {missing} are not listed by npu-smi info (it lists "
                           f"{sorted(listed) or 'no NPU'}); check only NPUs the node has")
    return [{"id": d["id"], "hbm_used_mb": d.get("hbm_used_mb"), "hbm_total_mb": d.get("hbm_total_mb"),
             "idle": is_idle(d.get("hbm_used_mb"), d.get("hbm_total_mb"), idle_pct)}
            for d in devices if wanted is None or d["id"] in wanted]


def check(info: dict | None, scanned: list, devices: list | None = None, idle_pct: int = IDLE_HBM_PCT,
          proc_root: str | None = None, engines_root: str = "") -> dict:
    """One look: ``free`` when no process is left on ``devices`` (None: the NPUs npu-smi lists) and each
    of them is back to idle."""
    rows = info["processes"] if info else []
    wanted = devices if devices is not None or not info else [d["id"] for d in info["devices"]]
    processes = leftovers(holders(rows, scanned, proc_root, engines_root), wanted)
    npus = npu_states(info["devices"], devices, idle_pct) if info else []
    return {"free": info is not None and not processes and all(n["idle"] for n in npus),
            "processes": processes, "npus": npus}


# --- the wait and its failure -------------------------------------------------------------


def wait_free(read_info: InfoReader, engines_root: str, wait_s: float, poll_s: float, devices: list | None = None,
              idle_pct: int = IDLE_HBM_PCT, proc_root: str = PROC_ROOT, dev_prefix: str = DEV_PREFIX,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> dict:
    """Poll until the NPUs are free or ``wait_s`` has passed: ``free``, ``processes``, ``npus``,
    ``waited_s``, ``unreadable`` (pids whose open files the last scan could not read: not run as
    root), and ``message`` when not free."""
    started = clock()
    while True:
        info, error = read_info()
        scanned = scan(engines_root, proc_root, dev_prefix)
        state = check(info, scanned["processes"], devices, idle_pct, proc_root, engines_root)
        waited = clock() - started
        if state["free"] or waited >= wait_s:
            break
        sleep(max(0.0, min(poll_s, wait_s - waited)))
    state["waited_s"] = round(waited, 1)
    state["unreadable"] = scanned["unreadable"]
    if not state["free"]:
        state["message"] = message(state, idle_pct, error)
    return state


def describe(proc: dict) -> str:
    """``pid 4242 (python3: /opt/.../bin/python -m ...) holds NPU 0, 1 (52000 MB), unit atlas-serving.service``."""
    what = f"pid {proc['pid']} ({proc['name']}" + (f": {proc['cmdline'][:120]}" if proc.get("cmdline") else "") + ")"
    if proc["npus"]:
        what += " holds NPU " + ", ".join(str(n) for n in proc["npus"])
        if proc.get("memory_mb") is not None:
            what += f" ({proc['memory_mb']} MB)"
    else:
        what += " holds no NPU"
    what += f", unit {proc['unit']}" if proc.get("unit") else ", in no systemd unit"
    if proc.get("engine"):
        what += ", an engine process"
    if proc.get("seen") == ["npu-smi"]:
        what += " (listed by npu-smi only)"
    return what


def zombie_npus(processes: list, npus: list) -> list[dict]:
    """NPUs whose HBM is not back to idle while no process holds them."""
    held = {n for p in processes for n in p["npus"]}
    return [n for n in npus if not n["idle"] and n["id"] not in held]


def fix(processes: list, zombies: list) -> str:
    """How to clear what is left: stop the processes (their units first), wait for HCCL, reboot for a zombie."""
    steps = []
    if processes:
        units = sorted({p["unit"] for p in processes if (p.get("unit") or "").endswith(".service")})
        loose = [str(p["pid"]) for p in processes if not (p.get("unit") or "").endswith(".service")]
        stops = (([f"`systemctl stop {' '.join(units)}`"] if units else [])
                 + ([f"`kill {' '.join(loose)}`"] if loose else []))
        steps.append(f"stop them: {' and '.join(stops)} (`kill -9 PID` for one that ignores SIGTERM); after the "
                     f"last one exits HCCL needs about {HCCL_SETTLE_S} s before a new process can use the NPUs "
                     f"(EJ0001: \"Wait for 10s after killing the last training process and try again\")")
    if zombies:
        steps.append("HBM held with no process left on NPU " + ", ".join(str(n["id"]) for n in zombies)
                     + " is a zombie engine (vllm-ascend #9888): only a reboot frees it; drain the node and reboot it")
    return "; ".join(steps)


def hbm_text(npus: list) -> str:
    return ", ".join(f"NPU {n['id']} {n['hbm_used_mb']}/{n['hbm_total_mb']} MB" for n in npus)


def message(state: dict, idle_pct: int = IDLE_HBM_PCT, error: str | None = None) -> str:
    """The failure: every process left, every NPU not back to idle, and the fix."""
    parts = []
    if state["processes"]:
        parts.append("left running: " + "; ".join(describe(p) for p in state["processes"]))
    busy = [n for n in state["npus"] if not n["idle"]]
    if busy:
        parts.append(f"HBM not back to idle (<= {idle_pct} % of the NPU): {hbm_text(busy)}")
    if error:
        parts.append(f"npu-smi info could not be read: {error}")
    remedy = fix(state["processes"], zombie_npus(state["processes"], state["npus"]))
    if error and not remedy:
        remedy = "make npu-smi answer (is the driver loaded? `npu-smi info`), then run again"
    return (f"the NPUs are not free after {state['waited_s']} s: {'. '.join(parts)}. Fix: {remedy}.")
