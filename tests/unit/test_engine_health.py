"""The health probe in one call: each step against a real HTTP server, and the module entry."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from atlasctl.collection import module_utils

health = module_utils("health")
REPO = Path(__file__).resolve().parents[2]
ACTIVE = {"ActiveState": "active", "SubState": "running"}


class _Engine(http.server.BaseHTTPRequestHandler):
    """/health, /v1/models and /v1/completions with the engines' shapes; knobs set per test."""

    health = [200]  # answers of /health in turn; the last one repeats
    key = ""
    models = ["tiny"]
    completion = {"choices": [{"index": 0, "text": " fine"}], "usage": {"completion_tokens": 3}}
    seen: list

    def _auth(self) -> bool:
        if self.key and self.headers.get("Authorization") != f"Bearer {self.key}":
            self._send(401, {"error": "unauthorized"})
            return False
        return True

    def _send(self, status: int, doc) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.seen.append(("GET", self.path, None))
        if self.path == "/health":
            status = self.health.pop(0) if len(self.health) > 1 else self.health[0]
            self._send(status, {})
        elif self.path == "/v1/models" and self._auth():
            self._send(200, {"object": "list", "data": [{"id": m} for m in self.models]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, body))
        if self._auth():
            self._send(200, self.completion)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine():
    made = []

    def start(**knobs):
        handler = type("E", (_Engine,), {"seen": [], **knobs})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", handler

    yield start
    for server in made:
        server.shutdown()


def _probe(url, unit=ACTIVE, key="", model="tiny", **kw):
    record = {"port": 1, "served_model_name": model, "release_id": "r1"}
    return health.probe(record, url, None, "atlas-serving", lambda: dict(unit), key, kw.pop("timeout_s", 5),
                        kw.pop("poll_s", 0.01), "Hello", 4, **kw)


def test_a_healthy_engine_passes_every_step(engine) -> None:
    url, handler = engine(health=[503, 503, 200], key="s3cr3t")
    out = _probe(url, key="s3cr3t")
    assert (out["health"], out["models"], out["completion_tokens"], out["model"]) == (200, ["tiny"], 3, "tiny")
    assert [p for _, p, _ in handler.seen] == ["/health"] * 3 + ["/v1/models", "/v1/completions"]
    assert handler.seen[-1][2] == {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}


def test_a_refused_key_and_an_unlisted_model_are_named(engine) -> None:
    url, _ = engine(key="right")
    with pytest.raises(health.ProbeError, match=r"/v1/models answered HTTP 401 \(the API key was refused"):
        _probe(url, key="wrong")
    url, _ = engine(models=["other"])
    with pytest.raises(health.ProbeError, match=r"does not list the served model name 'tiny' \(it lists \['other'\]\)"):
        _probe(url)


@pytest.mark.parametrize("completion, why", [
    ({"choices": [], "usage": {"completion_tokens": 1}}, "one choice with text"),
    ({"choices": [{"text": None}], "usage": {"completion_tokens": 1}}, "one choice with text"),
    ({"choices": [{"text": "x"}], "usage": {"completion_tokens": 0}}, "completion_tokens 0"),
    ({"choices": [{"text": "x"}]}, "completion_tokens None"),
])
def test_a_completion_of_the_wrong_shape_fails(engine, completion, why) -> None:
    url, _ = engine(completion=completion)
    with pytest.raises(health.ProbeError, match=why):
        _probe(url)


def test_an_inactive_unit_fails_before_any_request(engine) -> None:
    url, handler = engine()
    says = r"atlas-serving is failed \(failed\)\. See `journalctl -u atlas-serving`"
    with pytest.raises(health.ProbeError, match=says):
        _probe(url, unit={"ActiveState": "failed", "SubState": "failed"})
    assert handler.seen == []


def test_the_wait_ends_at_once_when_the_unit_fails_and_at_the_deadline_otherwise(engine) -> None:
    url, _ = engine(health=[503])
    states = iter([{"ActiveState": "activating", "SubState": "auto-restart"}, {"ActiveState": "failed",
                                                                               "SubState": "failed"}])
    now = [0.0]

    def sleep(s):
        now[0] += s

    says = r"is failed \(failed\) while .*/health was awaited \(last answer: HTTP 503\)"
    with pytest.raises(health.ProbeError, match=says):
        health.wait_health(url, "atlas-serving", lambda: next(states), 600, 1, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 1, "one poll interval, not the timeout"
    now[0] = 0.0
    with pytest.raises(health.ProbeError, match=r"did not answer 200 within 5 s \(last answer: HTTP 503\)"):
        health.wait_health(url, "atlas-serving", lambda: dict(ACTIVE), 5, 2, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 5


def test_no_answer_is_named(engine) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, _, detail = health.request("GET", f"http://127.0.0.1:{port}/health", timeout=1)
    assert status is None and "refused" in detail.lower()


def test_the_record_is_read_or_named(tmp_path: Path) -> None:
    assert health.read_record(str(tmp_path / "none.json")) is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(health.ProbeError, match=r"bad.json cannot be read"):
        health.read_record(str(tmp_path / "bad.json"))
    (tmp_path / "short.json").write_text('{"port": 8000}')
    with pytest.raises(health.ProbeError, match=r"missing served_model_name, release_id"):
        health.read_record(str(tmp_path / "short.json"))


def _module(tmp_path: Path, *extra: str, **args) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c",
                           "local", "-e", f"ansible_python_interpreter={sys.executable}", *extra,
                           "-m", "atlas.serving.engine_health", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    status, result = proc.stdout.split(" => ", 1)
    return {**json.loads(result), "_status": status}


def test_module_on_a_bare_node_passes_in_check_mode_only_and_never_shows_the_key(tmp_path: Path) -> None:
    record = str(tmp_path / "atlas-serving.json")
    check = _module(tmp_path, "--check", record=record, api_key="s3cr3t-key")
    assert "SUCCESS" in check["_status"] and check["record"] is None, check
    run = _module(tmp_path, record=record, api_key="s3cr3t-key")
    assert "FAILED" in run["_status"], run
    assert "the serving stage has not run on this node" in run["msg"]
    assert "s3cr3t-key" not in json.dumps(check) + json.dumps(run)


def test_module_names_a_unit_it_cannot_read_as_not_active(tmp_path: Path, engine) -> None:
    url, handler = engine()
    record = tmp_path / "atlas-serving.json"
    record.write_text(json.dumps({"port": 1, "served_model_name": "tiny", "release_id": "r1"}))
    out = _module(tmp_path, record=str(record), url=url, service="no-such-unit-here")
    assert "FAILED" in out["_status"] and "no-such-unit-here is " in out["msg"], out
    assert "See `journalctl -u no-such-unit-here`" in out["msg"]
    assert out["record"]["release_id"] == "r1" and handler.seen == []
