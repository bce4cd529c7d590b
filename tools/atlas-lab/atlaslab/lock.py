"""The lab lock: one lab per machine, and who holds it.

One file, ``<lab>/lock`` (``/var/lib/atlas-lab/lock``; ``ATLAS_LAB_DIR`` moves it with the rest of the lab's
state), locked with flock(2), with its holder written inside: pid, what it is, since when. It is held for
two lengths of time:

* a run: the lab tests (tests/lab, tests/drills), the rollout benchmark and ``atlas-lab hold [-- COMMAND]``
  (an engineer's) hold it from before their first lab command to after their last, so no other lab comes up
  or goes down between two of their steps;
* a command: ``atlas-lab up``, ``down`` and ``power`` hold it while they change the lab.

Owner-aware: a holder's own process and every process below it run under its hold. The tests and the
benchmark run ``atlas-lab`` as child processes; a lab command whose process, or one of its ancestors, is the
holder written in the lock goes ahead without waiting, where a second flock would wait for its own parent
forever. Anyone else waits, and is told who holds the lab.

The kernel releases a flock when its holder exits, however it exits; the holder written in the file is then
stale, and the next holder writes over it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from atlaslab import paths

log = logging.getLogger(__name__)

_MAX_ANCESTORS = 64


def lock_path() -> Path:
    return paths.lab_dir() / "lock"


@dataclass(frozen=True)
class Holder:
    pid: int
    what: str
    since: float  # time.time() when it took the lock

    def describe(self) -> str:
        return f"pid {self.pid} ({self.what}, since {time.strftime('%H:%M:%S', time.localtime(self.since))})"


@dataclass(frozen=True)
class Hold:
    waited: float  # seconds spent waiting for another holder
    inherited: bool  # True: under the hold of this process or one of its ancestors, nothing taken here


@contextlib.contextmanager
def hold_lab(what: str) -> Iterator[Hold]:
    """Hold the lab lock for the block (``what``: how a waiter is told of this holder, e.g. ``atlas-lab up``).

    Under a hold of this process or one of its ancestors, the block runs at once under that hold. Otherwise it
    waits for the holder, saying who that is, and takes the lock."""
    path = lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:  # a+: created when missing, never truncated on open
        started = time.monotonic()
        if not _take_now(handle):
            holder = read_holder(path)
            if holder is not None and holder.pid in _lineage():
                yield Hold(waited=0.0, inherited=True)
                return
            log.warning("%s: the lab is held by %s; waiting for it", path,
                        holder.describe() if holder else "another process")
            fcntl.flock(handle, fcntl.LOCK_EX)
        _write_holder(handle, what)
        try:
            yield Hold(waited=time.monotonic() - started, inherited=False)
        finally:
            handle.truncate(0)
            handle.flush()
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_holder(path: Path | None = None) -> Holder | None:
    """Who holds the lab, as written in the lock (None: nobody wrote there, or it cannot be read); it is the
    holder only while the lock is held."""
    try:
        data = json.loads((path or lock_path()).read_text(encoding="utf-8"))
        return Holder(pid=int(data["pid"]), what=str(data["what"]), since=float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _take_now(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_holder(handle, what: str) -> None:
    handle.truncate(0)
    handle.write(json.dumps({"pid": os.getpid(), "what": what, "since": time.time()}) + "\n")
    handle.flush()


def _lineage() -> set[int]:
    """This process and its ancestors (/proc/<pid>/stat: the parent's pid is the field after the state)."""
    pids = {os.getpid()}
    pid = os.getpid()
    for _level in range(_MAX_ANCESTORS):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2:].split()[1])  # the name, in parentheses, may hold spaces
        if pid < 1:
            break
        pids.add(pid)
        if pid == 1:
            break
    return pids
