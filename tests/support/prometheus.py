"""A fake Prometheus HTTP API for the tests: answers /api/v1/query from a table."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# What the fake answers: the first key found in the query picks the vector.
ANSWERS = {
    "atlas:engine_ttft_seconds": [({"node": "n1"}, "0.25"), ({"node": "n2"}, "NaN")],
    "inter_token_latency_seconds_bucket": [({"node": "n1"}, "0.031")],
    "kv_cache_usage_perc": [({"node": "n1"}, "0.5"), ({"node": "n2"}, "0.97")],
    "num_requests_running": [({"node": "n1"}, "3"), ({"node": "n2"}, "0")],
    "time_to_first_token_seconds_bucket": [({"node": "n1"}, "0.25"), ({"node": "n2"}, "NaN")],
}


class FakePrometheus:
    """Prometheus's query API on 127.0.0.1; with ``tls`` (tls_fixtures.make's files) over HTTPS, with ``auth``
    ((user, password)) answering 401 to a request without those credentials, as its web configuration does."""

    def __init__(self, answers=None, fail: str | None = None, tls: dict[str, Path] | None = None,
                 auth: tuple[str, str] | None = None):
        self.queries: list[dict[str, str]] = []
        fake = self
        expected = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode() if auth else None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if expected and self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="Prometheus"')
                    self.end_headers()
                    self.wfile.write(b"Unauthorized\n")
                    return
                url = urllib.parse.urlparse(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                fake.queries.append(params)
                if url.path != "/api/v1/query" or (fail and fail in params.get("query", "")):
                    body, code = {"status": "error", "errorType": "bad_data", "error": "parse error"}, 400
                else:
                    found = next((v for k, v in (answers or ANSWERS).items() if k in params["query"]), [])
                    result = [{"metric": m, "value": [1700000000, v]} for m, v in found]
                    body, code = {"status": "success", "data": {"resultType": "vector", "result": result}}, 200
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls["cert"], tls["key"])
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
