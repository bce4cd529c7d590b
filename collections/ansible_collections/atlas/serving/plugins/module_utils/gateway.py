# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The backends of a branch gateway: which are enabled, which answer ``/health``.

roles/gateway writes one include file per serving node, ``<backend_dir>/<branch>/<node>.conf``
(templates/backend.conf.j2)::

    server 10.77.0.11:8000 max_fails=1 fail_timeout=10s;        enabled
    server 10.77.0.11:8000 max_fails=1 fail_timeout=10s down;   drained

Before a node is drained, the gateway must keep at least one other enabled backend that
answers ``/health`` (never an empty upstream). :func:`wait_for_another` waits for one (a node that is
already drained takes no traffic: :func:`takes_traffic` says so, and there is nothing to wait
for), and :func:`refusal` says why a drain is refused, naming the branch, the nodes and the fix.
"""

from __future__ import annotations

import os
import re
import time

from ansible_collections.atlas.serving.plugins.module_utils.health import request

SERVER_RE = re.compile(r"^\s*server\s+(?P<address>\S+):(?P<port>\d+)(?P<params>[^;]*);", re.M)


class Backend:
    """One serving node as its branch gateway sees it."""

    def __init__(self, node, address, port, enabled, healthy=None, detail=""):
        self.node = node
        self.address = address
        self.port = port
        self.enabled = enabled
        self.healthy = healthy
        self.detail = detail

    def as_dict(self):
        return {"node": self.node, "address": self.address, "port": self.port, "enabled": self.enabled,
                "healthy": self.healthy, "detail": self.detail}

    def state(self):
        if not self.enabled:
            return "drained"
        if self.healthy:
            return "healthy"
        return f"unhealthy ({self.detail})" if self.detail else "unhealthy"


def parse_backend(node, text):
    """The backend of ``node`` from its include file's text; None when it has no server line."""
    match = SERVER_RE.search(text)
    if not match:
        return None
    return Backend(node, match.group("address"), int(match.group("port")),
                   enabled="down" not in match.group("params").split())


def read_backends(branch_dir):
    """Every backend file of one branch directory, sorted by node name (none while the
    gateway role has not written the directory yet)."""
    backends = []
    try:
        names = sorted(os.listdir(branch_dir))
    except FileNotFoundError:
        return backends
    for name in names:
        path = os.path.join(branch_dir, name)
        if not name.endswith(".conf") or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as handle:
            backend = parse_backend(name[: -len(".conf")], handle.read())
        if backend is not None:
            backends.append(backend)
    return backends


def http_health(backend, timeout):
    """(healthy, detail) of ``GET http://<backend>/health``: healthy only on 200."""
    status, _body, detail = request("GET", f"http://{backend.address}:{backend.port}/health", timeout=timeout)
    return status == 200, detail


def takes_traffic(backends, node):
    """Whether ``node`` is an enabled backend of the branch (a drained or absent node takes none)."""
    return any(b.node == node and b.enabled for b in backends)


def others_serving(backends, node):
    return [b for b in backends if b.node != node and b.enabled and b.healthy]


def wait_for_another(branch_dir, node, wait_s, poll_s=1.0, probe_timeout=2.0, probe=http_health,
                     clock=time.monotonic, sleep=time.sleep):
    """Poll until a backend other than ``node`` is enabled and healthy, at most ``wait_s``.

    Returns ``(serving, backends, waited_s)``: the other serving backends (empty when the
    wait ran out) and the last view of every backend of the branch."""
    start = clock()
    while True:
        backends = read_backends(branch_dir)
        for backend in backends:
            if backend.node != node and backend.enabled:
                backend.healthy, backend.detail = probe(backend, probe_timeout)
        serving = others_serving(backends, node)
        waited = clock() - start
        if serving or waited >= wait_s:
            return serving, backends, waited
        sleep(min(poll_s, max(wait_s - waited, 0)))


def refusal(branch, gateway, node, backends, waited_s):
    """The message of a refused drain: branch, gateway, every other node's state, the fix."""
    others = [b for b in backends if b.node != node]
    states = ", ".join(f"{b.node} {b.state()}" for b in others) or "no other node"
    return (f"Not draining {node}: it is the last healthy backend of branch {branch} at {gateway} "
            f"(the others: {states}; waited {waited_s:.0f} s). "
            "Draining it would leave the branch with no backend and fail every client request. "
            f"Bring another node of branch {branch} back to health (systemctl status atlas-serving on it, "
            "`atlasctl doctor -i <inventory>`), then run the rollout again with --resume.")
