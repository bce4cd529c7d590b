"""Memory planner for multi-node instances: MoE total vs activated parameters, MLA's KV cache, W8A8
weights, TP x PP x DP across nodes, with hand-calculated figures (docs/memory-planner.md)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import memplan

from atlasctl import planner

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

GIB = 1024**3
DEEPSEEK = planner.model_config("deepseek-v3")
LLAMA70B = planner.model_config("llama-2-70b-chat-hf")
MODELS = {m: planner.model_config(m) for m in ("deepseek-v3", "llama-2-70b-chat-hf", "mistral-7b-instruct-v0.2",
                                               "codellama-13b-instruct-hf")}

# DeepSeek-V3 parameters from the architecture (61 layers, 3 dense, hidden 7168, 128 heads, MLA q_lora 1536,
# kv_lora 512, nope 128, rope 64, v 128; 256 routed + 1 shared experts of 2048, 8 per token, vocab 129280):
#   MLA per layer: q_a 7168*1536 + q_b 1536*128*192 + kv_a 7168*576 + kv_b 512*128*256 + o 16384*7168
#                  + norms 1536 + 512 = 187,107,328; 2 RMSNorms 14,336
#   dense MLP 3*7168*18432 = 396,361,728 (layers 0-2); MoE layer: experts 256*3*7168*2048 = 11,274,289,152,
#   shared 3*7168*2048 = 44,040,192, router 256*7168 + 256 (e_score_correction_bias) = 1,835,264
#   total = 3*(187,107,328+14,336+396,361,728) + 58*(187,107,328+14,336+11,274,289,152+44,040,192+1,835,264)
#           + 2*129280*7168 + 7168 = 671,026,419,200
#   activated: 8 of 256 routed experts, no input embedding (DeepSeek counts 36.6B "including 0.9B for the
#   output Head") = 36,625,618,432
# Tolerance: the published figures are rounded, 671B to 3 significant figures (+-0.5B) and 36.6B to 3
# (+-0.05B, which also rounds to the README's "37B"); the count must fall inside that rounding.
PUBLISHED = {"total": (671e9, 0.5e9), "activated": (36.6e9, 0.05e9)}

# vllm-ascend's DeepSeek recipe (DeepSeek-V3.1.md, 2 x Atlas 800 A2): DP 4 (2 per node) x TP 4,
# --enable-expert-parallel, --quantization ascend (W8A8), --gpu-memory-utilization 0.92.
DS_FLAGS = {"--tensor-parallel-size": 4, "--data-parallel-size": 4, "--data-parallel-size-local": 2,
            "--enable-expert-parallel": True, "--quantization": "ascend", "--max-model-len": 8192,
            "--max-num-seqs": 16, "--gpu-memory-utilization": 0.92}
# One node (8 NPUs): the same recipe at DP 2.
DS_FLAGS_ONE = {**DS_FLAGS, "--data-parallel-size": 2, "--data-parallel-size-local": 2}
# Hand calculation, W8A8 (int8 linears + per-channel scales: 12 B/row attention, 4 B/row MLP; bf16 embedding,
# lm_head, norms, router), per NPU:
#   routed experts 654,577,762,304 B over EP = TP*DP ranks, whole experts: 2 nodes 256/16 = 16 per NPU
#     = 40,911,110,144 B (38.10 GiB); 1 node 256/8 = 32 per NPU = 81,822,220,288 B (76.20 GiB)
#   replicated (vLLM: fused q_a/kv_a ReplicatedLinear, norms, router): q_a 672,737,280 + kv_a 252,276,480
#     + router 212,890,624 + norms 2,013,184 = 1,139,917,568 B (1.06 GiB)
#   / TP 4: q_b 580,165,632 + kv_b 261,849,088 + o 1,792,279,552 + dense MLP 297,403,392
#     + shared experts 639,236,096 + embedding 463,339,520 + lm_head 463,339,520 = 4,497,612,800 B (4.19 GiB)
#   2 nodes: 40,911,110,144 + 1,139,917,568 + 4,497,612,800 = 46,548,640,512 B = 43.35 GiB
#     usable int(64 GiB x 0.92) = 63,221,918,597 B (58.88 GiB); reserve 2 GiB
#     KV budget 63,221,918,597 - 46,548,640,512 - 2,147,483,648 = 14,525,794,437 B (13.53 GiB)
#     MLA KV/token = 61 x (512 + 64) x 2 B = 70,272 B on every rank -> 206,708 tokens
#     sequences of 8192 = 25 per DP replica, 4 replicas = 100 for the instance
#   1 node: 87,459,750,656 B = 81.45 GiB > 58.88 GiB usable: refused
DS_HAND = {"weights_2": 46_548_640_512, "weights_1": 87_459_750_656, "usable": 58.88 * GIB, "kv_token": 70_272,
           "tokens_2": 206_708, "seqs_2": 25, "instance_seqs_2": 100}

# Llama-2-70B fp16, TP 8 x PP 2 over two 8 x 64 GiB nodes, 0.85, 2048 tokens, 10 sequences:
#   PP 2 (vLLM get_pp_indices): 40 + 40 layers; per layer 855,654,400 params (16,384 of them RMSNorm, replicated)
#   stage 1 = 40 layers + final norm 8,192 + lm_head 32000*8192 = 262,144,000
#   TP-split params: 40*855,654,400 - 40*16,384 + 262,144,000 = 34,487,664,640 -> x 2 B / 8 = 8,621,916,160 B
#   replicated: (40*16,384 + 8,192) x 2 B = 1,327,104 B -> weights/NPU 8,623,243,264 B = 8.03 GiB
#   (stage 0: embedding instead of lm_head, no final norm: 8,623,226,880 B)
#   usable int(64 GiB x 0.85) = 58,411,555,225 B (54.40 GiB); budget - weights - 2 GiB = 47,640,828,313 B
#   KV/token/NPU = 2 x 40 layers x (8/8) heads x 128 x 2 B = 20,480 B -> 2,326,212 tokens -> 1135 x 2048
LLAMA_PP = {"--tensor-parallel-size": 8, "--pipeline-parallel-size": 2, "--dtype": "float16",
            "--max-model-len": 2048, "--max-num-seqs": 10, "--gpu-memory-utilization": 0.85}
LLAMA_HAND = {"weights": 8_623_243_264, "weights_stage0": 8_623_226_880, "usable": 58_411_555_225,
              "budget": 47_640_828_313, "kv_token": 20_480, "tokens": 2_326_212, "seqs": 1135}


def test_deepseek_v3_parameter_count_is_the_published_671b_total_and_36_6b_activated():
    shape = memplan.model_shape(DEEPSEEK)
    total, activated = memplan.param_count(shape), memplan.activated_param_count(shape)
    assert total == 671_026_419_200 and activated == 36_625_618_432
    for value, (published, tolerance) in ((total, PUBLISHED["total"]), (activated, PUBLISHED["activated"])):
        assert abs(value - published) <= tolerance, (value, published)
    assert round(activated / 1e9) == 37  # the README's "37B activated"


def test_deepseek_v3_w8a8_is_refused_on_one_atlas_800t_a2_with_the_reason_and_the_fix_2_nodes():
    plan = memplan.plan_model(DEEPSEEK, "vllm", DS_FLAGS_ONE, 8, 64 * GIB, name="deepseek-v3-w8a8")
    assert (plan["nodes"], plan["npus_needed"], plan["scheme"]) == (1, 8, "w8a8")
    assert not plan["fits"]
    assert plan["weights_per_npu_bytes"] == DS_HAND["weights_1"]
    assert plan["message"].startswith("deepseek-v3-w8a8: does not fit. Per NPU: usable 58.88 GiB "
                                      "(64.0 GiB x 0.92), weights 81.45 GiB (TP 4 x PP 1 x DP 2 with expert parallel)")
    assert plan["fixes"][0].startswith("2 nodes: TP 4 x PP 1 x DP 4 with expert parallel (16 NPUs of 64.0 GiB) "
                                       "gives 43.35 GiB weights per NPU")


def test_deepseek_v3_w8a8_tp8_on_one_node_is_refused_too():
    plan = memplan.plan_model(DEEPSEEK, "vllm", {**DS_FLAGS_ONE, "--tensor-parallel-size": 8,
                                                 "--data-parallel-size": 1, "--data-parallel-size-local": 1},
                              8, 64 * GIB)
    assert not plan["fits"] and memplan.gib(plan["weights_per_npu_bytes"]) > 58.88
    assert plan["fixes"][0].startswith("2 nodes: ")


def test_deepseek_v3_w8a8_is_accepted_on_two_atlas_800t_a2_with_the_hand_figures():
    plan = memplan.plan_model(DEEPSEEK, "vllm", DS_FLAGS, 8, 64 * GIB)
    assert plan["nodes"] == 2  # DP 4 / local DP 2
    assert plan["fits"] and plan["npus_needed"] == plan["npus_available"] == 16
    assert plan["weights_per_npu_bytes"] == DS_HAND["weights_2"]
    assert abs(plan["usable_bytes"] - DS_HAND["usable"]) < 0.01 * GIB
    assert plan["kv_bytes_per_token"] == DS_HAND["kv_token"]
    assert plan["kv_tokens"] == DS_HAND["tokens_2"]
    assert plan["seqs_at_max_len"] == DS_HAND["seqs_2"]
    assert plan["instance_seqs_at_max_len"] == DS_HAND["instance_seqs_2"]
    assert plan["params"] == 671_026_419_200 and plan["activated_params"] == 36_625_618_432


def test_a_layout_larger_than_its_nodes_is_refused_with_the_npu_count_and_the_node_fix():
    plan = memplan.plan_model(DEEPSEEK, "vllm", DS_FLAGS, 8, 64 * GIB, nodes=1)
    assert not plan["fits"] and plan["fits_memory"]
    assert "The layout TP 4 x PP 1 x DP 4 with expert parallel needs 16 NPUs; 1 node(s) x 8 NPUs give 8." \
        in plan["message"]
    assert plan["fixes"][0].startswith("2 nodes: TP 4 x PP 1 x DP 4 with expert parallel")


def test_llama2_70b_pp2_across_two_nodes_fits_with_the_hand_figures():
    plan = memplan.plan_model(LLAMA70B, "vllm", LLAMA_PP, 8, 64 * GIB, nodes=2)
    assert plan["fits"] and plan["full_concurrency"] and plan["npus_needed"] == 16
    assert [s["layers"] for s in plan["stages"]] == [[0, 40], [40, 80]]
    assert [s["weights_per_npu_bytes"] for s in plan["stages"]] == [LLAMA_HAND["weights_stage0"], LLAMA_HAND["weights"]]
    assert plan["weights_per_npu_bytes"] == LLAMA_HAND["weights"]
    assert plan["usable_bytes"] == LLAMA_HAND["usable"]
    assert plan["kv_budget_bytes"] == LLAMA_HAND["budget"]
    assert plan["kv_bytes_per_token"] == LLAMA_HAND["kv_token"]
    assert (plan["kv_tokens"], plan["seqs_at_max_len"]) == (LLAMA_HAND["tokens"], LLAMA_HAND["seqs"])


def test_llama2_70b_on_4x32g_gets_the_two_node_pp_fix_first():
    flags = {**LLAMA_PP, "--tensor-parallel-size": 4, "--pipeline-parallel-size": 1}
    plan = memplan.plan_model(LLAMA70B, "vllm", flags, 4, 32 * GIB)
    assert plan["fixes"][0].startswith("2 nodes: TP 4 x PP 2 x DP 1 (8 NPUs of 32.0 GiB) gives 16.06 GiB")
    assert memplan.plan_model(LLAMA70B, "vllm", {**flags, "--pipeline-parallel-size": 2}, 4, 32 * GIB, nodes=2)["fits"]


@pytest.mark.parametrize(("group", "params", "rows", "kind", "expected"), [
    ("experts (W8A8_DYNAMIC: int8 + bf16 scale and offset per row)", 100, 10, "mlp", 100 + 10 * 4),
    ("MLA / attention (W8A8 static: + int32 bias, fp32 deq_scale)", 100, 10, "attn", 100 + 10 * 12),
    ("embedding, lm_head, norms, router stay bf16", 100, 0, "float", 200),
])
def test_w8a8_bytes_of_each_tensor_kind(group, params, rows, kind, expected):
    assert memplan.group_bytes(params, rows, kind, "w8a8", 1) == expected, group
    assert memplan.group_bytes(params, rows, kind, "bf16", 2) == 2 * params


def test_which_deepseek_tensors_are_8_bit():
    shape = memplan.model_shape(DEEPSEEK)
    kinds = {g[0]: g[3] for g in memplan.layer_groups(shape, 3) + sum(memplan.outer_groups(shape), [])}
    assert {n for n, k in kinds.items() if k != "float"} == {
        "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "experts", "shared_experts"}
    assert {n for n, k in kinds.items() if k == "float"} == {
        "norms", "q_a_layernorm", "kv_a_layernorm", "router", "embed_tokens", "norm", "lm_head"}


@pytest.mark.parametrize(("layers", "pp", "parts"), [
    (61, 2, [31, 30]), (61, 4, [15, 15, 16, 15]), (80, 2, [40, 40]), (5, 3, [2, 2, 1]), (61, 1, [61])])
def test_pp_partition_is_vllms(layers, pp, parts):
    assert memplan.pp_partition(layers, pp) == parts


def test_pp_larger_than_the_layers_is_named():
    with pytest.raises(memplan.PlanError, match="pipeline parallel size 81 is not in"):
        memplan.pp_partition(80, 81)


@pytest.mark.parametrize(("engine", "flags", "expected"), [
    ("vllm", {"--tensor-parallel-size": 8}, {"tp": 8, "pp": 1, "dp": 1, "expert_parallel": False, "nodes": None,
                                             "scheme": None}),
    ("vllm", DS_FLAGS, {"tp": 4, "pp": 1, "dp": 4, "expert_parallel": True, "nodes": 2, "scheme": "w8a8"}),
    ("vllm", {"--tensor-parallel-size": 8, "--pipeline-parallel-size": 2, "--nnodes": 2},
     {"tp": 8, "pp": 2, "dp": 1, "expert_parallel": False, "nodes": 2, "scheme": None}),
    ("sglang", {"--tp-size": 16, "--nnodes": 2, "--ep-size": 16, "--quantization": "w8a8_int8"},
     {"tp": 16, "pp": 1, "dp": 1, "expert_parallel": True, "nodes": 2, "scheme": "w8a8"}),
    ("sglang", {"--tp-size": 16, "--dp-size": 16, "--enable-dp-attention": True},
     {"tp": 16, "pp": 1, "dp": 16, "expert_parallel": False, "dp_attention": True, "nodes": None, "scheme": None}),
])
def test_layout_from_the_engine_flags(engine, flags, expected):
    layout = memplan.profile_layout(engine, flags)
    assert {k: layout[k] for k in expected} == expected


def test_sglang_dp_attention_runs_inside_the_tp_group():
    layout = {"engine": "sglang", "tp": 16, "dp": 16, "dp_attention": True, "nodes": 2, "npus_per_node": 8}
    assert memplan.layout_npus(layout) == 16


def test_an_unknown_quantization_is_named():
    with pytest.raises(memplan.PlanError, match="--quantization awq: the planner knows ascend, w8a8_int8"):
        memplan.profile_layout("vllm", {"--quantization": "awq"})


def test_the_mtp_layer_in_the_headers_is_counted_apart(tmp_path):
    header = {"model.layers.60.mlp.gate.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
              "model.layers.61.eh_proj.weight": {"dtype": "BF16", "shape": [8], "data_offsets": [8, 24]},
              "lm_head.weight": {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]}}
    raw = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 28)
    found = memplan.safetensors_weight_bytes(str(tmp_path), 61)
    assert (found["bytes"], found["beyond_layers_bytes"]) == (28, 16)


def _max_stage_weights(model, layout, scheme):
    plan = memplan.plan_layout(memplan.model_shape(MODELS[model]), layout, 4096 * GIB, 0.9, 1, 1, scheme=scheme)
    return max(s["weights_per_npu_bytes"] for s in plan["stages"])


@settings(max_examples=60, deadline=None)
@given(model=st.sampled_from(sorted(MODELS)), tp=st.sampled_from([1, 2, 4, 8]), pp=st.integers(1, 4),
       dp=st.sampled_from([1, 2, 4]), ep=st.booleans(), scheme=st.sampled_from(["bf16", "w8a8"]),
       grow=st.sampled_from(["tp", "pp", "dp"]), factor=st.integers(2, 4))
def test_more_npus_never_make_the_weights_per_npu_larger(model, tp, pp, dp, ep, scheme, grow, factor):
    layout = {"tp": tp, "pp": pp, "dp": dp, "expert_parallel": ep}
    bigger = {**layout, grow: layout[grow] * factor}
    heads = memplan.model_shape(MODELS[model])["heads"]
    hypothesis.assume(heads % bigger["tp"] == 0)
    assert _max_stage_weights(model, bigger, scheme) <= _max_stage_weights(model, layout, scheme)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]), dp=st.sampled_from([1, 2, 4, 8]), ep=st.booleans())
def test_mla_kv_bytes_per_token_do_not_change_with_tp(tp, dp, ep):
    shape = memplan.model_shape(DEEPSEEK)
    assert memplan.kv_bytes_per_token(shape, tp, 2) == 61 * (512 + 64) * 2 == 70_272
    plan = memplan.plan_layout(shape, {"tp": tp, "dp": dp, "expert_parallel": ep}, 4096 * GIB, 0.9, 1, 1,
                               scheme="w8a8")
    assert plan["kv_bytes_per_token"] == 70_272


def test_cli_plan_takes_the_node_count_and_names_the_two_node_fix():
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "config", "plan", "--nodes", "1",
                           "vllm-ascend-0.11.0-llama2-70b-chat-4x32g"], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert proc.stdout.split()[:4] == ["PROFILE", "NPUs", "TP", "PPxDP"]
    assert "2 nodes: TP 4 x PP 2 x DP 1" in proc.stderr


def test_cli_plan_refuses_zero_nodes():
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "config", "plan", "--nodes", "0"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "--nodes 0: must be a positive whole number" in proc.stderr
