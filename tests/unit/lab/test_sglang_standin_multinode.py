"""The SGLang stand-in as a two-node instance: rank 0 and rank 1 as real processes on 127.0.0.1.

Every wait polls a condition with a deadline (no fixed sleeps). Timings: SGLANG_HEALTH_CHECK_TIMEOUT=1,
--watchdog-timeout 1 (plus SGLang's 5 s grace before the crash).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from atlaslab.doubles import npu_smi
from atlaslab.doubles.sglang_standin import build_standin_wheel

FAST = {"ATLAS_STANDIN_TTFT_MS": "5", "ATLAS_STANDIN_ITL_MS": "2", "ATLAS_STANDIN_STARTUP_SECONDS": "0",
        "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
PROMPT = {"model": "m", "prompt": "atlas ascend", "max_tokens": 4}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(build_standin_wheel(tmp_path_factory.mktemp("wheelhouse"))) as zf:
        zf.extractall(target)
    return target


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 512}))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _await(what: str, cond: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def _get(port: int, path: str, timeout: float = 5.0) -> int | None:
    """The status of GET path, None when nothing answers (refused, or no reply in time)."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except OSError:
        return None


def _metrics(port: int) -> dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name.split("{", 1)[0]] = float(value)
    return values


class Completion(threading.Thread):
    """A completion in the background; ``status`` is set when it answers."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.port = port
        self.status: int | None = None
        self.body: dict[str, Any] = {}
        self.start()

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            conn.request("POST", "/v1/completions", body=json.dumps(PROMPT),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.body = json.loads(resp.read())
            self.status = resp.status
        except OSError:
            pass


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


class Instance:
    def __init__(self, site: Path, model: Path, logs: Path, watchdog: float = 30):
        self.site, self.model, self.logs, self.watchdog = site, model, logs, watchdog
        self.dist_port, self.ports = _free_port(), [_free_port(), _free_port()]
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, rank: int, nnodes: int = 2, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(self.site), **FAST, **(env or {})}
        env.pop("ATLAS_STANDIN_SCHEMA", None)
        args = ["--model-path", str(self.model), "--host", "127.0.0.1", "--port", str(self.ports[rank]),
                "--enable-metrics", "--nnodes", str(nnodes), "--node-rank", str(rank),
                "--dist-init-addr", f"127.0.0.1:{self.dist_port}", "--watchdog-timeout", str(self.watchdog)]
        log = (self.logs / f"rank{rank}-{len(self.procs)}.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        self.procs.append(proc)
        return proc

    def log(self, rank: int) -> str:
        return "".join(p.read_text() for p in sorted(self.logs.glob(f"rank{rank}-*.log")))

    def stop(self) -> None:
        for proc in self.procs:
            for pid in _children(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def instance(site: Path, model: Path, tmp_path: Path) -> Iterator[Instance]:
    inst = Instance(site, model, tmp_path)
    try:
        yield inst
    finally:
        inst.stop()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_head_answers_once_every_rank_joined_and_a_stopped_rank_stalls_it(instance: Instance) -> None:
    head = instance.start(0)
    _await("rank 0 listens on --dist-init-addr", lambda: _listening(instance.dist_port))
    assert _get(instance.ports[0], "/health") is None, "rank 0 answered before rank 1 joined"
    assert head.poll() is None
    instance.start(1)
    _await("rank 0 /health 200", lambda: _get(instance.ports[0], "/health") == 200)
    for path in ("/health", "/health_generate", "/ping"):
        assert _get(instance.ports[1], path) == 200, path
    assert _get(instance.ports[1], "/v1/models") == 404
    done = Completion(instance.ports[0])
    done.join(10)
    assert done.status == 200 and done.body["usage"]["completion_tokens"] == 4
    tokens = _metrics(instance.ports[0])["sglang:generation_tokens_total"]
    assert tokens == 4

    scheduler = _await("rank 1's scheduler child", lambda: _children(instance.procs[1].pid))[0]
    os.kill(scheduler, signal.SIGSTOP)
    stalled = Completion(instance.ports[0])
    stalled.join(1.5)
    assert stalled.status is None, "a completion finished while rank 1 was stopped"
    assert _get(instance.ports[1], "/health") == 200, "rank 1's dummy health must stay 200"
    _await("the stalled request is running", lambda: _metrics(instance.ports[0])["sglang:num_running_reqs"] == 1)
    assert _metrics(instance.ports[0])["sglang:generation_tokens_total"] == tokens, "tokens advanced while stopped"
    started = time.monotonic()
    assert _get(instance.ports[0], "/health", timeout=10) == 503
    assert time.monotonic() - started >= 1.0, "503 before SGLANG_HEALTH_CHECK_TIMEOUT"
    assert "Health check failed. Server couldn't get a response from detokenizer for last 1 seconds" \
        in instance.log(0)

    os.kill(scheduler, signal.SIGCONT)
    stalled.join(10)
    assert stalled.status == 200
    again = Completion(instance.ports[0])
    again.join(10)
    assert again.status == 200
    _await("rank 0 /health 200 again", lambda: _get(instance.ports[0], "/health") == 200)
    assert _metrics(instance.ports[0])["sglang:num_running_reqs"] == 0
    assert head.poll() is None


def test_each_rank_s_scheduler_holds_its_npus(instance: Instance, tmp_path: Path) -> None:
    """Rank 0's main process is its scheduler; a rank >= 1's scheduler is its child, not the dummy health server.
    (Both ranks on this one machine: each gets its own device directory, as each node has its own /dev.)"""
    devs = []
    for rank in (0, 1):
        dev = tmp_path / f"dev{rank}"
        dev.mkdir()
        for n in range(2):
            (dev / f"davinci{n}").touch()
        devs.append(dev)
    head = instance.start(0, env={"ATLAS_STANDIN_DEV_DIR": str(devs[0])})
    rank1 = instance.start(1, env={"ATLAS_STANDIN_DEV_DIR": str(devs[1])})
    _await("rank 0 /health 200", lambda: _get(instance.ports[0], "/health") == 200)
    scheduler = _await("rank 1's scheduler child", lambda: _children(rank1.pid))[0]
    pids = [{n: [h["pid"] for h in hs] for n, hs in npu_smi.holders(str(dev)).items()} for dev in devs]
    assert pids == [{0: [head.pid], 1: [head.pid]}, {0: [scheduler], 1: [scheduler]}]


def test_a_dead_rank_hangs_the_instance_until_the_watchdog_kills_the_head(instance: Instance) -> None:
    instance.watchdog = 1
    head = instance.start(0)
    rank1 = instance.start(1)
    _await("rank 0 /health 200", lambda: _get(instance.ports[0], "/health") == 200)
    scheduler = _children(rank1.pid)
    rank1.kill()
    rank1.wait(5)
    _await("rank 1's scheduler died with its parent", lambda: all(not Path(f"/proc/{p}").exists() or
                                                                  "Z" in Path(f"/proc/{p}/stat").read_text().split()[2]
                                                                  for p in scheduler))
    hung = Completion(instance.ports[0])
    code = _await("rank 0 exits", head.poll, timeout=15)
    assert code == -signal.SIGKILL
    assert hung.status is None
    log = instance.log(0)
    assert "Watchdog timeout (self.watchdog_timeout=1.0)" in log
    assert log.index("Watchdog timeout") < log.index("Received sigquit from a child process")


@pytest.mark.parametrize(("args", "message"), [
    (["--nnodes", "2", "--node-rank", "0"], "--nnodes 2 needs --dist-init-addr HOST:PORT"),
    (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:5000"],
     "--node-rank 2 must be between 0 and --nnodes - 1 (1)"),
    (["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "head-without-port"],
     "--dist-init-addr 'head-without-port' is not HOST:PORT"),
])
def test_bad_multinode_flags_exit_1(site: Path, model: Path, args: list[str], message: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("ATLAS_STANDIN_SCHEMA", None)
    result = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), *args],
                            env=env, capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 1
    assert message in result.stderr


def test_a_rank_of_another_instance_size_is_refused(instance: Instance) -> None:
    head = instance.start(0)
    _await("rank 0 listens on --dist-init-addr", lambda: _listening(instance.dist_port))
    wrong = instance.start(1, nnodes=3)
    assert wrong.wait(10) == 1
    assert "--nnodes 3 on node rank 1, but the head runs --nnodes 2" in instance.log(1)
    assert head.poll() is None and _get(instance.ports[0], "/health") is None
