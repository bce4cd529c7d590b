# Copyright: the atlas.serving authors. GNU General Public License v3.0+
"""NPU memory plan of a serving profile: does the model fit, and how many sequences of max length.

Standard library only. Inputs: the model's ``config.json`` (layers, hidden size, heads, KV heads,
vocabulary, intermediate size), the exact weight bytes from the safetensors headers when the weights
are at hand (8-byte little-endian header length + JSON header; no tensor is read), else the
parameter count computed from the architecture times the dtype size.

The model (what is assumed, on purpose explicit):

* weights per NPU = total weight bytes / TP. vLLM and SGLang shard the embedding and lm_head by
  vocabulary across TP ranks; RMSNorm weights (a few KiB per layer) are replicated and ignored.
* KV bytes per token per NPU = 2 (K and V) x layers x KV heads per rank x head_dim x KV dtype bytes,
  KV heads per rank = kv_heads / TP when kv_heads >= TP, else 1 (replicated).
* usable HBM per NPU = HBM x utilisation (``--gpu-memory-utilization`` / ``--mem-fraction-static``).
* reserve per NPU = activations, workspace, HCCL buffers, graph memory: an explicit parameter
  (``reserve_gib``, default 2 GiB); the engines measure it at start-up, the planner cannot.
* KV budget = usable - weights - reserve; tokens = budget / KV bytes per token; sequences of max length
  = tokens // max_model_len. A plan fits when the weights and reserve fit and at least one sequence of
  max model length fits (the engines refuse to start otherwise).
"""

from __future__ import annotations

import json
import os
import struct

GIB = 1024**3
DTYPE_BYTES = {"float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "float32": 4, "float": 4,
               "fp32": 4, "int8": 1, "w8a8": 1, "int4": 0.5, "w4a16": 0.5}
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                           "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
DEFAULT_RESERVE_GIB = 2.0
HEADER_MAX = 100 * 1024 * 1024


class PlanError(Exception):
    """An input the planner cannot use (names the file or field and the fix)."""


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


def _tensor_bytes(path, key, info):
    """(dtype, bytes) of one header entry: {dtype, shape, data_offsets: [begin, end]}."""
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] or not isinstance(info.get("dtype"), str)):
        raise PlanError(f"{path}: tensor {key!r}: header entry needs dtype and data_offsets [begin, end]; "
                        "not a safetensors file?")
    return info["dtype"], offsets[1] - offsets[0]


def safetensors_weight_bytes(model_dir):
    """{'bytes', 'tensors', 'files', 'dtypes'} summed over every ``*.safetensors`` header in ``model_dir``."""
    try:
        files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    except OSError as exc:
        raise PlanError(f"{model_dir}: cannot list the model directory: {exc.strerror or exc}") from None
    total, tensors, dtypes = 0, 0, {}
    for name in files:
        path = os.path.join(model_dir, name)
        for key, info in read_safetensors_header(path).items():
            if key == "__metadata__":
                continue
            dtype, size = _tensor_bytes(path, key, info)
            total += size
            tensors += 1
            dtypes[dtype] = dtypes.get(dtype, 0) + size
    return {"bytes": total, "tensors": tensors, "files": files, "dtypes": dtypes}


def model_shape(config):
    """The fields the plan needs from a Hugging Face ``config.json`` dict (Llama/Mistral family)."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        shape = {
            "layers": int(config["num_hidden_layers"]),
            "hidden": hidden,
            "heads": heads,
            "kv_heads": int(config.get("num_key_value_heads") or heads),
            "head_dim": int(config.get("head_dim") or hidden // heads),
            "vocab": int(config["vocab_size"]),
            "intermediate": int(config["intermediate_size"]),
            "tied": bool(config.get("tie_word_embeddings", False)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"config.json lacks or garbles {exc}: the planner needs num_hidden_layers, hidden_size, "
                        "num_attention_heads, vocab_size, intermediate_size") from exc
    return shape


def param_count(shape):
    """Exact parameter count of a Llama-architecture decoder (q/k/v/o, gate/up/down, 2 norms per layer,
    embeddings, final norm, lm_head unless tied)."""
    h, hd = shape["hidden"], shape["head_dim"]
    attn = h * shape["heads"] * hd * 2 + h * shape["kv_heads"] * hd * 2
    layer = attn + 3 * h * shape["intermediate"] + 2 * h
    embeddings = shape["vocab"] * h * (1 if shape["tied"] else 2)
    return shape["layers"] * layer + embeddings + h


def kv_heads_per_rank(shape, tp):
    return shape["kv_heads"] // tp if shape["kv_heads"] >= tp else 1


def kv_bytes_per_token(shape, tp, kv_dtype_bytes):
    """Bytes of K and V one token occupies on one NPU."""
    return int(2 * shape["layers"] * kv_heads_per_rank(shape, tp) * shape["head_dim"] * kv_dtype_bytes)


def plan(shape, weight_bytes, tp, hbm_bytes, utilisation, max_model_len, max_num_seqs, kv_dtype_bytes=2,
         reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB)):
    """The memory plan of one NPU of a TP group (all ranks are alike). Byte figures are ints."""
    if tp < 1 or shape["heads"] % tp:
        raise PlanError(f"tensor parallel size {tp} does not divide {shape['heads']} attention heads; "
                        "use a divisor (1, 2, 4, 8, ...)")
    if not 0 < utilisation <= 1:
        raise PlanError(f"memory utilisation {utilisation} is not in (0, 1]")
    weights = int(weight_bytes) // tp
    usable = int(hbm_bytes * utilisation)
    per_token = kv_bytes_per_token(shape, tp, kv_dtype_bytes)
    budget = usable - weights - reserve_bytes
    tokens = max(budget, 0) // per_token
    seqs = tokens // max_model_len
    needed = per_token * max_model_len * max_num_seqs
    result = {
        "tp": tp,
        "hbm_bytes": int(hbm_bytes),
        "utilisation": utilisation,
        "usable_bytes": usable,
        "weights_per_npu_bytes": weights,
        "reserve_bytes": int(reserve_bytes),
        "kv_bytes_per_token": per_token,
        "kv_budget_bytes": budget,
        "kv_tokens": tokens,
        "max_model_len": max_model_len,
        "seqs_at_max_len": seqs,
        "max_num_seqs": max_num_seqs,
        "kv_needed_bytes": needed,
        "headroom_bytes": budget - needed,
        "fits": budget > 0 and seqs >= 1,
        "full_concurrency": seqs >= max_num_seqs,
    }
    return result


def nearest_fixes(shape, weight_bytes, weight_dtype_bytes, tp, hbm_bytes, utilisation, max_model_len,
                  max_num_seqs, kv_dtype_bytes=2, reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB)):
    """Changes that make a refused plan fit, nearest first: more NPUs of the same HBM, a shorter max model
    length, 8-bit weights. Each is a human sentence with the resulting figures."""
    fixes = []
    args = (utilisation, max_model_len, max_num_seqs, kv_dtype_bytes, reserve_bytes)
    for more in (2, 4, 8, 16, 32):
        if more > tp and shape["heads"] % more == 0:
            alt = plan(shape, weight_bytes, more, hbm_bytes, *args)
            if alt["fits"]:
                fixes.append(f"more NPUs: tensor parallel {more} x {gib(hbm_bytes)} GiB gives "
                             f"{gib(alt['weights_per_npu_bytes'])} GiB weights per NPU and "
                             f"{alt['seqs_at_max_len']} sequences of {max_model_len} tokens")
                break
    base = plan(shape, weight_bytes, tp, hbm_bytes, *args)
    if base["kv_budget_bytes"] > 0 and base["kv_tokens"] >= 128:
        shorter = base["kv_tokens"] // 128 * 128
        fixes.append(f"lower max model length: at most {shorter} tokens fit one sequence on this layout")
    int8 = weight_bytes * 1 // weight_dtype_bytes
    alt = plan(shape, int8, tp, hbm_bytes, *args)
    if alt["fits"]:
        fixes.append(f"quantisation: 8-bit weights (W8A8) give {gib(alt['weights_per_npu_bytes'])} GiB per NPU "
                     f"and {alt['seqs_at_max_len']} sequences of {max_model_len} tokens")
    return fixes


def gib(value):
    return round(value / GIB, 2)


def refusal(name, result, fixes):
    """One message that says why a plan cannot fit, with the numbers and the nearest fixes."""
    r = result
    why = (f"{name}: does not fit. Per NPU: usable {gib(r['usable_bytes'])} GiB "
           f"({gib(r['hbm_bytes'])} GiB x {r['utilisation']}), weights {gib(r['weights_per_npu_bytes'])} GiB "
           f"(TP {r['tp']}), reserve {gib(r['reserve_bytes'])} GiB, KV budget {gib(r['kv_budget_bytes'])} GiB "
           f"= {r['seqs_at_max_len']} sequences of {r['max_model_len']} tokens.")
    return why + (" Fix: " + "; or ".join(fixes) + "." if fixes else " No single change fits it.")


def profile_inputs(engine, flags):
    """(tp, dtype, max_model_len, max_num_seqs, utilisation) from a profile's flag dict."""
    names = {
        "vllm": ("--tensor-parallel-size", "--dtype", "--max-model-len", "--max-num-seqs",
                 "--gpu-memory-utilization", 0.9, 256),
        "sglang": ("--tp-size", "--dtype", "--context-length", "--max-running-requests",
                   "--mem-fraction-static", 0.88, 256),
    }
    if engine not in names:
        raise PlanError(f"engine {engine!r} has no plan inputs; expected vllm or sglang")
    tp, dtype, length, seqs, util, util_default, seqs_default = names[engine]
    max_len = flags.get(length)
    if max_len in (None, False):
        raise PlanError(f"the profile sets no {length}: the planner needs the max model length")
    return (int(flags.get(tp) or 1), str(flags.get(dtype) or "auto"), int(max_len),
            int(flags.get(seqs) or seqs_default), float(flags.get(util) or util_default))


def dtype_bytes(dtype, config):
    """Bytes per weight element: the flag's dtype, or the model's torch_dtype for ``auto``."""
    name = dtype if dtype != "auto" else str(config.get("torch_dtype") or "bfloat16")
    if name not in DTYPE_BYTES:
        raise PlanError(f"dtype {name!r} is not one the planner knows ({', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[name]


def plan_model(config, engine, flags, npu_count, hbm_bytes, weight_bytes=None,
               reserve_bytes=int(DEFAULT_RESERVE_GIB * GIB), name="profile"):
    """The plan of a profile (engine + flags) for a model config on ``npu_count`` x ``hbm_bytes`` NPUs.

    ``weight_bytes`` from :func:`safetensors_weight_bytes` when the files are at hand; otherwise the
    parameter count x the dtype size. The returned dict carries ``fixes`` and ``message`` when it does
    not fit."""
    shape = model_shape(config)
    tp, dtype, max_len, seqs, util = profile_inputs(engine, flags)
    if tp > npu_count:
        raise PlanError(f"{name}: tensor parallel {tp} needs {tp} NPUs, the host has {npu_count}")
    wbytes = dtype_bytes(dtype, config)
    source = "safetensors headers"
    if weight_bytes is None:
        weight_bytes = int(param_count(shape) * wbytes)
        source = "architecture parameter count x dtype"
    result = plan(shape, weight_bytes, tp, hbm_bytes, util, max_len, seqs, 2, reserve_bytes)
    result.update({"name": name, "engine": engine, "dtype": dtype, "npu_count": npu_count,
                   "weight_bytes": int(weight_bytes), "weight_source": source,
                   "params": param_count(shape)})
    if not result["fits"]:
        result["fixes"] = nearest_fixes(shape, weight_bytes, wbytes, tp, hbm_bytes, util, max_len, seqs, 2,
                                        reserve_bytes)
        result["message"] = refusal(name, result, result["fixes"])
    return result
