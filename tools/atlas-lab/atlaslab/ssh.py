"""SSH to lab nodes with the lab's key and pinned known_hosts (host key checking stays on).

The lab's own connections leave from the lab host's harness address (LabConfig.harness_ip), which reaches every
node, also those the controller address reaches only through their jump host (lab.yml ``via``)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from atlaslab import paths
from atlaslab.config import NodeSpec


def ssh_options(connect_timeout: int = 5, bind: str = "") -> list[str]:
    return [*(["-o", f"BindAddress={bind}"] if bind else []),
        "-F", "none",
        "-i", str(paths.private_key()),
        "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={paths.known_hosts()}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={connect_timeout}",
        "-o", "LogLevel=ERROR",
    ]


def ssh_argv(node: NodeSpec, command: Sequence[str] = (), *, tty: bool = False, connect_timeout: int = 5) -> list[str]:
    argv = ["ssh", *ssh_options(connect_timeout, node.harness)]
    if tty:
        argv.append("-t")
    argv.append(f"root@{node.ip}")
    if command:
        argv += ["--", *command]
    return argv


def run_on(node: NodeSpec, command: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on ``node`` over SSH (strict host key) and capture its output."""
    return subprocess.run(
        ssh_argv(node, command), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        check=False,
    )


def reachable(node: NodeSpec, connect_timeout: int = 2) -> bool:
    try:
        proc = subprocess.run(
            ssh_argv(node, ["true"], connect_timeout=connect_timeout),
            capture_output=True, timeout=connect_timeout + 5, stdin=subprocess.DEVNULL, check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0
