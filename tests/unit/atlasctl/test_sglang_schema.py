"""The committed SGLang schema: real flags present, the deployment guide's fictions absent, extractor behaviour."""

from __future__ import annotations

import hashlib
import json
import textwrap
from pathlib import Path

import pytest

from atlasctl.engine_schema.sglang import PINNED_VERSION, extract_sglang_schema, load_schema, schema_path
from atlasctl.errors import AtlasError

FICTION = ["--max-batch-size", "--enable-prefix-caching", "--rope-scaling", "--sglang-stream-num",
           "--enable-cann-optimize"]


@pytest.fixture(scope="module")
def schema() -> dict:
    return load_schema(PINNED_VERSION)


@pytest.fixture(scope="module")
def by_option(schema: dict) -> dict[str, dict]:
    return {opt: flag for flag in schema["flags"] for opt in flag["options"]}


def test_header(schema: dict) -> None:
    assert schema["engine"] == "sglang"
    assert schema["version"] == PINNED_VERSION
    assert schema["launch"] == "python -m sglang.launch_server"
    assert schema["source"]["dist"] == f"sglang=={PINNED_VERSION}"
    assert schema["source"]["file"] == "sglang/srt/server_args.py"
    assert len(schema["source"]["sha256"]) == 64
    assert len(schema["flags"]) > 250


REAL = ["--model-path", "--device", "--attention-backend", "--tp-size", "--mem-fraction-static",
        "--max-running-requests", "--chunked-prefill-size", "--context-length", "--page-size", "--kv-cache-dtype",
        "--served-model-name", "--host", "--port", "--api-key", "--enable-metrics", "--disable-radix-cache",
        "--max-prefill-tokens", "--dtype", "--json-model-override-args"]


@pytest.mark.parametrize("option", REAL)
def test_real_flag_present(by_option: dict, option: str) -> None:
    assert option in by_option


@pytest.mark.parametrize("option", FICTION)
def test_article_fiction_absent(by_option: dict, option: str) -> None:
    assert option not in by_option


def test_flag_details(by_option: dict) -> None:
    assert by_option["--model"] is by_option["--model-path"]
    assert by_option["--model-path"]["required"] is True
    assert by_option["--tp-size"]["dest"] == "tensor_parallel_size"  # argparse: first long spelling
    assert by_option["--tp-size"]["options"] == ["--tensor-parallel-size", "--tp-size"]
    assert by_option["--tp-size"]["type"] == "int"
    assert by_option["--tp-size"]["default"] == 1
    assert by_option["--port"]["default"] == 30000
    assert by_option["--mem-fraction-static"]["type"] == "float"
    assert by_option["--enable-metrics"]["type"] == "bool"
    assert by_option["--enable-metrics"]["action"] == "store_true"
    assert by_option["--enable-metrics"]["default"] is False
    backend = by_option["--attention-backend"]
    assert "ascend" in backend["choices"]
    assert backend["choices_source"] == "constant:ATTENTION_BACKEND_CHOICES"
    assert by_option["--kv-cache-dtype"]["choices"] == ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16",
                                                        "fp4_e2m1"]
    assert "fp16" not in by_option["--kv-cache-dtype"]["choices"]
    assert "float16" in by_option["--dtype"]["choices"]
    assert by_option["--device"]["choices"] is None  # validated at run time by torch, not by argparse


def test_env_and_metrics(schema: dict) -> None:
    env = {e["name"]: e for e in schema["env"]}
    assert "SGLANG_SET_CPU_AFFINITY" in env
    assert all(name.startswith("SGLANG_") for name in env)
    metrics = {m["name"]: m for m in schema["metrics"]}
    for name in ["sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds",
                 "sglang:inter_token_latency_seconds", "sglang:prompt_tokens_total",
                 "sglang:generation_tokens_total", "sglang:num_running_reqs", "sglang:num_queue_reqs",
                 "sglang:token_usage", "sglang:cache_hit_rate", "sglang:gen_throughput"]:
        assert name in metrics
    assert metrics["sglang:time_to_first_token_seconds"]["type"] == "histogram"


FAKE_SERVER_ARGS = '''
import argparse
import dataclasses
from sglang.srt.consts import MODES

BACKENDS = ["triton", "ascend"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    port: int = 30000
    ratio: float = 0.5 * 2
    backend: str = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        extra = ["x"]
        parser.add_argument("--model-path", "--model", type=str, required=True, help="Model.")
        parser.add_argument("--port", type=int, default=ServerArgs.port, help=f"Port {extra}.")
        parser.add_argument("--ratio", nargs="?", const=0.7, type=float, default=ServerArgs.ratio)
        parser.add_argument("--backend", choices=BACKENDS + ["cpu"], default=ServerArgs.backend)
        parser.add_argument("--mode", choices=MODES)
        parser.add_argument("--parser", choices=list(Registry.MAP.keys()))
        parser.add_argument("--quiet", action="store_true")
'''


def test_extract_from_source_tree(tmp_path: Path) -> None:
    src = tmp_path / "sglang/srt/server_args.py"
    src.parent.mkdir(parents=True)
    src.write_text(textwrap.dedent(FAKE_SERVER_ARGS))
    (tmp_path / "sglang/srt/consts.py").write_text('MODES = ["a", "b"]\n')
    (tmp_path / "sglang/srt/environ.py").write_text("class Envs:\n    SGLANG_FOO = EnvBool(True)\n")
    (tmp_path / "sglang/other.py").write_text('import os\nX = os.environ.get("SGLANG_BAR", "1")\n')
    schema = extract_sglang_schema(src, "9.9.9")
    assert schema["source"]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    flags = {f["dest"]: f for f in schema["flags"]}
    assert flags["model_path"]["options"] == ["--model-path", "--model"]
    assert flags["port"]["default"] == 30000 and flags["port"]["help"] == "Port ['x']."
    assert flags["ratio"]["default"] == 1.0
    assert flags["ratio"]["const"] == 0.7 and flags["ratio"]["nargs"] == "?"
    assert flags["backend"]["choices"] == ["triton", "ascend", "cpu"]
    assert flags["mode"]["choices"] == ["a", "b"] and flags["mode"]["choices_source"] == "constant:MODES"
    assert flags["parser"]["choices"] is None
    assert flags["parser"]["choices_source"] == "runtime:list(Registry.MAP.keys())"
    assert flags["quiet"]["type"] == "bool" and flags["quiet"]["default"] is False
    env = {e["name"]: e for e in schema["env"]}
    assert env["SGLANG_FOO"]["type"] == "bool" and env["SGLANG_FOO"]["default"] is True
    assert env["SGLANG_BAR"]["default"] == "1" and env["SGLANG_BAR"]["read_by"] == ["sglang/other.py"]
    json.dumps(schema)  # serialisable


def test_extract_missing_file_names_input(tmp_path: Path) -> None:
    with pytest.raises(AtlasError, match="does not exist"):
        extract_sglang_schema(tmp_path / "nope.py", "0.5.6")


def test_load_schema_missing_version() -> None:
    with pytest.raises(AtlasError, match="no SGLang schema for 0.0.0"):
        load_schema("0.0.0")
    assert schema_path("0.0.0").name == "sglang-0.0.0.json"


# --- the current line (SGLang 0.5.16): flags declared as annotated dataclass fields ---------------------

@pytest.fixture(scope="module")
def current() -> dict[str, dict]:
    return {opt: flag for flag in load_schema("0.5.16")["flags"] for opt in flag["options"]}


def test_current_line_holds_the_flags_the_profiles_and_instances_use(current: dict) -> None:
    for option in [*REAL, "--nnodes", "--node-rank", "--dist-init-addr", "--dp-size", "--pp-size", "--ep-size",
                   "--enable-dp-attention", "--quantization", "--config"]:
        assert option in current, option
    assert current["--tp-size"] is current["--tensor-parallel-size"]
    assert current["--tp-size"]["dest"] == "tp_size" and current["--tp-size"]["type"] == "int"
    assert current["--model-path"]["required"] is True
    assert current["--enable-metrics"]["action"] == "store_true"
    assert "--no-lora-strict-loading" in current["--lora-strict-loading"]["options"]
    assert "ascend" in current["--attention-backend"]["choices"]
    assert "fp16" not in current["--kv-cache-dtype"]["choices"]
    assert current["--context-length"]["type"] == "custom:human_readable_int"  # "32k" is a value too
    metrics = {m["name"] for m in load_schema("0.5.16")["metrics"]}
    assert {"sglang:num_running_reqs", "sglang:time_to_first_token_seconds"} <= metrics


ANNOTATED_SERVER_ARGS = '''
import dataclasses
from typing import List, Literal, Optional
from sglang.srt.arg_groups.arg_utils import A, Arg, add_cli_args_from_dataclass

MODES = ["a", "b"]


@dataclasses.dataclass
class ServerArgs:
    model_path: A[str, Arg(help="Model.", aliases=["--model"])]
    tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
    mem: A[Optional[float], "Memory."] = None
    device: A[Optional[str], "Device."] = None
    mode: A[str, Arg(help="Mode.", choices=MODES)] = "a"
    level: A[Literal[1, 2], "Level."] = 1
    targets: A[Optional[List[str]], "Targets."] = None
    fast: A[bool, "Fast."] = False
    strict: A[bool, Arg(help="Strict.", action=argparse.BooleanOptionalAction)] = True
    hidden: A[bool, Arg(no_cli=True)] = False
    length: A[Optional[int], Arg(help="Len.", type_parser=human_readable_int)] = None
    workers: A[int, "Workers."] = 1
    workers: A[int, "Workers, declared again."] = 2
    plain: int = 3

    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--config", type=str, help="Config file.")

    def check_server_args(self):
        assert self.workers >= 1, "workers"
        assert self.mem > 0
        if self.tp_size < 1:
            raise ValueError("tp")
        if self.fast:
            assert self.level >= 2
'''


def test_extract_annotated_dataclass_fields_as_add_cli_args_from_dataclass_does(tmp_path: Path) -> None:
    from atlasctl.engine_schema.sglang import server_args_ranges

    src = tmp_path / "sglang/srt/server_args.py"
    src.parent.mkdir(parents=True)
    src.write_text(textwrap.dedent(ANNOTATED_SERVER_ARGS))
    schema = extract_sglang_schema(src, "9.9.9")
    flags = {f["dest"]: f for f in schema["flags"]}
    assert list(flags) == ["model_path", "tp_size", "mem", "device", "mode", "level", "targets", "fast", "strict",
                           "length", "workers", "config"]
    assert flags["model_path"]["options"] == ["--model-path", "--model"] and flags["model_path"]["required"] is True
    assert flags["tp_size"]["options"] == ["--tp-size", "--tensor-parallel-size"] and flags["tp_size"]["default"] == 1
    assert flags["mem"]["type"] == "float" and flags["mem"]["required"] is False
    assert flags["device"]["nullable"] is True
    assert flags["mode"]["choices"] == ["a", "b"] and flags["mode"]["choices_source"] == "constant:MODES"
    assert flags["level"]["choices"] == [1, 2] and flags["level"]["type"] == "int"
    assert flags["targets"]["nargs"] == "+"
    assert flags["fast"]["type"] == "bool" and flags["fast"]["action"] == "store_true"
    assert flags["strict"]["options"] == ["--strict", "--no-strict"]
    assert flags["length"]["type"] == "custom:human_readable_int"
    assert flags["workers"]["default"] == 2 and flags["workers"]["help"] == "Workers, declared again."
    found = {(r["flag"], r.get("ge"), r.get("gt")): r["source"] for r in server_args_ranges(src, schema["flags"])}
    assert found == {("--workers", 1, None): "sglang/srt/server_args.py:32",
                     ("--mem", None, 0): "sglang/srt/server_args.py:33",
                     ("--tp-size", 1, None): "sglang/srt/server_args.py:34"}  # the check under `if` is not a range


# --- SGLang 0.5.23: ServerArgs built from namespace classes in sglang/srt/arg_groups/fields/ -------------

@pytest.fixture(scope="module")
def release_0523() -> dict[str, dict]:
    return {opt: flag for flag in load_schema("0.5.23")["flags"] for opt in flag["options"]}


def test_0_5_23_holds_the_flags_the_profiles_and_instances_use(release_0523: dict) -> None:
    schema = load_schema("0.5.23")
    assert schema["source"]["sha256"] == "fa41e6e4298eab15fd598179e4d85fb31ed815e57146f0be8f4d2761cdba08e8"
    assert {"sglang/srt/arg_groups/fields/device.py", "sglang/srt/arg_groups/fields/exec_.py",
            "sglang/srt/arg_groups/field_order.py"} <= set(schema["source"]["files"])
    for option in [*REAL, "--nnodes", "--node-rank", "--dist-init-addr", "--dp-size", "--pp-size", "--ep-size",
                   "--enable-dp-attention", "--quantization", "--config", "--sampling-backend"]:
        assert option in release_0523, option
    assert release_0523["--tp-size"] is release_0523["--tensor-parallel-size"]
    assert release_0523["--model-path"]["required"] is True
    assert "ascend" in release_0523["--attention-backend"]["choices"]
    assert release_0523["--context-length"]["type"] == "custom:human_readable_int"
    # add_cli_args's own flags whose default is a field's (``default=_declared_default("sampling_backend")``)
    sampling = release_0523["--sampling-backend"]
    assert sampling["default"] is None and "default_expr" not in sampling
    # --enable-dp-attention is registered as a deprecated spelling (use --attn-dp-size)
    assert release_0523["--enable-dp-attention"]["action"] == "custom:DeprecatedStoreTrueAction"
    assert "--attn-dp-size" in release_0523
    # flags 0.5.16 has and 0.5.23 dropped
    for gone in ("--cuda-graph-max-bs", "--enable-nsa-prefill-context-parallel", "--stream-output"):
        assert gone not in release_0523 and gone in {o for f in load_schema("0.5.16")["flags"] for o in f["options"]}
    env = {e["name"] for e in schema["env"]}
    assert {"SGLANG_SET_CPU_AFFINITY"} <= env
    assert {"sglang:num_running_reqs", "sglang:time_to_first_token_seconds"} <= {m["name"] for m in schema["metrics"]}


NAMESPACED = {
    "sglang/srt/server_args.py": '''
        import argparse
        from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass
        from sglang.srt.arg_groups.fields.device import Device
        from sglang.srt.arg_groups.fields.serving import Serving


        def _declared_default(name):
            return name


        class ServerArgs:
            @staticmethod
            def add_cli_args(parser: argparse.ArgumentParser):
                add_cli_args_from_dataclass(parser, ServerArgs)
                parser.add_argument("--sampler", type=str, default=_declared_default("sampler"))

            def check_server_args(self):
                from sglang.srt.arg_groups.validation_hook import check_server_args

                check_server_args(self)


        _INPUT_NAMESPACES = [Device, Serving]
        ''',
    "sglang/srt/arg_groups/field_order.py": 'POSITIONAL_FIELD_ORDER = ("port", "base_id")\n',
    "sglang/srt/arg_groups/choices.py": 'MODES = ["x", "y"]\n',
    "sglang/srt/arg_groups/fields/device.py": '''
        import msgspec
        from sglang.srt.arg_groups.arg_utils import A, Arg
        from sglang.srt.arg_groups.choices import MODES


        class Device(msgspec.Struct):
            _NS_PATH = "device"
            base_id: A[int, "Base."] = 0
            step: A[int, "Step."] = 1
            mode: A[str, Arg(help="Mode.", choices=MODES)] = "x"
            hidden: A[bool, Arg(no_cli=True)] = False
        ''',
    "sglang/srt/arg_groups/fields/serving.py": '''
        import msgspec
        from typing import List, Optional
        from sglang.srt.arg_groups.arg_utils import A, Arg


        class Serving(msgspec.Struct):
            _NS_PATH = "serving"
            port: A[int, "Port."] = 30000
            urls: A[List[str], "URLs."] = msgspec.field(default_factory=list)
            sampler: A[Optional[str], Arg(no_cli=True)] = "greedy"
            workers: A[int, "Workers."] = 1
        ''',
    "sglang/srt/arg_groups/validation_hook.py": '''
        from sglang.srt.arg_groups.model_override_base import resolving_view


        def check_server_args(server_args):
            from sglang.srt.arg_groups.lora_hook import check_more

            cfg = resolving_view(server_args)
            other = something_else(server_args)
            assert cfg.base_id >= 0, "base"
            if cfg.step < 1:
                raise ValueError("step")
            if cfg.mode == "y":
                assert cfg.workers >= 2
            assert other.port > 0
            check_more(server_args)
            _local(server_args)


        def _local(server_args):
            assert server_args.port < 65536
        ''',
    "sglang/srt/arg_groups/lora_hook.py": '''
        def check_more(server_args):
            cfg = resolving_view(server_args)
            assert cfg.workers > 0, "workers"
        ''',
}


def test_extract_namespace_fields_and_the_checks_check_server_args_hands_the_record_to(tmp_path: Path) -> None:
    from atlasctl.engine_schema.sglang import server_args_ranges

    for rel, text in NAMESPACED.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    src = tmp_path / "sglang/srt/server_args.py"
    schema = extract_sglang_schema(src, "9.9.9")
    flags = {f["dest"]: f for f in schema["flags"]}
    # POSITIONAL_FIELD_ORDER first, then the namespaces' other fields in declaration order, then add_argument's
    assert [f["dest"] for f in schema["flags"]] == ["port", "base_id", "step", "mode", "urls", "workers", "sampler"]
    assert flags["mode"]["choices"] == ["x", "y"] and flags["mode"]["choices_source"] == "constant:MODES"
    assert flags["urls"]["nargs"] == "+"
    assert schema["flags"][-1]["options"] == ["--sampler"] and schema["flags"][-1]["default"] == "greedy"
    assert set(schema["source"]["files"]) == {"sglang/srt/arg_groups/fields/device.py",
                                              "sglang/srt/arg_groups/fields/serving.py",
                                              "sglang/srt/arg_groups/field_order.py"}
    found = {(r["flag"], r.get("ge"), r.get("gt"), r.get("lt")): r["source"]
             for r in server_args_ranges(src, schema["flags"])}
    assert found == {("--base-id", 0, None, None): "sglang/srt/arg_groups/validation_hook.py:10",
                     ("--step", 1, None, None): "sglang/srt/arg_groups/validation_hook.py:11",
                     ("--workers", None, 0, None): "sglang/srt/arg_groups/lora_hook.py:4",
                     ("--port", None, None, 65536): "sglang/srt/arg_groups/validation_hook.py:21"}
    # not ranges: the assert under `if`, and a name not bound to resolving_view(<record>)
