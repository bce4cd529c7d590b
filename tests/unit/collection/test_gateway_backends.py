"""Never an empty upstream: the gateway's view of a branch's backends, and the refused drain."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import gateway

UP = "# Ansible managed: {node} (up)\nserver {addr}:{port} max_fails=1 fail_timeout=10s;\n"
DOWN = "# Ansible managed: {node} (down)\nserver {addr}:{port} max_fails=1 fail_timeout=10s down;\n"


def branch(tmp_path: Path, **nodes: str) -> Path:
    d = tmp_path / "east"
    d.mkdir(exist_ok=True)
    for i, (node, state) in enumerate(nodes.items()):
        text = (UP if state == "up" else DOWN).format(node=node.replace("_", "-"), addr=f"10.0.0.{i + 1}", port=8000)
        (d / f"{node.replace('_', '-')}.conf").write_text(text)
    return d


def test_parse_backend_reads_address_port_and_drain() -> None:
    up = gateway.parse_backend("atlas-n1", UP.format(node="atlas-n1", addr="10.77.0.11", port=8000))
    down = gateway.parse_backend("atlas-n1", DOWN.format(node="atlas-n1", addr="10.77.0.11", port=30000))
    assert (up.address, up.port, up.enabled) == ("10.77.0.11", 8000, True)
    assert (down.port, down.enabled) == (30000, False)
    # the comment line says "(down)" on an enabled backend's neighbour: only the server line counts
    assert gateway.parse_backend("x", "# (down)\nserver 1.2.3.4:80 max_fails=1;\n").enabled is True
    assert gateway.parse_backend("x", "# nothing here\n") is None


def test_another_healthy_backend_allows_the_drain(tmp_path: Path) -> None:
    d = branch(tmp_path, atlas_n1="up", atlas_n2="up")
    asked = []

    def probe(b, timeout):
        asked.append(b.node)
        return True, "HTTP 200"

    serving, backends, _ = gateway.wait_for_another(str(d), "atlas-n1", 10, probe=probe)
    assert [b.node for b in serving] == ["atlas-n2"]
    assert asked == ["atlas-n2"], "the node being drained is not asked"


@pytest.mark.parametrize("other, healthy, state_word", [
    ("down", True, "atlas-n2 drained"),
    ("up", False, "atlas-n2 unhealthy (timed out)"),
])
def test_last_healthy_backend_is_refused_after_the_wait(tmp_path: Path, other, healthy, state_word) -> None:
    d = branch(tmp_path, atlas_n1="up", atlas_n2=other)
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    serving, backends, waited = gateway.wait_for_another(
        str(d), "atlas-n1", 5, poll_s=1, probe=lambda b, t: (healthy, "timed out"), clock=lambda: now[0], sleep=sleep)
    assert serving == []
    assert waited == pytest.approx(5)
    assert sum(slept) == pytest.approx(5)
    msg = gateway.refusal("east", "atlas-gw-east", "atlas-n1", backends, waited)
    assert "Not draining atlas-n1: it is the last healthy backend of branch east at atlas-gw-east" in msg
    assert state_word in msg
    assert "--resume" in msg


def test_the_wait_ends_when_another_backend_comes_back(tmp_path: Path) -> None:
    d = branch(tmp_path, atlas_n1="up", atlas_n2="up")
    now = [0.0]
    answers = iter([False, False, True])

    def sleep(s):
        now[0] += s

    serving, _, waited = gateway.wait_for_another(
        str(d), "atlas-n1", 60, poll_s=1, probe=lambda b, t: (next(answers), ""), clock=lambda: now[0], sleep=sleep)
    assert [b.node for b in serving] == ["atlas-n2"]
    assert waited == pytest.approx(2)


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, expected", [(200, (True, "HTTP 200")), (503, (False, "HTTP 503"))])
def test_http_health_asks_the_real_endpoint(status, expected) -> None:
    handler = type("H", (_Health,), {"status": status})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = gateway.Backend("n", "127.0.0.1", server.server_address[1], True)
        assert gateway.http_health(backend, 2) == expected
    finally:
        server.shutdown()


def test_http_health_of_a_closed_port_is_unhealthy() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    healthy, detail = gateway.http_health(gateway.Backend("n", "127.0.0.1", port, True), 1)
    assert healthy is False and detail


@pytest.mark.parametrize("state", ["down", "absent", "no directory"])
def test_a_node_that_takes_no_traffic_needs_no_other_backend(tmp_path: Path, state) -> None:
    d = branch(tmp_path, atlas_n1="down" if state == "down" else "up", atlas_n2="down")
    if state == "absent":
        (d / "atlas-n1.conf").unlink()
    if state == "no directory":
        d = tmp_path / "west"
    assert gateway.takes_traffic(gateway.read_backends(str(d)), "atlas-n1") is False
    assert gateway.takes_traffic(gateway.read_backends(str(branch(tmp_path, atlas_n1="up"))), "atlas-n1") is True


def _module(tmp_path: Path, branch_dir: Path, node: str) -> dict:
    """The module itself, run by ansible on localhost: its JSON result."""
    import json
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    args = json.dumps({"branch": "east", "branch_dir": str(branch_dir), "node": node, "wait_s": 0,
                       "probe_timeout_s": 0.2})
    ansible = str(Path(sys.executable).with_name("ansible"))
    proc = subprocess.run([ansible, "localhost", "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}",
                           "-m", "atlas.serving.gateway_backends", "-a", args],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    status, result = proc.stdout.split(" => ", 1)
    return {**json.loads(result), "_status": status}


def test_module_passes_a_drained_node_and_refuses_the_last_one(tmp_path: Path) -> None:
    d = branch(tmp_path, atlas_n1="down", atlas_n2="up")  # 10.0.0.2 answers nothing: unhealthy
    drained = _module(tmp_path, d, "atlas-n1")
    assert "SUCCESS" in drained["_status"] and drained["drained"] is True, drained
    last = _module(tmp_path, d, "atlas-n2")
    assert "FAILED" in last["_status"] and last["drained"] is False, last
    assert "Not draining atlas-n2: it is the last healthy backend of branch east" in last["msg"]
    assert "atlas-n1 drained" in last["msg"]
