"""An SSH tunnel to a service only its own node may reach (an engine behind the node's firewall): OpenSSH's
local forwarding with the node's inventory SSH settings (``atlasctl.inventory.Target``: its key, its
known_hosts with strict host key checking, a ProxyJump of ``ansible_ssh_common_args``), so it goes wherever
Ansible goes.

``with tunnel(target, "10.0.0.11", 8000) as base: ...`` gives ``http://127.0.0.1:<local port>``; the tunnel's
traffic leaves the node from the node itself, which its firewall admits (loopback and its own address).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

from atlasctl.errors import EnvironmentProblem
from atlasctl.inventory import Target

READY_TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def argv(target: Target, host: str, port: int, local_port: int) -> list[str]:
    """The ssh command that forwards 127.0.0.1:``local_port`` to ``host``:``port`` as seen from ``target``."""
    remote_host = f"[{host}]" if ":" in host else host
    return [*target.ssh_argv(), "-N", "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=15",
            "-L", f"127.0.0.1:{local_port}:{remote_host}:{port}", target.remote]


@contextlib.contextmanager
def tunnel(target: Target, host: str, port: int, timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` forwarded to ``host``:``port`` through ``target`` while the block runs."""
    local = _free_port()
    proc = subprocess.Popen(argv(target, host, port, local), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not _accepts(local):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                _, err = proc.communicate(timeout=5)
                raise EnvironmentProblem(
                    f"{target.name}: no SSH tunnel to {host}:{port} ({(err or '').strip()[-400:] or 'no answer'})",
                    fix=f"check that the controller reaches {target.name} over SSH with the inventory's settings "
                        f"(ansible {target.name} -m ping) and that {host}:{port} listens there")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{local}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
