"""A lab node's supervisor: joins the node's cgroups, runs systemd-nspawn, restarts it on reboot (exit 133).

Started fully detached by :func:`atlaslab.node.start`; SIGTERM is forwarded to nspawn, which powers the
node off cleanly, and the loop ends. Usage::

    python -m atlaslab.supervisor NODE_DIR CGROUP_DIR[,CGROUP_DIR...] -- systemd-nspawn ARGS...
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REBOOT_EXIT = 133
SUPERVISOR_PID = "supervisor.pid"
NSPAWN_PID = "nspawn.pid"
LAST_EXIT = "last_exit"


def say(text: str) -> None:
    print(f"[atlas-lab supervisor {time.strftime('%H:%M:%S')}] {text}", flush=True)


def join_cgroups(dirs: list[str]) -> None:
    for cgroup in dirs:
        Path(cgroup).mkdir(parents=True, exist_ok=True)
        (Path(cgroup) / "cgroup.procs").write_text(f"{os.getpid()}\n")


def main(argv: list[str]) -> int:
    node_dir, cgroups, sep, *command = argv
    if sep != "--" or not command:
        print(__doc__, file=sys.stderr)
        return 2
    node = Path(node_dir)
    join_cgroups([c for c in cgroups.split(",") if c])
    (node / SUPERVISOR_PID).write_text(f"{os.getpid()}\n")
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    env = dict(os.environ, SYSTEMD_NSPAWN_API_VFS_WRITABLE="network")
    code = 0
    try:
        while not stopping:
            child = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)
            (node / NSPAWN_PID).write_text(f"{child.pid}\n")
            say(f"started nspawn pid {child.pid}")
            code = child.wait()
            say(f"nspawn exited with {code}")
            if code != REBOOT_EXIT:
                break
            say("node rebooted; starting it again")
    finally:
        (node / LAST_EXIT).write_text(f"{code}\n")
        for name in (NSPAWN_PID, SUPERVISOR_PID):
            (node / name).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
