"""`make test`'s runner (tests/make_test.py): the foreground command, the --beside commands in make's session and a
process group of their own at the lowest priority they can ask for themselves (SCHED_IDLE, else nice 19) with nothing
else tuned, their log printed at the end, and the run failing when either side fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[2] / "make_test.py"
PY = sys.executable
# A --beside command that says its session, its process group and its scheduling policy.
WHERE = (f"{PY} -c 'import os; print(\"beside: session\", os.getsid(0), \"group\", os.getpgid(0), \"policy\", "
         f"os.sched_getscheduler(0), \"nice\", os.nice(0))'")


def run(tmp_path: Path, *beside: str, lab: str = "true") -> subprocess.CompletedProcess:
    args = [PY, str(RUNNER), "--log", str(tmp_path / "out" / "unit.log")]
    args += [f"--beside={command}" for command in beside]
    return subprocess.run([*args, "--", *lab.split()], capture_output=True, text=True, timeout=60)


def test_the_beside_commands_run_in_makes_session_at_the_lowest_priority_and_their_log_comes_last(tmp_path):
    proc = run(tmp_path, WHERE, "echo second", lab="echo the-lab-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "the-lab-tests"
    assert lines[1].startswith("--- lint and unit tests")
    assert lines[2] in ("lint and unit tests: SCHED_IDLE, in make's session",
                        "lint and unit tests: nice 19, in make's session")
    _, _, session, _, group, _, policy, _, nice = lines[3].split()
    assert int(session) == os.getsid(0) and int(group) != os.getpgid(0)
    assert int(policy) == os.SCHED_IDLE or int(nice) == 19
    assert lines[4:] == [f"exit 0: {WHERE}", "second", "exit 0: echo second"]


def test_a_failure_on_either_side_fails_the_run_and_every_beside_command_runs(tmp_path):
    proc = run(tmp_path, "false", "echo after-the-failure")
    assert proc.returncode == 1
    assert "after-the-failure" in proc.stdout and "exit 1: false" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "make test: lab tests exit 0, lint and unit tests exit 1"

    proc = run(tmp_path, "true", lab="false")
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "make test: lab tests exit 1, lint and unit tests exit 0"


def test_the_runner_tunes_nothing_outside_its_own_processes():
    """No CPU group, no autogroup, no host service: the only setting is the --beside side's own nice value."""
    source = RUNNER.read_text()
    for outside in ("/sys/fs/cgroup", "/proc/self/autogroup", "systemctl", "cgroup.procs"):
        assert outside not in source


def test_it_needs_a_log_a_beside_command_and_a_foreground_command(tmp_path):
    for args in (["--beside=true", "--", "true"], ["--log", str(tmp_path / "l"), "--", "true"],
                 ["--log", str(tmp_path / "l"), "--beside=true"]):
        proc = subprocess.run([PY, str(RUNNER), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "give --log FILE" in proc.stderr


def test_each_log_starts_a_stream_and_the_streams_run_side_by_side(tmp_path):
    first, second = tmp_path / "out" / "first.log", tmp_path / "out" / "second.log"
    meet = tmp_path / "meet"
    # each stream waits for the other's mark: they can only both finish when they run at the same time
    wait_for = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); t = time.time() + 20\n" \
               "while not pathlib.Path(sys.argv[2]).exists() and time.time() < t: time.sleep(0.05)\n" \
               "print('met' if pathlib.Path(sys.argv[2]).exists() else 'alone')"
    args = [PY, str(RUNNER),
            "--log", str(first), f"--beside={PY} -c \"{wait_for}\" {meet}.1 {meet}.2", "--beside=echo first-done",
            "--log", str(second), f"--beside={PY} -c \"{wait_for}\" {meet}.2 {meet}.1", "--beside=false",
            "--", "echo", "the-lab-tests"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "met" in first.read_text().splitlines() and "first-done" in first.read_text()
    assert "met" in second.read_text().splitlines() and "exit 1: false" in second.read_text()
    out = proc.stdout
    assert out.index("the-lab-tests") < out.index(f"; {first})") < out.index("first-done") < out.index(f"; {second})")
    assert out.splitlines()[-1] == "make test: lab tests exit 0, lint and unit tests exit 1"
