"""Multi-node: ``--nnodes N --node-rank R --dist-init-addr HOST:PORT`` over one TCP connection per rank.

What the real SGLang 0.5.6 does, and what the stand-in does for it (sources: the sglang 0.5.6 sdist,
``srt/entrypoints/engine.py``, ``srt/entrypoints/http_server.py``, ``srt/managers/scheduler.py``,
``srt/utils/common.py``; docs/multinode-serving.md section "Lab"):

- Rank 0 starts its schedulers, which rendezvous with every rank at ``--dist-init-addr`` (torch.distributed)
  and load the model; only once they report ready does ``launch_server`` start the HTTP server. So the
  entry's HTTP port is closed (connection refused) until every rank has joined, then ``/health`` is 503
  while the server warms up, then 200. The stand-in: rank 0 listens on the dist-init address it is given
  (bound to that address only) and opens its HTTP port once ranks 1..N-1 have joined.
- Ranks >= 1 run no tokenizer: their schedulers join, and once ready the main process serves a dummy
  ``/health``, ``/health_generate``, ``/ping`` that always answer 200 (``launch_dummy_health_check_server``).
  The stand-in: the main process starts one "scheduler" child (``python -m sglang._atlas_standin.dist``)
  that connects to the head (retrying until it is up), joins, and answers every step; the child dies with
  its parent (``PR_SET_PDEATHSIG``, as SGLang's ``kill_itself_when_parent_died``). SIGSTOP the child and the
  dummy health still says 200.
- Every forward step of rank 0 is a collective with all ranks. The stand-in: one step loop on rank 0 runs
  batches: a step lasts the prefill or decode time its requests ask (``ATLAS_STANDIN_TTFT_MS``, ``_ITL_MS``),
  then sends ``step K`` to every rank and waits for each ``ok K``; every running request advances one token
  per step.
  A stopped rank (SIGSTOP) or a dead one stalls the step: tokens stop, requests stay running. A dead
  rank's closed connection is not an error (a collective with a dead NCCL/HCCL peer hangs): the step never
  completes. SIGCONT before the watchdog and the step completes: it recovers.
- ``/health`` on rank 0 is a 1-token generate: 200 as soon as any output arrives after the probe began
  (checked every second), 503 after ``SGLANG_HEALTH_CHECK_TIMEOUT`` seconds (default 20) without any, with
  SGLang's "Health check failed..." log line.
- The scheduler's watchdog: while a batch is running and the forward count has not moved for
  ``--watchdog-timeout`` seconds (checked every ``watchdog_timeout // 2`` s), it logs
  ``Watchdog timeout (self.watchdog_timeout=T)``, waits 5 s, and SIGQUITs the main process, which logs
  "Received sigquit from a child process. It usually means the child failed." and kills its process tree,
  itself included (exit by SIGKILL: status -9, 137 in a shell).
- A rank >= 1 whose head is gone keeps its dummy health at 200 (the instance hangs; restart every rank).

Wire protocol (stand-in only, one line each): rank -> head ``join R N``; head -> rank ``welcome`` or
``refused REASON``; head -> rank ``step K``; rank -> head ``ok K``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from sglang._atlas_standin import npu

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
sched_logger = logging.getLogger("sglang.srt.managers.scheduler")
engine_logger = logging.getLogger("sglang.srt.entrypoints.engine")

DEFAULT_HEALTH_CHECK_TIMEOUT = 20  # SGLANG_HEALTH_CHECK_TIMEOUT (srt/entrypoints/http_server.py)
JOIN_READ_TIMEOUT_S = 10.0
CONNECT_RETRY_S = 0.2
WATCHDOG_GRACE_S = 5  # "Wait for some time so that the parent process can print the error."


class DistError(Exception):
    """A multi-node setting the stand-in cannot run with (the message names the flag and the fix)."""


def parse_addr(value: str | None, nnodes: int) -> tuple[str, int]:
    if not value:
        raise DistError(f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT (the head's address, the same on "
                        "every rank)")
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DistError(f"--dist-init-addr {value!r} is not HOST:PORT; give e.g. 192.168.0.2:5000")
    return host, int(port)


def check_layout(nnodes: int, node_rank: int) -> None:
    if nnodes < 1:
        raise DistError(f"--nnodes {nnodes} must be at least 1")
    if not 0 <= node_rank < nnodes:
        raise DistError(f"--node-rank {node_rank} must be between 0 and --nnodes - 1 ({nnodes - 1})")


def health_check_timeout() -> int:
    raw = os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT")
    if raw is None:
        return DEFAULT_HEALTH_CHECK_TIMEOUT
    try:
        return int(raw)
    except ValueError:
        raise DistError(f"SGLANG_HEALTH_CHECK_TIMEOUT={raw!r} is not a whole number of seconds; unset it or give "
                        f"e.g. {DEFAULT_HEALTH_CHECK_TIMEOUT}") from None


def _readline(sock: socket.socket, buf: bytearray) -> str | None:
    """One line from ``sock`` (None at EOF or on a reset connection)."""
    while b"\n" not in buf:
        try:
            chunk = sock.recv(4096)
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line.decode(errors="replace").strip()


class _Peer:
    def __init__(self, rank: int, sock: socket.socket, buf: bytearray):
        self.rank = rank
        self.sock = sock
        self.buf = buf


class HeadGroup:
    """Rank 0's side: the rendezvous, the step loop (one collective per step), the health probe, the watchdog."""

    def __init__(self, host: str, port: int, nnodes: int):
        self.host, self.port, self.nnodes = host, port, nnodes
        self._listener: socket.socket | None = None
        self._peers: dict[int, _Peer] = {}
        self._cond = threading.Condition()
        self.started = 0  # forward count: steps begun (the scheduler's forward_ct)
        self.completed = 0
        self.completed_at = float("-inf")
        self._demand = 0
        self._want = 0.0

    # ---- rendezvous ---------------------------------------------------------------------------------
    def listen(self) -> None:
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(64)
        self._listener = sock

    def wait_joined(self) -> None:
        """Accept until ranks 1..N-1 have joined (no deadline, as the real rendezvous under systemd)."""
        assert self._listener is not None
        missing = self.nnodes - 1
        logger.info("atlas stand-in: waiting for %d node rank(s) at --dist-init-addr %s:%d", missing,
                    self.host, self.port)
        while len(self._peers) < self.nnodes - 1:
            conn, addr = self._listener.accept()
            self._admit(conn, addr[0])
        self._listener.close()
        self._listener = None
        logger.info("atlas stand-in: all %d node ranks joined", self.nnodes)
        threading.Thread(target=self._step_loop, name="step-loop", daemon=True).start()

    def _admit(self, conn: socket.socket, ip: str) -> None:
        conn.settimeout(JOIN_READ_TIMEOUT_S)
        buf = bytearray()
        line = _readline(conn, buf) or ""
        parts = line.split()
        reason = None
        if len(parts) != 3 or parts[0] != "join" or not parts[1].isdigit() or not parts[2].isdigit():
            reason = f"bad join message {line!r}"
        else:
            rank, nnodes = int(parts[1]), int(parts[2])
            if nnodes != self.nnodes:
                reason = f"--nnodes {nnodes} on node rank {rank}, but the head runs --nnodes {self.nnodes}"
            elif not 1 <= rank < self.nnodes:
                reason = f"node rank {rank} is not in 1..{self.nnodes - 1}"
            elif rank in self._peers:
                reason = f"node rank {rank} has already joined"
        if reason:
            logger.warning("atlas stand-in: refused a join from %s: %s", ip, reason)
            try:
                conn.sendall(f"refused {reason}\n".encode())
            except OSError:
                pass
            conn.close()
            return
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"welcome\n")
        self._peers[rank] = _Peer(rank, conn, buf)
        logger.info("atlas stand-in: node rank %d joined from %s", rank, ip)

    # ---- steps --------------------------------------------------------------------------------------
    def step(self, duration: float = 0.0) -> None:
        """Called by a request for each token (``duration``: its prefill or decode time): wait for the next
        step that begins from now to complete. Steps are batches: one step advances every running request
        and lasts the longest duration asked of it, as one forward of SGLang's running batch."""
        with self._cond:
            target = self.started + 1
            self._demand = max(self._demand, target)
            self._want = max(self._want, duration)
            self._cond.notify_all()
            while self.completed < target:
                self._cond.wait()

    def in_flight(self) -> bool:
        return self.started > self.completed

    def _step_loop(self) -> None:
        while True:
            with self._cond:
                while self._demand <= self.started:
                    self._cond.wait()
                self.started += 1
                k = self.started
                duration, self._want = self._want, 0.0
            time.sleep(duration)
            self._collective(k)
            with self._cond:
                self.completed = k
                self.completed_at = time.monotonic()
                self._cond.notify_all()

    def _collective(self, k: int) -> None:
        message = f"step {k}\n".encode()
        for peer in self._peers.values():
            try:
                peer.sock.sendall(message)
            except OSError:
                self._hang(peer)
        for peer in self._peers.values():
            if _readline(peer.sock, peer.buf) != f"ok {k}":
                self._hang(peer)

    @staticmethod
    def _hang(peer: _Peer) -> None:
        """A collective with a dead peer never completes (only the watchdog ends it)."""
        logger.debug("atlas stand-in: node rank %d is gone; the collective hangs", peer.rank)
        threading.Event().wait()

    # ---- health and watchdog ------------------------------------------------------------------------
    def probe(self, timeout: int) -> bool:
        """``/health``: a 1-token generate; True once any step completes after the probe began."""
        tic = time.monotonic()
        with self._cond:
            self._demand = max(self._demand, self.started + 1)
            self._cond.notify_all()
        while time.monotonic() < tic + timeout:
            time.sleep(1)
            if self.completed_at > tic:
                return True
        logger.error("Health check failed. Server couldn't get a response from detokenizer for last %d seconds. "
                     "tic start time: %s. last_heartbeat time: %s", timeout, _clock(tic), _clock(self.completed_at))
        return False

    def start_watchdog(self, timeout: float, on_timeout: Callable[[], None] | None = None) -> None:
        threading.Thread(target=self._watchdog, args=(timeout, on_timeout or _crash), name="watchdog",
                         daemon=True).start()

    def _watchdog(self, timeout: float, on_timeout: Callable[[], None]) -> None:
        last_ct, last_time = 0, time.monotonic()
        interval = max(0.1, timeout // 2)  # the real thread sleeps watchdog_timeout // 2
        while True:
            now = time.monotonic()
            if self.in_flight():
                if last_ct == self.started:
                    if now > last_time + timeout:
                        break
                else:
                    last_ct, last_time = self.started, now
            time.sleep(interval)
        sched_logger.error("Watchdog timeout (self.watchdog_timeout=%r)", timeout)
        on_timeout()


def _clock(monotonic_ts: float) -> str:
    if monotonic_ts == float("-inf"):
        return "never"
    return time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic() - monotonic_ts)))


def _crash() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()
    time.sleep(WATCHDOG_GRACE_S)
    engine_logger.error("Received sigquit from a child process. It usually means the child failed.")
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


# ---- ranks >= 1 ---------------------------------------------------------------------------------------
def spawn_scheduler(host: str, port: int, node_rank: int, nnodes: int) -> subprocess.Popen[str]:
    """The rank's scheduler child; it prints ``ready`` on stdout once it has joined."""
    return subprocess.Popen([sys.executable, "-m", "sglang._atlas_standin.dist", host, str(port), str(node_rank),
                             str(nnodes)], stdout=subprocess.PIPE, text=True)


def _die_with_parent() -> None:
    """SGLang's ``kill_itself_when_parent_died``: SIGKILL this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _connect(host: str, port: int) -> socket.socket:
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=JOIN_READ_TIMEOUT_S)
        except OSError:
            time.sleep(CONNECT_RETRY_S)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def scheduler_main(argv: list[str]) -> int:
    host, port, node_rank, nnodes = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:
        return 1
    try:
        npu.hold()  # the scheduler holds the rank's NPUs
    except npu.DeviceError as exc:
        npu.report(exc)
        return 1
    sock = _connect(host, port)
    sock.sendall(f"join {node_rank} {nnodes}\n".encode())
    buf = bytearray()
    answer = _readline(sock, buf)
    if answer != "welcome":
        sys.stderr.write(f"atlas stand-in: the head at {host}:{port} did not let node rank {node_rank} join: "
                         f"{answer or 'connection closed'}\n")
        return 1
    sock.settimeout(None)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        line = _readline(sock, buf)
        if line is None:  # the head is gone: the collective never completes, the rank hangs
            threading.Event().wait()
        if line.startswith("step "):
            sock.sendall(f"ok {line[5:]}\n".encode())


if __name__ == "__main__":
    sys.exit(scheduler_main(sys.argv[1:]))
