"""The lab lock (atlaslab.lock): one lock for atlas-lab, the lab tests and the rollout benchmark; owner-aware.

Real processes on a real flock, in a lab directory of their own (ATLAS_LAB_DIR): no lab is touched."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atlaslab import lock

# Holds the lab as argv[1]; runs argv[2:] (if any) while holding it; then waits for a line on stdin.
HOLDER = """
import subprocess, sys
from atlaslab.lock import hold_lab
with hold_lab(sys.argv[1]) as hold:
    print("held", hold.inherited, flush=True)
    if sys.argv[2:]:
        print(subprocess.run(sys.argv[2:], capture_output=True, text=True, timeout=30).stdout, end="", flush=True)
    sys.stdin.readline()
"""
# Takes the lab as argv[1] (an atlas-lab command would), says so, lets go.
COMMAND = """
import sys
from atlaslab.lock import hold_lab
with hold_lab(sys.argv[1]) as hold:
    print("command held", hold.inherited, flush=True)
"""


@pytest.fixture
def lab_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATLAS_LAB_DIR", str(tmp_path / "lab"))
    return tmp_path / "lab"


def _start(script: str, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)


def _holder(*args: str) -> subprocess.Popen:
    proc = _start(HOLDER, *args)
    assert proc.stdout.readline() == "held False\n"
    return proc


def _release(proc: subprocess.Popen) -> None:
    proc.communicate("\n", timeout=30)
    assert proc.returncode == 0


def _held_by_anyone(path: Path) -> bool:
    with open(path) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_a_second_process_waits_for_the_holder_and_is_told_who_holds_it(lab_dir: Path, tmp_path: Path) -> None:
    holder = _holder("the lab tests")
    said = tmp_path / "stderr"
    with open(said, "w") as err:
        command = _start(COMMAND, "atlas-lab up", stderr=err)
    deadline = time.monotonic() + 30
    while f"held by pid {holder.pid} (the lab tests, since" not in said.read_text():
        assert time.monotonic() < deadline, f"no waiting message naming the holder: {said.read_text()!r}"
        time.sleep(0.05)
    assert str(lab_dir / "lock") in said.read_text()
    time.sleep(0.3)
    assert command.poll() is None  # still waiting while the holder holds the lab
    _release(holder)
    out, _ = command.communicate(timeout=30)
    assert (command.returncode, out) == (0, "command held False\n")
    assert lock.read_holder() is None and not _held_by_anyone(lab_dir / "lock")


def test_a_command_run_by_the_holder_runs_under_its_hold(lab_dir: Path) -> None:
    # the lab tests and the benchmark run `atlas-lab up|down|power` as child processes while they hold the lab
    holder = _start(HOLDER, "make bench-rollout", sys.executable, "-c", COMMAND, "atlas-lab down")
    assert holder.stdout.readline() == "held False\n"
    assert holder.stdout.readline() == "command held True\n"  # at once: no deadlock with its own parent
    assert _held_by_anyone(lab_dir / "lock")  # the child's end of its block did not release the holder's lock
    holder_now = lock.read_holder()
    assert holder_now is not None and (holder_now.pid, holder_now.what) == (holder.pid, "make bench-rollout")
    _release(holder)


def test_a_hold_inside_a_hold_of_the_same_process_neither_waits_nor_releases(lab_dir: Path) -> None:
    with lock.hold_lab("the lab tests") as outer:
        assert not outer.inherited
        with lock.hold_lab("the lab tests") as inner:
            assert inner.inherited and inner.waited == 0.0
        assert _held_by_anyone(lab_dir / "lock")
        assert lock.read_holder().pid == os.getpid()
    assert not _held_by_anyone(lab_dir / "lock")


def test_a_holder_that_dies_leaves_the_lab_free(lab_dir: Path) -> None:
    holder = _holder("the lab tests")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert lock.read_holder().pid == holder.pid  # what it wrote stays: stale, and the lock is free
    command = _start(COMMAND, "atlas-lab up")
    out, err = command.communicate(timeout=30)
    assert (command.returncode, out) == (0, "command held False\n")
    assert "waiting" not in err


def test_atlas_lab_hold_holds_the_lab_for_a_command_whose_lab_commands_go_ahead(lab_dir: Path) -> None:
    # an engineer's session: `atlas-lab hold -- CMD` (no CMD: a shell), the lab commands CMD runs not held up
    argv = [sys.executable, "-m", "atlaslab", "hold", "--", sys.executable, "-c", COMMAND, "atlas-lab up"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout) == (0, "command held True\n"), run.stderr
    assert not _held_by_anyone(lab_dir / "lock")


def test_atlas_lab_hold_of_a_command_that_cannot_run_is_a_usage_error(lab_dir: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "atlaslab", "hold", "--", str(lab_dir / "no-such-tool")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no-such-tool: cannot run it" in run.stderr and "Traceback" not in run.stderr
