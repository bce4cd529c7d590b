"""Memory planner: hand-calculated Llama-2-70B figures, safetensors headers read without the tensors,
refusal with the nearest fix, and the capacity table of the shipped profiles."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import memplan

from atlasctl import planner
from support.lab_additions import PROFILE_DIRS as LAB_DIRS

GIB = 1024**3
LLAMA70B = json.loads((planner.model_data_dir() / "llama-2-70b-chat-hf/config.json").read_text())
FLAGS_8 = {"--tensor-parallel-size": 8, "--dtype": "float16", "--max-model-len": 2048, "--max-num-seqs": 10,
           "--gpu-memory-utilization": 0.85}

# Hand calculation (Llama-2-70B: 80 layers, hidden 8192, 64 heads, 8 KV heads, head_dim 128,
# intermediate 28672, vocab 32000, untied lm_head):
#   per layer: q,o 2*8192*8192 + k,v 2*8192*1024 + mlp 3*8192*28672 + norms 2*8192 = 855,654,400
#   total: 80*855,654,400 + 2*32000*8192 + 8192 = 68,976,648,192 parameters
#   fp16 weights: 137,953,296,384 B = 128.48 GiB
#   8 x 64 GiB, TP 8, 0.85: weights/NPU 16.06 GiB; usable 54.40 GiB; reserve 2 GiB; KV budget 36.34 GiB
#     KV/token/NPU = 2 * 80 layers * (8/8) heads * 128 * 2 B = 40,960 B
#     tokens = 36.34 GiB / 40,960 B = 952,6xx; sequences of 2048 = 465
#   4 x 32 GiB, TP 4: weights/NPU 32.12 GiB > usable 27.20 GiB -> cannot fit
HAND = {"params": 68_976_648_192, "weights_per_npu_8": 16.06 * GIB, "usable_8": 54.40 * GIB,
        "kv_token_8": 40_960, "kv_budget_8": 36.34 * GIB, "seqs_8": 465,
        "weights_per_npu_4": 32.12 * GIB, "usable_4": 27.20 * GIB}


def _close(actual, expected, rel=0.02):
    assert abs(actual - expected) <= rel * abs(expected), (actual, expected)


def test_llama2_70b_fp16_fits_on_8x64g_within_2pct_of_the_hand_calculation():
    plan = memplan.plan_model(LLAMA70B, "vllm", FLAGS_8, 8, 65536 * 1024 * 1024)
    assert plan["params"] == HAND["params"]
    assert plan["fits"] and plan["full_concurrency"]
    _close(plan["weights_per_npu_bytes"], HAND["weights_per_npu_8"])
    _close(plan["usable_bytes"], HAND["usable_8"])
    assert plan["kv_bytes_per_token"] == HAND["kv_token_8"]
    _close(plan["kv_budget_bytes"], HAND["kv_budget_8"])
    _close(plan["seqs_at_max_len"], HAND["seqs_8"])


def test_llama2_70b_fp16_is_refused_on_4x32g_with_numbers_and_the_nearest_fix():
    flags = {**FLAGS_8, "--tensor-parallel-size": 4}
    plan = memplan.plan_model(LLAMA70B, "vllm", flags, 4, 32768 * 1024 * 1024, name="article")
    assert not plan["fits"]
    _close(plan["weights_per_npu_bytes"], HAND["weights_per_npu_4"])
    _close(plan["usable_bytes"], HAND["usable_4"])
    message = plan["message"]
    assert message.startswith("article: does not fit. Per NPU: usable 27.2 GiB (32.0 GiB x 0.85), weights 32.12 GiB")
    assert "more NPUs: tensor parallel 8" in message
    assert "quantisation: 8-bit weights" in message


def test_kv_heads_are_replicated_when_fewer_than_tp():
    shape = memplan.model_shape(LLAMA70B)
    assert memplan.kv_bytes_per_token(shape, 16, 2) == 2 * 80 * 1 * 128 * 2  # 8 KV heads < TP 16
    assert memplan.kv_bytes_per_token(shape, 2, 2) == 2 * 80 * 4 * 128 * 2


def test_published_parameter_counts_of_the_article_models():
    counts = {m: memplan.param_count(memplan.model_shape(planner.model_config(m)))
              for m in ("llama-2-70b-chat-hf", "mistral-7b-instruct-v0.2", "codellama-13b-instruct-hf")}
    assert counts == {"llama-2-70b-chat-hf": 68_976_648_192, "mistral-7b-instruct-v0.2": 7_241_732_096,
                      "codellama-13b-instruct-hf": 13_016_028_160}


def _write_shards(model_dir: Path, config: dict, shards: int = 3) -> int:
    """Llama-shaped safetensors files holding headers only (sparse: the tensor bytes are a hole)."""
    shape = memplan.model_shape(config)
    h, hd, kv, inter, vocab = shape["hidden"], shape["head_dim"], shape["kv_heads"], shape["intermediate"], \
        shape["vocab"]
    tensors = [("model.embed_tokens.weight", [vocab, h])]
    for i in range(shape["layers"]):
        p = f"model.layers.{i}."
        tensors += [(p + "self_attn.q_proj.weight", [shape["heads"] * hd, h]), (p + "self_attn.k_proj.weight",
                    [kv * hd, h]), (p + "self_attn.v_proj.weight", [kv * hd, h]),
                    (p + "self_attn.o_proj.weight", [h, shape["heads"] * hd]), (p + "mlp.gate_proj.weight",
                    [inter, h]), (p + "mlp.up_proj.weight", [inter, h]), (p + "mlp.down_proj.weight", [h, inter]),
                    (p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h])]
    tensors += [("model.norm.weight", [h]), ("lm_head.weight", [vocab, h])]
    total = 0
    for n in range(shards):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dims in tensors[n::shards]:
            size = 2
            for d in dims:
                size *= d
            header[name] = {"dtype": "F16", "shape": dims, "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header).encode()
        path = model_dir / f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        with open(path, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(8 + len(raw) + offset)
        total += offset
    return total


def test_safetensors_headers_give_the_exact_weight_bytes(tmp_path):
    expected = _write_shards(tmp_path, LLAMA70B)
    found = memplan.safetensors_weight_bytes(str(tmp_path))
    assert found["bytes"] == expected == HAND["params"] * 2
    assert found["tensors"] == 80 * 9 + 3 and found["dtypes"] == {"F16": expected}
    plan = memplan.plan_model(LLAMA70B, "vllm", FLAGS_8, 8, 64 * GIB, found["bytes"])
    assert plan["weight_bytes"] == expected and plan["fits"]


def test_a_file_that_is_not_safetensors_is_named(tmp_path):
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(memplan.PlanError, match="model.safetensors: safetensors header is not JSON"):
        memplan.safetensors_weight_bytes(str(tmp_path))


def test_tp_must_divide_the_heads():
    with pytest.raises(memplan.PlanError, match="tensor parallel size 3 does not divide 64"):
        memplan.plan_model(LLAMA70B, "vllm", {**FLAGS_8, "--tensor-parallel-size": 3}, 8, 64 * GIB)


def test_sglang_flags_are_read_by_their_sglang_names():
    flags = {"--tp-size": 8, "--dtype": "float16", "--context-length": 2048, "--max-running-requests": 10,
             "--mem-fraction-static": 0.85}
    assert memplan.profile_inputs("sglang", flags) == (8, "float16", 2048, 10, 0.85)


def test_capacity_table_of_the_shipped_profiles():
    rows = {r.profile: r for r in (planner.plan_profile(n, dirs=LAB_DIRS) for n in planner.profile_names(LAB_DIRS))}
    assert not rows["vllm-ascend-0.11.0-llama2-70b-chat-4x32g"].plan["fits"]
    assert not rows["sglang-0.5.6-llama2-70b-chat-4x32g"].plan["fits"]
    assert not rows["sglang-0.5.23-llama2-70b-chat-4x32g"].plan["fits"]
    refused = {n for n, r in rows.items() if r.plan and not r.plan["fits"]}
    assert refused == {"vllm-ascend-0.11.0-llama2-70b-chat-4x32g", "sglang-0.5.6-llama2-70b-chat-4x32g",
                       "sglang-0.5.23-llama2-70b-chat-4x32g"}
    assert rows["lab-vllm-cpu-tiny"].skipped
    lines = planner.capacity_table(list(rows.values()))
    assert lines[0].split()[:3] == ["PROFILE", "NPUs", "TP"]
    assert any("llama2-70b-chat-4x32g" in line and "REFUSED" in line for line in lines)


def test_cli_plan_exits_1_and_explains_the_refusal():
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "config", "plan",
                           "vllm-ascend-0.11.0-llama2-70b-chat-4x32g", "vllm-ascend-0.11.0-llama2-70b-chat-8x64g"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert "465@2048" in proc.stdout
    assert "does not fit" in proc.stderr and "more NPUs" in proc.stderr


def test_cli_plan_reads_a_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA70B))
    _write_shards(tmp_path, LLAMA70B, shards=2)
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "config", "plan", "--json", "--model-dir",
                           str(tmp_path), "vllm-ascend-0.11.0-llama2-70b-chat-8x64g"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["weight_source"] == "safetensors headers"
