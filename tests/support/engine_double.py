"""A stand-in serving engine over real HTTP for unit tests: /health, /v1/models, /v1/completions and
/metrics with the engines' shapes (vLLM's metric names), each answer a knob. Used by the health probe's
tests and doctor's hang check, which both run against it."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading

METRICS = ("vllm:num_requests_running{{engine=\"0\",model_name=\"tiny\"}} {running}\n"
           "vllm:num_requests_waiting{{engine=\"0\",model_name=\"tiny\"}} 0.0\n"
           "vllm:generation_tokens_total{{engine=\"0\",model_name=\"tiny\"}} {tokens}\n"
           "vllm:inter_token_latency_seconds_count{{engine=\"0\",model_name=\"tiny\"}} {tokens}\n")


def metrics(running=1, tokens=40):
    return METRICS.format(running=float(running), tokens=float(tokens))


class _Engine(http.server.BaseHTTPRequestHandler):
    """/health, /v1/models, /v1/completions and /metrics with the engines' shapes; knobs set per test."""

    health = [200]  # answers of /health in turn; the last one repeats
    key = ""
    models = ["tiny"]
    completion = {"choices": [{"index": 0, "text": " fine"}], "usage": {"completion_tokens": 3}}
    hold_s = 0.0  # the completion answers after this long (or when the test ends: ``release``)
    metrics = [metrics()]  # answers of /metrics in turn, the last one repeats; None: 404 (no --enable-metrics)
    release: threading.Event
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
        elif self.path == "/metrics":
            text = self.metrics.pop(0) if len(self.metrics) > 1 else self.metrics[0]
            body = b"not found" if text is None else text.encode()
            self.send_response(404 if text is None else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, body))
        if self._auth():
            self.release.wait(self.hold_s)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                self._send(200, self.completion)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def engines():
    """``start(**knobs) -> (base url, handler class)``; every server started is stopped on exit, and a held
    completion let go."""
    made = []

    def start(**knobs):
        handler = type("E", (_Engine,), {"seen": [], "release": threading.Event(), **knobs})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append((server, handler))
        return f"http://127.0.0.1:{server.server_address[1]}", handler

    try:
        yield start
    finally:
        for server, handler in made:
            handler.release.set()
            server.shutdown()
