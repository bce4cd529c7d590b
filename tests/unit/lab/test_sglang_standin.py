"""The SGLang stand-in as nodes run it: built into a wheel, started as ``python -m sglang.launch_server``."""

from __future__ import annotations

import base64
import csv
import hashlib
import http.client
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from atlasctl.engine_schema.sglang import load_schema
from atlaslab.doubles import npu_smi
from atlaslab.doubles.sglang_standin import LOCK_NAME, SCHEMA_MEMBER, build_standin_wheel, wheel_name

API_KEY = "sk-lab-123"
FAST = {"ATLAS_STANDIN_TTFT_MS": "5", "ATLAS_STANDIN_ITL_MS": "1", "ATLAS_STANDIN_STARTUP_SECONDS": "0"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_standin_wheel(tmp_path_factory.mktemp("wheelhouse"))


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    return target


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                  "max_position_embeddings": 512, "eos_token_id": 2}))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(site: Path, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = {**os.environ, "PYTHONPATH": str(site), **FAST, **(env or {})}
    full_env.pop("ATLAS_STANDIN_SCHEMA", None)
    return subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args], env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(site: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args], env=env, capture_output=True,
                          text=True, timeout=20, check=False)


def _request(port: int, method: str, path: str, body: dict | None = None,
             key: str | None = API_KEY) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data, {k.lower(): v for k, v in resp.getheaders()}


def _wait_listening(port: int, proc: subprocess.Popen[str], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"stand-in exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {timeout}s")


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def server(site: Path, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = _free_port()
    keys = tmp_path_factory.mktemp("keys") / "atlas-serving.keys.yaml"
    keys.write_text(json.dumps({"api-key": API_KEY}) + "\n")  # what roles/serving writes (JSON is YAML)
    proc = _launch(site, ["--model-path", str(model), "--device", "npu", "--attention-backend", "ascend",
                          "--tp-size", "8", "--host", "127.0.0.1", "--port", str(port), "--enable-metrics",
                          "--config", str(keys), "--served-model-name", "bank-llm", "--context-length", "256"],
                   {"ATLAS_STANDIN_EOS_AFTER": "20"})
    try:
        _wait_listening(port, proc)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        assert API_KEY not in cmdline, "the key is in the process list"
        yield port
    finally:
        _stop(proc)


def _sse(data: bytes) -> list[str]:
    return [line[len("data: "):] for line in data.decode().split("\n") if line.startswith("data: ")]


# ---- the wheel ------------------------------------------------------------------------------------------
def test_wheel_record_and_schema(wheel: Path) -> None:
    assert wheel.name == wheel_name() == "atlas_sglang_standin-0.5.6-py3-none-any.whl"
    assert (wheel.parent / LOCK_NAME).read_text() == "atlas-sglang-standin==0.5.6\n"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        assert {r[0] for r in rows} == names
        for path, digest, size in rows:
            if path == record_name:
                continue
            data = zf.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data), path
        assert json.loads(zf.read(SCHEMA_MEMBER)) == load_schema()
        assert "sglang/launch_server.py" in names
        assert not any("__pycache__" in n for n in names)


def test_wheel_is_reproducible(wheel: Path, tmp_path: Path) -> None:
    again = build_standin_wheel(tmp_path)
    assert again.read_bytes() == wheel.read_bytes()


# ---- the command line -----------------------------------------------------------------------------------
def test_unknown_flag_exits_2(site: Path, model: Path) -> None:
    proc = _run(site, ["--model-path", str(model), "--max-batch-size", "8"])
    assert proc.returncode == 2
    assert "launch_server.py: error: unrecognized arguments: --max-batch-size 8" in proc.stderr


def test_invalid_choice_exits_2(site: Path, model: Path) -> None:
    proc = _run(site, ["--model-path", str(model), "--kv-cache-dtype", "fp16"])
    assert proc.returncode == 2
    assert "argument --kv-cache-dtype: invalid choice: 'fp16'" in proc.stderr


def test_missing_model_path_flag_exits_2(site: Path) -> None:
    proc = _run(site, ["--device", "npu"])
    assert proc.returncode == 2
    assert "the following arguments are required: --model-path/--model" in proc.stderr


def test_bad_int_exits_2(site: Path, model: Path) -> None:
    proc = _run(site, ["--model-path", str(model), "--tp-size", "eight"])
    assert proc.returncode == 2 and "argument --tensor-parallel-size/--tp-size: invalid int value" in proc.stderr


def test_model_path_must_exist(site: Path, tmp_path: Path) -> None:
    proc = _run(site, ["--model-path", str(tmp_path / "absent")])
    assert proc.returncode == 1
    assert f"OSError: Can't load the configuration of '{tmp_path / 'absent'}'" in proc.stderr


def test_model_dir_needs_config_json(site: Path, tmp_path: Path) -> None:
    proc = _run(site, ["--model-path", str(tmp_path)])
    assert proc.returncode == 1
    assert f"ValueError: Unrecognized model in {tmp_path}" in proc.stderr


def test_unknown_device_refused(site: Path, model: Path) -> None:
    proc = _run(site, ["--model-path", str(model), "--device", "gpu"])
    assert proc.returncode == 1
    assert "device type at start of device string: gpu" in proc.stderr


# ---- the NPUs it holds (/dev/davinciN, as the lab's driver makes them) ------------------------------------
def _devices(tmp_path: Path, count: int = 4) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in [f"davinci{i}" for i in range(count)] + ["davinci_manager", "devmm_svm", "hisi_hdc"]:
        (dev / name).touch()
    return dev


@pytest.mark.parametrize(("visible", "held"), [(None, [0, 1, 2, 3]), ("1,2", [1, 2])])
def test_the_engine_holds_its_npus_and_npu_smi_sees_it(site: Path, model: Path, tmp_path: Path, visible, held,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    dev = _devices(tmp_path)
    port = _free_port()
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    env = {"ATLAS_STANDIN_DEV_DIR": str(dev), **({"ASCEND_RT_VISIBLE_DEVICES": visible} if visible else {})}
    proc = _launch(site, ["--model-path", str(model), "--host", "127.0.0.1", "--port", str(port)], env)
    try:
        _wait_listening(port, proc)
        expected = {n: [proc.pid] for n in held}
        seen: dict = {}
        for _ in range(50):  # the lab's npu-smi: who holds which /dev/davinciN (held before the port opens)
            seen = {n: [h["pid"] for h in hs] for n, hs in npu_smi.holders(str(dev)).items()}
            if seen == expected:
                break
            time.sleep(0.1)
        assert seen == expected
    finally:
        _stop(proc)
    assert npu_smi.holders(str(dev)) == {}  # released when it exits


def test_no_devices_no_npus_held(site: Path, tmp_path: Path) -> None:
    code = "from sglang._atlas_standin import npu; print(npu.hold(%r, None), npu.hold(%r, '0,1'))"
    out = subprocess.run([sys.executable, "-c", code % (str(tmp_path), str(tmp_path / "nope"))],
                         env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, check=True)
    assert out.stdout == "[] []\n"


def test_a_device_it_cannot_open_ends_the_start_like_torch_npu(site: Path, model: Path, tmp_path: Path) -> None:
    dev = _devices(tmp_path, 2)
    (dev / "davinci1").unlink()
    (dev / "davinci1").mkdir()  # cannot be opened read-write, whoever runs the test
    env = {**os.environ, "PYTHONPATH": str(site), "ATLAS_STANDIN_DEV_DIR": str(dev)}
    env.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", str(model)], env=env,
                          capture_output=True, text=True, timeout=20, check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"atlas stand-in: cannot open {dev / 'davinci1'} (Is a directory)" in proc.stderr
    assert "NPU function error: c10_npu::SetDevice(device_id_), error code is 507033" in proc.stderr
    assert "Failed to open device, retCode=0x7020014, deviceId=1." in proc.stderr
    assert "Uvicorn running" not in proc.stderr


def test_a_permission_failure_names_the_device_group(site: Path) -> None:
    code = ("import errno; from sglang._atlas_standin import npu; "
            "npu.report(npu.DeviceError(3, '/dev/davinci3', PermissionError(errno.EACCES, 'Permission denied')))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)},
                         capture_output=True, text=True, check=True)
    assert out.stderr.startswith("atlas stand-in: cannot open /dev/davinci3 (Permission denied): the serving user "
                                 "needs the group that owns the NPU devices (HwHiAiUser)\n")
    assert "(PID:" in out.stderr and "Device:3, RankID:-1) ERR00100 PTA call acl api failed" in out.stderr


# ---- --config (SGLang's ConfigArgumentMerger rules) ------------------------------------------------------
def test_config_file_args_go_first_so_the_command_line_wins(site: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(site))
    import importlib

    cli = importlib.import_module("sglang._atlas_standin.cli")

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"api-key": "k", "enable-metrics": True, "disable-radix-cache": False,
                               "tp-size": 2, "skip": [], "dp": [1, 2], "trust-remote-code": False}))
    merged = cli.merge_config_file(["--model-path", "m", "--config", str(cfg), "--tp-size", "4"],
                                   {"enable-metrics", "disable-radix-cache"})
    assert merged == ["--api-key", "k", "--enable-metrics", "--tp-size", "2", "--dp", "1", "2",
                      "--trust-remote-code", "false", "--model-path", "m", "--tp-size", "4"]
    assert cli.merge_config_file(["--model-path", "m"], set()) == ["--model-path", "m"]


@pytest.mark.parametrize("name, text, argv_tail, message", [
    ("c.json", "{}", None, "Config file must be YAML format, got: .json"),
    ("absent.yaml", None, None, "Config file not found:"),
    ("list.yaml", "[1, 2]", None, "Config file must contain a dictionary at root level"),
    ("c.yaml", "{}", ["--config"], "Multiple config files specified! Only one allowed."),
])
def test_config_file_errors_are_sglangs(site: Path, model: Path, tmp_path: Path, name, text, argv_tail,
                                        message) -> None:
    cfg = tmp_path / name
    if text is not None:
        cfg.write_text(text)
    argv = ["--model-path", str(model), "--config", str(cfg)] + ([*argv_tail, str(cfg)] if argv_tail else [])
    proc = _run(site, argv)
    assert proc.returncode == 1
    assert f"ValueError: {message}" in proc.stderr


def test_config_flag_without_a_file(site: Path, model: Path) -> None:
    proc = _run(site, ["--model-path", str(model), "--config"])
    assert proc.returncode == 1 and "No config file specified after --config flag!" in proc.stderr


# ---- the server -----------------------------------------------------------------------------------------
def test_health_503_while_starting_then_200_and_sigterm(site: Path, model: Path) -> None:
    port = _free_port()
    proc = _launch(site, ["--model-path", str(model), "--port", str(port), "--host", "127.0.0.1"],
                   {"ATLAS_STANDIN_STARTUP_SECONDS": "4.0"})
    try:
        _wait_listening(port, proc)
        assert _request(port, "GET", "/health", key=None)[0] == 503
        assert _request(port, "GET", "/health_generate", key=None)[0] == 503
        deadline = time.monotonic() + 15
        while _request(port, "GET", "/health", key=None)[0] != 200:
            assert time.monotonic() < deadline, "/health never became 200"
            time.sleep(0.1)
        assert _request(port, "GET", "/metrics", key=None)[0] == 404  # no --enable-metrics
        models = json.loads(_request(port, "GET", "/v1/models", key=None)[1])
        assert models["data"][0]["id"] == str(model)  # served name defaults to the model path
    finally:
        rc = _stop(proc)
    assert rc == 0
    err = proc.stderr.read() if proc.stderr else ""
    assert "The server is fired up and ready to roll!" in err
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=ServerArgs\(model_path=", err, re.M)


def test_api_key(server: int) -> None:
    status, body, _ = _request(server, "GET", "/v1/models", key=None)
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert _request(server, "GET", "/v1/models", key="wrong")[0] == 401
    assert _request(server, "POST", "/v1/completions", {"prompt": "x"}, key=None)[0] == 401
    assert _request(server, "GET", "/health", key=None)[0] == 200
    assert _request(server, "GET", "/metrics", key=None)[0] == 200
    assert _request(server, "GET", "/v1/models")[0] == 200


def test_models_and_info(server: int, model: Path) -> None:
    models = json.loads(_request(server, "GET", "/v1/models")[1])
    assert models["object"] == "list"
    assert models["data"][0] | {"created": 0} == {"id": "bank-llm", "object": "model", "created": 0,
                                                  "owned_by": "sglang", "root": "bank-llm", "parent": None,
                                                  "max_model_len": 256}
    info = json.loads(_request(server, "GET", "/model_info")[1])
    assert info["is_generation"] is True and info["model_path"] == str(model)
    server_info = json.loads(_request(server, "GET", "/server_info")[1])
    assert server_info["tp_size"] == 8 and server_info["page_size"] == 128 and server_info["version"] == "0.5.6"
    assert server_info["attention_backend"] == "ascend" and server_info["device"] == "npu"


def test_completion_token_counts(server: int) -> None:
    prompt = "The bank's branch in Lyon opens at nine."
    status, body, _ = _request(server, "POST", "/v1/completions", {"model": "bank-llm", "prompt": prompt,
                                                                  "max_tokens": 7})
    assert status == 200
    data = json.loads(body)
    assert data["object"] == "text_completion" and data["model"] == "bank-llm"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length"
    prompt_tokens = len(re.findall(r"\w+|[^\w\s]", prompt))
    assert data["usage"]["prompt_tokens"] == prompt_tokens == 11
    assert data["usage"]["completion_tokens"] == 7 == len(re.findall(r"\w+|[^\w\s]", choice["text"]))
    assert data["usage"]["total_tokens"] == 18
    again = json.loads(_request(server, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 7})[1])
    assert again["choices"][0]["text"] == choice["text"]  # deterministic


def test_default_max_tokens_and_eos(server: int) -> None:
    data = json.loads(_request(server, "POST", "/v1/completions", {"prompt": "hello"})[1])
    assert data["usage"]["completion_tokens"] == 16  # OpenAI/SGLang default max_tokens
    messages = [{"role": "user", "content": "hi"}]
    chat = json.loads(_request(server, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 30})[1])
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["finish_reason"] == "stop" and chat["choices"][0]["matched_stop"] == 2  # eos id
    assert chat["usage"]["completion_tokens"] == 20  # ATLAS_STANDIN_EOS_AFTER
    forced = json.loads(_request(server, "POST", "/v1/chat/completions",
                                 {"messages": messages, "max_tokens": 30, "ignore_eos": True})[1])
    assert forced["choices"][0]["finish_reason"] == "length" and forced["usage"]["completion_tokens"] == 30
    too_long = json.loads(_request(server, "POST", "/v1/chat/completions",
                                   {"messages": messages, "max_tokens": 300})[1])
    assert too_long["object"] == "error" and "maximum context length of 256 tokens" in too_long["message"]


def test_context_overflow_is_400(server: int) -> None:
    status, body, _ = _request(server, "POST", "/v1/completions", {"prompt": "a " * 250, "max_tokens": 10})
    assert status == 400
    err = json.loads(body)
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert "You requested a total of 260 tokens: 250 tokens from the input messages" in err["message"]


def test_chat_streaming_chunks_and_usage(server: int) -> None:
    status, body, headers = _request(server, "POST", "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Rates today?"}],
        "max_tokens": 12, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = _sse(body)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(content) == 12  # one token per chunk
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    usage = chunks[-1]
    assert usage["choices"] == []
    # system: 2 + 3 ("Be", "brief", "."), user: 2 + 3 ("Rates", "today", "?"), assistant start: 1
    assert usage["usage"] == {"prompt_tokens": 11, "completion_tokens": 12, "total_tokens": 23,
                              "prompt_tokens_details": None, "reasoning_tokens": 0}


def test_completion_streaming_without_usage(server: int) -> None:
    status, body, _ = _request(server, "POST", "/v1/completions", {"prompt": "one two", "max_tokens": 4,
                                                                  "stream": True})
    events = _sse(body)
    chunks = [json.loads(e) for e in events[:-1]]
    assert status == 200 and events[-1] == "[DONE]" and len(chunks) == 4
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]
    assert all(c["usage"] is None for c in chunks)


def test_metrics_names_and_counts(server: int) -> None:
    before = _request(server, "GET", "/metrics", key=None)[1].decode()
    _request(server, "POST", "/v1/completions", {"prompt": "count me", "max_tokens": 3})
    status, body, headers = _request(server, "GET", "/metrics", key=None)
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    real = {m["name"] for m in load_schema()["metrics"]}
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert families <= real, families - real  # every name the stand-in serves is one of the release's
    for name in ["sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
                 "sglang:inter_token_latency_seconds", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:num_running_reqs", "sglang:num_queue_reqs",
                 "sglang:token_usage", "sglang:cache_hit_rate", "sglang:gen_throughput"]:
        assert name in families
    sched = 'model_name="bank-llm",engine_type="unified",tp_rank="0",pp_rank="0"'
    assert f"sglang:num_running_reqs{{{sched}}} 0.0" in text

    def value(metrics: str, sample: str) -> float:
        match = re.search(rf"^{re.escape(sample)} (\S+)$", metrics, re.M)
        assert match, sample
        return float(match.group(1))

    gen = 'sglang:generation_tokens_total{model_name="bank-llm"}'
    assert value(text, gen) - value(before, gen) == 3
    assert value(text, 'sglang:prompt_tokens_total{model_name="bank-llm"}') - \
        value(before, 'sglang:prompt_tokens_total{model_name="bank-llm"}') == 2
    assert value(text, 'sglang:time_to_first_token_seconds_bucket{model_name="bank-llm",le="+Inf"}') >= 1


def test_unknown_route_and_method(server: int) -> None:
    assert _request(server, "GET", "/nope")[0] == 404
    assert _request(server, "GET", "/v1/completions")[0] == 405


@pytest.mark.skipif(not (Path(sys.base_prefix) / "bin").exists(), reason="needs python3 -m venv")
def test_node_install_recipe(wheel: Path, tmp_path: Path, model: Path) -> None:
    """The bundle recipe: a fresh venv, pip with no index and no deps, then the real launch command."""
    venv = tmp_path / "V"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin/pip"), "install", "--no-index", "--no-deps", "--find-links",
                          str(wheel.parent), "-r", str(wheel.parent / LOCK_NAME)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert pip.returncode == 0, pip.stderr
    proc = subprocess.run([str(venv / "bin/python"), "-m", "sglang.launch_server", "--model-path", str(model),
                           "--enable-prefix-caching"], capture_output=True, text=True, timeout=20, check=False)
    assert proc.returncode == 2 and "unrecognized arguments: --enable-prefix-caching" in proc.stderr
