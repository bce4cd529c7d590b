"""`make test`'s runner: the lab tests in the foreground, the lint and unit tests beside them at low priority.

    python tests/make_test.py [--cgroup DIR] [--shares N] --log FILE --beside CMD [--beside CMD ...]
                              [--log FILE --beside CMD ...] -- LAB_CMD...

The lab tests are the longer job and mostly wait on their nodes, so the lint and unit tests (the ``--beside``
commands) run in the background while they do, and the CPU goes to the lab tests first. Each ``--log`` starts a
stream: the ``--beside`` commands after it run one after the other, their output in that file; the streams run
side by side (each ``pytest`` is one process: two streams use the second core while the lab tests wait), and
their logs are printed in order after the lab tests end. The run fails when the lab command or any ``--beside``
command fails (every ``--beside`` command runs whatever the earlier ones returned).

Why more than ``nice``: with the kernel's autogroup scheduling (on by default) CPU is shared between sessions
first, and nice orders processes only inside one session; every lab node and each of its services is a session
of its own. So the ``--beside`` commands run in a session of their own (``setsid``) whose autogroup is set to
nice 19 (proc(5), ``/proc/PID/autogroup``), and at nice 15 for kernels without autogroup. Ansible's workers call
``setsid()`` (ansible/executor/process/worker.py), so the unit tests' playbook runs would each get a fresh
autogroup at nice 0; a task outside the root CPU cgroup is not autogrouped (sched(7), "The autogroup feature"),
so where cgroup v1's CPU controller can be written (root; ``DIR/../cpu.shares`` writable) the ``--beside``
commands and everything they start run in the CPU group ``--cgroup``: with ``cpu.idle`` 1 where the kernel has it
(5.15+), so that the group runs only on CPU no other task wants and a lab task that wakes up (Ansible forks
thousands of short workers) preempts it at once instead of waiting out the scheduler's wake-up granularity; else
with ``cpu.shares`` ``--shares`` (the lab's sessions have 1024 each). Where it cannot, it says so and the autogroup
and nice still apply. The group is removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

NICE = 15
AUTOGROUP_NICE = 19


def join_cpu_group(group: Path, shares: int) -> str:
    """Move this process into the cgroup-v1 CPU group ``group`` with ``shares``; the line that says what it did."""
    if os.access(group.parent / "cpu.shares", os.W_OK):
        try:
            group.mkdir(exist_ok=True)
            # Linux 5.15+: the group is SCHED_IDLE, preempted at once by any other task that wakes up (an idle
            # group's cpu.shares cannot be set, and would not apply)
            idle = group / "cpu.idle"
            setting = ("cpu.idle", "1") if idle.exists() else ("cpu.shares", str(shares))
            (group / setting[0]).write_text(f"{setting[1]}\n")
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
            return f"lint and unit tests: CPU group {group}, {setting[0]} {setting[1]}"
        except OSError:
            pass
    return f"lint and unit tests: no CPU group ({group} cannot be written), autogroup nice {AUTOGROUP_NICE}"


def run_beside(commands: list[str], group: Path, shares: int) -> int:
    """The background side, already in a session of its own: CPU group, autogroup, nice, then each command."""
    print(join_cpu_group(group, shares), flush=True)
    try:
        Path("/proc/self/autogroup").write_text(f"{AUTOGROUP_NICE}\n")
    except OSError:
        pass  # no autogroup in this kernel, or not permitted: nice below still orders the processes
    os.nice(NICE)
    failed = 0
    for command in commands:
        rc = subprocess.run(shlex.split(command)).returncode
        print(f"exit {rc}: {command}", flush=True)
        failed += rc != 0
    return 1 if failed else 0


class _Stream(argparse.Action):
    """``--log FILE``: a new stream of --beside commands, its output in FILE."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.streams.append((Path(value), []))


class _Beside(argparse.Action):
    """``--beside CMD``: the command joins the last stream (none yet: a stream without a log, which only the
    --beside side's own run may have)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if not namespace.streams:
            namespace.streams.append((None, []))
        namespace.streams[-1][1].append(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", action=_Stream, metavar="FILE", dest="streams", default=[],
                        help="starts a stream of --beside commands; their output, printed at the end")
    parser.add_argument("--cgroup", type=Path, default=Path("/sys/fs/cgroup/cpu/atlas-make-test"))
    parser.add_argument("--shares", type=int, default=64, help="cpu.shares of the group (the lab's: 1024 each)")
    parser.add_argument("--beside", action=_Beside, dest="streams", metavar="CMD", help="run in the background")
    parser.add_argument("--beside-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("lab", nargs=argparse.REMAINDER, help="-- then the foreground command")
    args = parser.parse_args(argv)
    if args.beside_side:
        return run_beside([command for _log, commands in args.streams for command in commands], args.cgroup,
                          args.shares)
    lab = args.lab[1:] if args.lab[:1] == ["--"] else args.lab
    if not lab or not args.streams or not all(log and commands for log, commands in args.streams):
        parser.error("give --log FILE, at least one --beside command, then -- and the foreground command")

    sides = []
    for log_file, commands in args.streams:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        side = [sys.executable, os.path.abspath(__file__), "--beside-side", "--cgroup", str(args.cgroup),
                "--shares", str(args.shares), *(f"--beside={command}" for command in commands)]
        with log_file.open("w") as log:
            sides.append(subprocess.Popen(side, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
    try:
        lab_rc = subprocess.run(lab).returncode
        beside_rc = max(side.wait() for side in sides)
    except KeyboardInterrupt:
        for side in sides:
            os.killpg(side.pid, signal.SIGTERM)  # its own session: the terminal's interrupt does not reach it
        raise
    finally:
        try:
            args.cgroup.rmdir()
        except OSError:
            pass
    for log_file, _commands in args.streams:
        print(f"--- lint and unit tests (run beside the lab tests; {log_file})", flush=True)
        sys.stdout.write(log_file.read_text(errors="replace"))
    if lab_rc != 0 or beside_rc != 0:
        print(f"make test: lab tests exit {lab_rc}, lint and unit tests exit {beside_rc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
