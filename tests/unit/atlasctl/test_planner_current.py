"""The memory planner on the models banks serve on the current line: Qwen3-32B (dense, per-head q/k norms),
Qwen3-235B-A22B (Qwen3-MoE: 128 experts, no shared expert), DeepSeek-V3.x with its multi-token-prediction
layer; each figure below is worked by hand from the model's config.json and says where the totals come from."""

from __future__ import annotations

import json

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import memplan

from atlasctl import planner

GIB = 1024**3
HBM_64G = 65536 * 1024 * 1024


def _config(model: str) -> dict:
    return planner.model_config(model)


# Published totals: the Hugging Face API's safetensors parameter count of each repository
# (https://huggingface.co/api/models/Qwen/Qwen3-32B, revision 9216db5781bf21249d130ec9da846c4624c16137:
# {"BF16": 32762123264}; .../Qwen/Qwen3-235B-A22B: {"BF16": 235093634560}, 118 shards, index total_size
# 470,187,269,120 B = 2 B x the count). The architecture counts them exactly.
#   Qwen3-32B per layer: q, o 2 x 5120 x 64 x 128 + k, v 2 x 5120 x 8 x 128 + MLP 3 x 5120 x 25600
#     + 2 RMSNorms 2 x 5120 + q_norm, k_norm 2 x 128 = 487,598,336; x 64 layers + 2 x 151936 x 5120 + 5120
#   Qwen3-235B-A22B per layer: q, o 2 x 4096 x 64 x 128 + k, v 2 x 4096 x 4 x 128 + 128 experts x 3 x 4096 x 1536
#     + router 128 x 4096 + norms 2 x 4096 + q/k norms 2 x 128 = 2,487,755,008; x 94 + 2 x 151936 x 4096 + 4096
@pytest.mark.parametrize(("model", "params"), [("qwen3-32b", 32_762_123_264), ("qwen3-235b-a22b", 235_093_634_560)])
def test_qwen3_parameter_counts_are_the_published_safetensors_totals(model, params):
    assert memplan.param_count(memplan.model_shape(_config(model))) == params


def test_qwen3_235b_activates_22b():
    # "235B total parameters with 22B activated" (the release's own tutorial, Qwen3-235B-A22B.md section 1):
    # 8 of 128 experts; without the input-embedding lookup (the planner's convention, as DeepSeek's 36.6B)
    # 21,568,433,664, with it 22,190,763,520: 22B at the published rounding.
    shape = memplan.model_shape(_config("qwen3-235b-a22b"))
    activated = memplan.activated_param_count(shape)
    assert activated == 21_568_433_664
    assert round((activated + 151936 * 4096) / 1e9) == 22


def test_qwen3_moe_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    config = {**_config("qwen3-235b-a22b"), "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    shape = memplan.model_shape(config)
    assert [memplan.is_moe_layer(shape, i) for i in range(6)] == [False, False, False, True, False, True]
    assert all(memplan.is_moe_layer(memplan.model_shape(_config("qwen3-235b-a22b")), i) for i in range(94))


def _plan(name: str) -> dict:
    return planner.plan_profile(name).plan


def test_qwen3_32b_w8a8_tp4_on_atlas_800t_a2():
    # 64 layers x 2 (K, V) x 8 KV heads / TP 4 x 128 x 2 B = 65,536 B per token per NPU
    # weights per layer on one NPU: norms 20,480 + q (41,943,040 + 8,192 x 12) / 4 = 10,510,336 + k,v
    #   (10,485,760 + 2,048 x 12) x 2 / 8 = 2,627,584 + o (41,943,040 + 5,120 x 12) / 4 = 10,501,120 + q/k norms 512
    #   + MLP (393,216,000 + 56,320 x 4) / 4 = 98,360,320 = 122,020,352; x 64 + bf16 embedding and lm_head / 4
    #   (388,956,160 each) + norm 10,240 = 8,587,225,088 B = 8.00 GiB; usable 64 GiB x 0.9 = 57.6 GiB
    plan = _plan("vllm-ascend-0.23.0.post1-qwen3-32b-w8a8-8x64g")
    assert (plan["tp"], plan["pp"], plan["dp"], plan["scheme"]) == (4, 1, 1, "w8a8")
    assert plan["kv_bytes_per_token"] == 64 * 2 * 2 * 128 * 2 == 65_536
    assert plan["weights_per_npu_bytes"] == 8_587_225_088
    assert plan["usable_bytes"] == int(HBM_64G * 0.9)
    assert plan["seqs_at_max_len"] == (plan["usable_bytes"] - 8_587_225_088 - 2 * GIB) // 65_536 // 5500 == 141
    assert plan["fits"]


def test_qwen3_235b_w8a8_on_one_node_tp8_with_expert_parallel():
    # per layer on one NPU (TP 8, EP: 16 whole experts of 128):
    #   norms 16,384 + q (33,554,432 + 8,192 x 12) / 8 = 4,206,592 + k,v: 4 KV heads < TP 8, one per NPU,
    #   (4,194,304 + 1,024 x 12) / 4 = 1,051,648 + o (33,554,432 + 4,096 x 12) / 8 = 4,200,448 + q/k norms 512
    #   + experts (2,415,919,104 + 917,504 x 4) x 16 / 128 = 302,448,640 + router 1,048,576 = 312,972,800
    # x 94 + embedding and lm_head bf16 / 8 (155,582,464 each) + norm 8,192 = 29,730,616,320 B = 27.69 GiB
    # KV: 94 x 2 x 1 x 128 x 2 = 48,128 B per token; 64 GiB x 0.95 - 27.69 - 2 = 31.11 GiB: 5 x 131072 tokens
    plan = _plan("vllm-ascend-0.23.0.post1-qwen3-235b-a22b-w8a8-8x64g")
    assert (plan["tp"], plan["dp"], plan["expert_parallel"], plan["nodes"]) == (8, 1, True, 1)
    assert plan["weights_per_npu_bytes"] == 29_730_616_320
    assert plan["kv_bytes_per_token"] == 48_128
    assert round(plan["kv_budget_bytes"] / GIB, 2) == 31.11
    assert plan["seqs_at_max_len"] == 5 and plan["fits"] and not plan["full_concurrency"]


def test_qwen3_235b_w8a8_over_two_nodes_tp8_pp2():
    # 94 layers in two stages of 47; the first holds the embedding, the last the norm and lm_head, the same
    # bytes: (47 x 312,972,800 + 155,582,464) = 14,865,304,064 B = 13.84 GiB per NPU (stage 1 adds the norm);
    # KV 47 x 512 = 24,064 B per token; 64 GiB x 0.9 = 57.6 GiB usable
    plan = _plan("vllm-ascend-0.23.0.post1-qwen3-235b-a22b-w8a8-2x8x64g")
    assert (plan["tp"], plan["pp"], plan["nodes"], plan["npus_needed"]) == (8, 2, 2, 16)
    assert [st["layers"] for st in plan["stages"]] == [[0, 47], [47, 94]]
    assert plan["stages"][0]["weights_per_npu_bytes"] == 47 * 312_972_800 + 155_582_464
    assert plan["stages"][1]["weights_per_npu_bytes"] == 47 * 312_972_800 + 155_582_464 + 8_192
    assert plan["kv_bytes_per_token"] == 24_064
    assert plan["fits"] and plan["full_concurrency"]


def test_the_qwen3_235b_one_node_layout_is_refused_on_32g_npus_with_the_fix():
    # The tutorial's hardware table: 2 Atlas 800I A2 (32GB x 8) for the W8A8 weights; on one node of 32 GB
    # NPUs the 27.69 GiB of weights leave no KV budget, and the nearest fix is the second node.
    row = planner.plan_profile("vllm-ascend-0.23.0.post1-qwen3-235b-a22b-w8a8-8x64g", hbm_mb=32768)
    assert not row.plan["fits"]
    assert "Fix: 2 nodes:" in row.plan["message"]


def test_deepseek_v3_mtp_layer_adds_its_weights_and_its_kv_cache():
    # vllm-ascend's DeepSeek-V3.1 two-node recipe speculates with the model's MTP layer (num_nextn_predict_layers
    # 1: a MoE decoder layer, eh_proj 2 x 7168 x 7168, three norms; embedding and head shared with the model)
    with_mtp = _plan("vllm-ascend-0.23.0.post1-deepseek-v3-w8a8-2x8x64g")
    flags = {k: v for k, v in planner.load_profile("vllm-ascend-0.23.0.post1-deepseek-v3-w8a8-2x8x64g")["flags"].items()
             if not (isinstance(v, str) and "{{" in v) and k != "--speculative-config"}
    without = memplan.plan_model(_config("deepseek-v3"), "vllm", flags, 8, HBM_64G, nodes=2)
    assert with_mtp["mtp_layers"] == 1 and without["mtp_layers"] == 0
    assert without["kv_bytes_per_token"] == 61 * (512 + 64) * 2 == 70_272
    assert with_mtp["kv_bytes_per_token"] == 62 * (512 + 64) * 2 == 71_424
    shape = memplan.model_shape(_config("deepseek-v3"))
    layout = {"tp": 4, "dp": 4, "expert_parallel": True, "nodes": 2, "npus_per_node": 8}
    mtp = sum(memplan._placed(memplan.group_bytes(g[1], g[2], g[3], "w8a8", 1), g[4], g[3], shape,
                              memplan.normalise_layout(layout)) for g in memplan.mtp_groups(shape, 61))
    assert with_mtp["weights_per_npu_bytes"] - without["weights_per_npu_bytes"] == mtp
    assert round(mtp / GIB, 2) == 0.82  # 16 of 256 experts of the MTP layer, its attention / 4, eh_proj whole
    assert with_mtp["fits"] and with_mtp["seqs_at_max_len"] == 11


def test_mtp_bytes_from_the_headers_count_only_when_the_mtp_layer_runs():
    config = _config("deepseek-v3")
    flags = {"--tensor-parallel-size": 4, "--data-parallel-size": 4, "--data-parallel-size-local": 2,
             "--enable-expert-parallel": True, "--quantization": "ascend", "--max-model-len": 8192}
    plain = memplan.plan_model(config, "vllm", flags, 8, HBM_64G, weight_bytes=600 * GIB, mtp_bytes=10 * GIB)
    mtp = memplan.plan_model(config, "vllm", {**flags, "--speculative-config": json.dumps({"method": "mtp"})}, 8,
                             HBM_64G, weight_bytes=600 * GIB, mtp_bytes=10 * GIB)
    assert plain["weight_bytes"] == 600 * GIB and mtp["weight_bytes"] == 610 * GIB
    with pytest.raises(memplan.PlanError, match="--speculative-config 'mtp' is not JSON"):
        memplan.plan_model(config, "vllm", {**flags, "--speculative-config": "mtp"}, 8, HBM_64G)


def test_qwen3_32b_bf16_on_sglang_0_5_16_tp2():
    # SGLang's own minimum for the BF16 weights: TP 2. Per layer on one NPU, bf16: q, o 41,943,040 B each, k,v
    # (8 KV heads / 2) 10,485,760, MLP 393,216,000, norms 20,480, q/k norms 512 = 487,608,832; x 64 + embedding
    # and lm_head 777,912,320 each + norm 10,240 = 32,762,800,128 B = 30.51 GiB. KV: 64 x 2 x 4 x 128 x 2.
    plan = _plan("sglang-0.5.16-qwen3-32b-8x64g")
    assert (plan["engine"], plan["tp"], plan["scheme"]) == ("sglang", 2, "bf16")
    assert plan["weights_per_npu_bytes"] == 32_762_800_128
    assert plan["kv_bytes_per_token"] == 131_072
    assert plan["fits"] and plan["seqs_at_max_len"] == 4


def test_every_current_line_profile_plans_to_a_verdict():
    names = [n for n in planner.profile_names() if n.startswith(("vllm-ascend-0.23.0.post1-", "sglang-0.5.16-"))]
    assert len(names) == 8
    for name in names:
        row = planner.plan_profile(name)
        assert not row.skipped and row.plan["fits"] is True, (name, row.plan.get("message"))
