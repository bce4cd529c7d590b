"""Truth check: shipped profiles lint clean; every fictional or invalid setting of the seed article
(ascend-facts.md §1, row by row) is rejected with the real alternative; unknown names are errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from atlasctl import planner
from atlasctl.collection import module_utils

lint = module_utils("engine_lint")
VLLM = "vllm-ascend-0.11.0"
SGLANG = "sglang-0.5.6"
VLLM_BASE = ["/opt/atlas/engines/vllm/bin/vllm", "serve", "/var/lib/atlas/models/m", "--dtype", "float16"]
SGLANG_BASE = ["bin/python", "-m", "sglang.launch_server", "--model-path", "/m", "--device", "npu"]


def _messages(argv, env, release):
    return [f["message"] for f in lint.lint(argv, env, release)]


@pytest.mark.parametrize("profile", planner.profile_names())
def test_every_shipped_profile_lints_clean(profile):
    assert planner.lint_profile(profile) == []


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


def test_cli_lint_rendered_files_fails_on_the_article_settings(tmp_path):
    args = tmp_path / "atlas-serving.args"
    args.write_text("\n".join([*VLLM_BASE, "--page-size", "16384"]) + "\n", encoding="utf-8")
    env = tmp_path / "atlas-serving.env"
    env.write_text("# comment\nVLLM_USE_CANN=1\nASCEND_DEVICE_ID=0,1,2,3\n", encoding="utf-8")
    proc = _atlasctl("config", "lint", "--release", VLLM, "--argv-file", str(args), "--env-file", str(env))
    assert proc.returncode == 1
    assert "3 finding(s)" in proc.stdout
    assert "use `ASCEND_RT_VISIBLE_DEVICES=0,1,2,3`" in proc.stdout
