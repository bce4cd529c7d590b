"""A minimal HTTP/1.1 client over asyncio streams, made for timing token streams.

Why not a library: every byte of a streamed response is timestamped with
``time.perf_counter_ns()`` the moment the event loop hands it over, with no buffering layer
between the socket and the clock. Keep-alive connections are pooled per endpoint; responses with
``Content-Length``, ``Transfer-Encoding: chunked`` or close-delimited bodies are read.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass

from atlasctl.errors import UsageError


class HTTPError(Exception):
    """A non-2xx answer or a broken exchange; the message names the URL."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    base_path: str  # without a trailing slash, e.g. "" or "/proxy"

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"endpoint URL {url!r} is not http(s)://host[:port][/path]",
                             fix="pass the server's base URL, e.g. http://10.77.0.11:8000")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        base = parts.path.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        return cls(parts.scheme, parts.hostname, port, base)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def url(self, path: str) -> str:
        return f"{self.scheme}://{self.authority}{self.base_path}{path}"


class Pool:
    """Idle keep-alive connections to one target; opened on demand, never more than in use."""

    def __init__(self, target: Target, *, connect_timeout_s: float = 10.0, ca_file: str | None = None):
        self.target = target
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            self._ssl = ssl.create_default_context(cafile=ca_file) if target.scheme == "https" else None
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"--ca-file {ca_file}: not a CA certificate file ({exc})",
                             fix="name the site CA's PEM file (atlas_tls_ca_file)") from None

    async def acquire(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        coro = asyncio.open_connection(self.target.host, self.target.port, ssl=self._ssl, limit=1 << 22)
        try:
            reader, writer = await asyncio.wait_for(coro, self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise HTTPError(f"cannot connect to {self.target.url('')}: {exc or type(exc).__name__}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    def release(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], reusable: bool) -> None:
        if reusable:
            self._idle.append(conn)
        else:
            conn[1].close()

    def close(self) -> None:
        for _reader, writer in self._idle:
            writer.close()
        self._idle.clear()


def _request_bytes(target: Target, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {target.base_path}{path} HTTP/1.1", f"Host: {target.authority}",
             "User-Agent: atlasctl-bench", "Accept: */*"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


async def _read_head(reader: asyncio.StreamReader, url: str) -> tuple[int, dict[str, str]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
        raise HTTPError(f"{url}: connection closed before a response header ({type(exc).__name__})") from exc
    lines = raw.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise HTTPError(f"{url}: not an HTTP/1.1 status line: {lines[0]!r}") from exc
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
    return status, headers


async def _body_pieces(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """Yield the response body as it arrives (chunked, sized or until EOF)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # trailer end (no trailers expected)
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await reader.read(min(left, 1 << 16))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(data)
            yield data
    else:
        while data := await reader.read(1 << 16):
            yield data


class Exchange:
    """One request on a pooled connection; iterate ``pieces()`` for (perf_counter_ns, bytes)."""

    def __init__(self, pool: Pool, method: str, path: str, body: dict | None, headers: dict[str, str]):
        self.pool, self.method, self.path = pool, method, path
        self.body = None if body is None else json.dumps(body).encode()
        self.headers = headers
        self.status = 0
        self.response_headers: dict[str, str] = {}
        self.sent_ns = 0
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._complete = False

    async def start(self) -> int:
        """Send the request (``sent_ns`` is taken just before the write) and read the status."""
        self._conn = await self.pool.acquire()
        reader, writer = self._conn
        url = self.pool.target.url(self.path)
        self.sent_ns = time.perf_counter_ns()
        try:
            writer.write(_request_bytes(self.pool.target, self.method, self.path, self.body, self.headers))
            await writer.drain()
        except ConnectionError as exc:
            raise HTTPError(f"{url}: send failed: {exc}") from exc
        self.status, self.response_headers = await _read_head(reader, url)
        return self.status

    async def pieces(self) -> AsyncIterator[tuple[int, bytes]]:
        assert self._conn is not None, "start() first"
        try:
            async for data in _body_pieces(self._conn[0], self.response_headers):
                yield time.perf_counter_ns(), data
        except (asyncio.IncompleteReadError, ConnectionError, ValueError) as exc:
            raise HTTPError(f"{self.pool.target.url(self.path)}: response body cut short ({exc})") from exc
        self._complete = True

    async def read_all(self) -> bytes:
        return b"".join([data async for _t, data in self.pieces()])

    def close(self) -> None:
        if self._conn is None:
            return
        keep = self._complete and self.response_headers.get("connection", "").lower() != "close"
        self.pool.release(self._conn, keep)
        self._conn = None


async def get_json(pool: Pool, path: str, headers: dict[str, str], timeout_s: float = 10.0) -> dict:
    exchange = Exchange(pool, "GET", path, None, headers)
    try:
        async with asyncio.timeout(timeout_s):
            status = await exchange.start()
            raw = await exchange.read_all()
    except TimeoutError as exc:
        raise HTTPError(f"{pool.target.url(path)}: no answer within {timeout_s:g} s") from exc
    finally:
        exchange.close()
    if status != 200:
        raise HTTPError(f"{pool.target.url(path)}: HTTP {status}: {raw[:200]!r}")
    return json.loads(raw)


class SSEParser:
    """Split a byte stream into Server-Sent Events ``data`` payloads (comments and other fields dropped)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf += data.replace(b"\r\n", b"\n")
        out = []
        while b"\n\n" in self._buf:
            event, self._buf = self._buf.split(b"\n\n", 1)
            payload = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if payload:
                out.append(b"\n".join(payload).decode("utf-8", "replace"))
        return out
