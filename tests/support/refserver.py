"""Reference OpenAI-compatible streaming server with injected, known timing.

The benchmark's accuracy is measured against this server: every streamed completion sends its
first token ``ttft_ms`` after the request body has been read, then one token every ``itl_ms``,
each at an absolute deadline (``t0 + ttft + i * itl``) so sleep overshoot never accumulates.
One thread per connection and ``time.sleep`` (clock_nanosleep, ~0.1 ms precision on Linux)
keep the injected delays precise at concurrency 10 without busy-waiting.

Token counting is exact and documented: one token per streamed chunk; ``completion_tokens`` =
``max_tokens`` (or ``eos_after`` when set and ``ignore_eos`` is not); ``prompt_tokens`` = number
of whitespace-separated words of the prompt (chat: of all message contents).

Endpoints as vLLM serves them: ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (streaming with ``stream_options.include_usage`` or not).

Run alone: ``python tests/support/refserver.py --port 8199 --ttft-ms 40 --itl-ms 8``.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux asm-generic value; Python does not export it


class _Handler(socketserver.BaseRequestHandler):
    server: _TCPServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            pass  # no kernel receive stamps: t0 is when this thread read the request
        buf = b""
        while True:
            rx = None
            while b"\r\n\r\n" not in buf:
                data, stamp = _recv_stamped(sock)
                if not data:
                    return
                rx = rx if (buf or rx is not None) else stamp
                buf += data
            head, _, buf = buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _version = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
            length = int(headers.get("content-length", "0"))
            while len(buf) < length:
                data, _stamp = _recv_stamped(sock)
                if not data:
                    return
                buf += data
            body, buf = buf[:length], buf[length:]
            # t0: when the kernel received the request's first bytes, so the wake-up of this thread on a busy
            # machine is inside the injected TTFT rather than added to it.
            t0 = time.perf_counter() if rx is None else min(time.perf_counter(), rx)
            keep = headers.get("connection", "").lower() != "close"
            if not self._route(sock, method, path.split("?")[0], body, t0):
                return
            if not keep:
                return

    # --- routing -------------------------------------------------------------------------------------

    def _route(self, sock: socket.socket, method: str, path: str, body: bytes, t0: float) -> bool:
        cfg = self.server.cfg
        if method == "GET" and path == "/health":
            return _send(sock, 200, b"")
        if method == "GET" and path == "/v1/models":
            doc = {"object": "list", "data": [{"id": cfg["model"], "object": "model", "owned_by": "refserver"}]}
            return _send(sock, 200, json.dumps(doc).encode())
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                return _send(sock, 400, b'{"error": {"message": "body is not JSON"}}')
            with self.server.lock:
                self.server.requests += 1
            return self._generate(sock, req, chat=path.endswith("chat/completions"), t0=t0)
        return _send(sock, 404, b'{"error": {"message": "not found"}}')

    def _generate(self, sock: socket.socket, req: dict, *, chat: bool, t0: float) -> bool:
        cfg = self.server.cfg
        n_out = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        if cfg["eos_after"] and not req.get("ignore_eos"):
            n_out = min(n_out, cfg["eos_after"])
        if chat:
            n_in = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", []))
        else:
            n_in = len(str(req.get("prompt", "")).split())
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        ttft, itl = cfg["ttft_ms"] / 1000.0, cfg["itl_ms"] / 1000.0
        kind = "chat.completion" if chat else "text_completion"
        if not req.get("stream"):
            _sleep_until(t0 + ttft + (n_out - 1) * itl)
            text = "".join(f"t{i} " for i in range(n_out))
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if chat else {"index": 0, "text": text, "finish_reason": "length"})
            doc = {"id": "ref", "object": kind, "model": cfg["model"], "choices": [choice], "usage": usage}
            return _send(sock, 200, json.dumps(doc).encode())
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                "Cache-Control: no-cache\r\n\r\n")
        try:
            sock.sendall(head.encode())
            for i in range(n_out):
                finish = "length" if i == n_out - 1 else None
                if chat:
                    delta = {"content": f"t{i} "}
                    if i == 0:
                        delta["role"] = "assistant"
                    choice = {"index": 0, "delta": delta, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": f"t{i} ", "finish_reason": finish}
                event = {"id": "ref", "object": kind + ".chunk", "model": cfg["model"], "choices": [choice]}
                data = b"data: " + json.dumps(event).encode() + b"\n\n"
                frame = b"%x\r\n%s\r\n" % (len(data), data)  # built before the wait: sent on the deadline
                _sleep_until(t0 + ttft + i * itl)
                sock.sendall(frame)
            if (req.get("stream_options") or {}).get("include_usage"):
                event = {"id": "ref", "object": kind + ".chunk", "model": cfg["model"], "choices": [], "usage": usage}
                _chunk(sock, b"data: " + json.dumps(event).encode() + b"\n\n")
            _chunk(sock, b"data: [DONE]\n\n")
            sock.sendall(b"0\r\n\r\n")
        except OSError:
            return False
        return True


def _recv_stamped(sock: socket.socket) -> tuple[bytes, float | None]:
    """recv with the kernel's SO_TIMESTAMPNS receive time, converted to the perf_counter clock."""
    data, ancdata, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(16))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
            sec, nsec = struct.unpack("qq", payload[:16])
            return data, time.perf_counter() - (time.time() - (sec + nsec / 1e9))
    return data, None


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def _chunk(sock: socket.socket, data: bytes) -> None:
    sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))


def _send(sock: socket.socket, status: int, body: bytes) -> bool:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    try:
        sock.sendall(head.encode() + body)
    except OSError:
        return False
    return True


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], cfg: dict):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.requests = 0
        super().__init__(addr, _Handler)


class RefServer:
    """``with RefServer(ttft_ms=40, itl_ms=8) as srv: srv.url`` -> http://127.0.0.1:<port>."""

    def __init__(self, *, ttft_ms: float = 0.0, itl_ms: float = 0.0, host: str = "127.0.0.1", port: int = 0,
                 model: str = "refmodel", eos_after: int = 0):
        cfg = {"ttft_ms": ttft_ms, "itl_ms": itl_ms, "model": model, "eos_after": eos_after}
        self._server = _TCPServer((host, port), cfg)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> int:
        return self._server.requests

    def start(self) -> RefServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RefServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RefServerProcess:
    """The same server in its own process (no GIL shared with the client being measured):
    ``with RefServerProcess(ttft_ms=40, itl_ms=8) as srv: srv.url``."""

    def __init__(self, *, ttft_ms: float = 0.0, itl_ms: float = 0.0, model: str = "refmodel", eos_after: int = 0):
        self.argv = [sys.executable, __file__, "--port", "0", "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                     "--model", model, "--eos-after", str(eos_after)]
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> RefServerProcess:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("refserver listening on "):
            self.proc.kill()
            raise RuntimeError(f"refserver did not start: {line!r}")
        self.url = line.split()[-1]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8199)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--itl-ms", type=float, default=0.0)
    parser.add_argument("--model", default="refmodel")
    parser.add_argument("--eos-after", type=int, default=0)
    args = parser.parse_args(argv)
    srv = RefServer(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, host=args.host, port=args.port,
                    model=args.model, eos_after=args.eos_after)
    print(f"refserver listening on {srv.url}", flush=True)
    try:
        srv._server.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
