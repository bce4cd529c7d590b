"""Doctor's hosts (their SSH settings: atlasctl.inventory, shared with bundle push, the rollout's SLO bench and
Ansible's own ssh connection) and the one SSH round trip per host: the OpenSSH client with the inventory's
settings (``Target.ssh_argv``: its key, its port, ``ansible_ssh_common_args`` with a ProxyJump or ProxyCommand
to a jump host), so doctor reaches every node Ansible reaches, the same way.

Host key checking stays on: ``StrictHostKeyChecking=yes`` comes first on the command line (ssh takes the first
value of an option) with the known_hosts files the inventory names (``-o UserKnownHostsFile=...``), else the
user's: an unknown or changed host key refuses the host.
"""

from __future__ import annotations

import shlex
import subprocess

from atlasctl import inventory as shared
from atlasctl.errors import EnvironmentProblem

SERVING_GROUP = shared.SERVING_GROUP
# One source of SSH settings for doctor, bundle push and the SLO bench (atlasctl.inventory).
Target = shared.Target
target = shared.target
targets_from_listing = shared.targets_from_listing
load = shared.targets


def ssh_run(t: Target, command: str, timeout: float = 90.0) -> str:
    """Run ``command`` (bash) on ``t`` over OpenSSH with strict host keys; its stdout (the script merges its
    stderr). The host unreachable, or its key refused: EnvironmentProblem with ssh's own words."""
    argv = [*t.ssh_argv(), "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=15", t.remote,
            "bash -c " + shlex.quote(command)]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{t.name}: no answer over SSH within {timeout:.0f} s",
                                 fix=f"check the node answers (ansible {t.name} -m ping)") from None
    if proc.returncode == 255:  # ssh's own failure: unreachable, refused, host key
        raise EnvironmentProblem(f"{t.name}: SSH failed: {proc.stderr.strip()[-400:] or 'no reason given'}",
                                 fix="check the inventory's SSH settings for the host (ansible_host, ansible_user, "
                                     "its key, ansible_ssh_common_args) and its pinned host key")
    return proc.stdout
