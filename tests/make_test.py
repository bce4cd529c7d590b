"""`make test`'s runner: the lab tests in the foreground, the lint and unit tests beside them.

    python tests/make_test.py --log FILE --beside CMD [--beside CMD ...] [--log FILE --beside CMD ...] -- LAB_CMD...

The lab tests are the longer job and mostly wait on their nodes, so the lint and unit tests (the ``--beside``
commands) run in the background while they do. Each ``--log`` starts a stream: the ``--beside`` commands after it
run one after the other, their output in that file; the streams run side by side (each ``pytest`` is one process:
two streams use the second core while the lab tests wait), and their logs are printed in order after the lab tests
end. The run fails when the lab command or any ``--beside`` command fails (every ``--beside`` command runs whatever
the earlier ones returned).

The ``--beside`` side stays in make's session, so that the kernel's fair share between sessions (autogroup,
sched(7)) counts it with the lab tests' own runner and Ansible controllers rather than as a session of its own, and
asks to run only on CPU they do not want (its own scheduling policy, SCHED_IDLE, where the kernel has it; else nice
19). It is a process group of its own, which an interrupt stops with the lab tests. Nothing else is tuned: no CPU
group, no autogroup setting, no host service stopped; the run leaves the machine's scheduler and services as it
found them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

NICE = 19


def lowest_priority() -> str:
    """This process (and what it starts) at the lowest priority it can ask for itself; what it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        os.nice(NICE)
        return f"nice {NICE}"


def run_beside(commands: list[str]) -> int:
    """The background side, in a process group of its own: the lowest priority, then each command."""
    print(f"lint and unit tests: {lowest_priority()}, in make's session", flush=True)
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
    parser.add_argument("--beside", action=_Beside, dest="streams", metavar="CMD", help="run in the background")
    parser.add_argument("--beside-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("lab", nargs=argparse.REMAINDER, help="-- then the foreground command")
    args = parser.parse_args(argv)
    if args.beside_side:
        return run_beside([command for _log, commands in args.streams for command in commands])
    lab = args.lab[1:] if args.lab[:1] == ["--"] else args.lab
    if not lab or not args.streams or not all(log and commands for log, commands in args.streams):
        parser.error("give --log FILE, at least one --beside command, then -- and the foreground command")

    sides = []
    for log_file, commands in args.streams:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        side = [sys.executable, os.path.abspath(__file__), "--beside-side",
                *(f"--beside={command}" for command in commands)]
        with log_file.open("w") as log:
            sides.append(subprocess.Popen(side, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          process_group=0))
    try:
        lab_rc = subprocess.run(lab).returncode
        beside_rc = max(side.wait() for side in sides)
    except KeyboardInterrupt:
        for side in sides:
            os.killpg(side.pid, signal.SIGTERM)  # its own process group: the terminal's interrupt does not reach it
        raise
    for log_file, _commands in args.streams:
        print(f"--- lint and unit tests (run beside the lab tests; {log_file})", flush=True)
        sys.stdout.write(log_file.read_text(errors="replace"))
    if lab_rc != 0 or beside_rc != 0:
        print(f"make test: lab tests exit {lab_rc}, lint and unit tests exit {beside_rc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
