"""A tiny Llama in real Hugging Face formats, generated locally and byte-deterministically.

The lab serves it with the real vLLM (CPU build): two safetensors shards with an index, a byte-level BPE
tokenizer trained here on bank customer-service phrases, a chat template, generation config, and
``md5sums.txt`` / ``sha256sums.txt`` as ``md5sum`` / ``sha256sum`` print them. Only numpy, safetensors and
tokenizers are needed: no torch, no transformers, no hub. The same seed gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import TensorSpec, serialize
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from atlasctl.errors import UsageError

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, IM_START, IM_END, PAD)  # ids 0..4 in this order
SHARD_NAMES = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
SUM_FILES = ("md5sums.txt", "sha256sums.txt")
SUPPORTED_DTYPES = ("bfloat16", "float16")

# ChatML: what vLLM renders for /v1/chat/completions.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = (
    "Hello, thank you for calling the bank. How can I help you today?",
    "I would like to check the balance of my savings account.",
    "Your current account balance is available in the mobile app.",
    "I lost my debit card yesterday and I need to block it.",
    "Your card has been blocked. A new card will arrive within five working days.",
    "Can I increase the daily withdrawal limit on my card?",
    "Please confirm your date of birth and the last four digits of your card.",
    "I did not recognise a payment on my credit card statement.",
    "We have opened a dispute for the transaction and will contact you by email.",
    "How do I reset my online banking password?",
    "You can reset your password from the login page by choosing forgot password.",
    "What is the interest rate for a fixed term deposit of twelve months?",
    "The interest rate for a twelve month deposit is shown on our rates page.",
    "I want to transfer money to an account abroad.",
    "International transfers need the IBAN and the BIC of the receiving bank.",
    "Is there a fee for sending a transfer in another currency?",
    "A currency conversion fee applies; the exact amount is shown before you confirm.",
    "I would like to apply for a personal loan.",
    "Our loan advisor will call you to discuss the amount and the repayment period.",
    "When will my salary be credited to my account?",
    "Incoming payments are usually credited on the same business day.",
    "Please update my home address and my phone number.",
    "Your contact details have been updated. Is there anything else I can help with?",
    "My mortgage payment failed this month because of insufficient funds.",
    "We can schedule the missed mortgage payment for next week without a penalty.",
    "How do I activate contactless payments on my new card?",
    "Make one payment with your PIN and contactless payments will be activated.",
    "Thank you for your patience. Your request has been registered.",
    "For your security, never share your PIN or one time password with anyone.",
    "Our branches are open from nine to five, Monday to Friday.",
    "Can I open a joint account with my partner?",
    "Yes, both account holders need to bring a valid identity document to a branch.",
    "I want to close my account and move my savings to another bank.",
    "We are sorry to see you go. The closing balance will be transferred within two days.",
    "Have a nice day and thank you for banking with us.",
)


@dataclass(frozen=True)
class TinyLlamaShape:
    """Dimensions of the generated model; small enough for CPU serving in seconds."""

    num_hidden_layers: int = 2
    hidden_size: int = 128
    intermediate_size: int = 256
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    vocab_target: int = 512  # BPE training target; the trained vocabulary may be smaller

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# --- tokenizer ------------------------------------------------------------------------------------------


def train_tokenizer(shape: TinyLlamaShape) -> Tokenizer:
    """A byte-level BPE (any text encodes, no unknown token) trained on :data:`CORPUS`."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_target,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(CORPUS) * 4, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def _tokenizer_json(tokenizer: Tokenizer) -> bytes:
    # Re-serialize with sorted keys so that the file does not depend on the library's map ordering.
    return _json_bytes(json.loads(tokenizer.to_str()))


def _tokenizer_config(tokenizer: Tokenizer, shape: TinyLlamaShape) -> dict:
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": shape.max_position_embeddings,
        "pad_token": PAD,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


# --- weights --------------------------------------------------------------------------------------------


def _layer_shapes(shape: TinyLlamaShape, layer: int) -> list[tuple[str, tuple[int, ...]]]:
    hidden, inter, head = shape.hidden_size, shape.intermediate_size, shape.head_dim
    prefix = f"model.layers.{layer}"
    return [
        (f"{prefix}.input_layernorm.weight", (hidden,)),
        (f"{prefix}.self_attn.q_proj.weight", (shape.num_attention_heads * head, hidden)),
        (f"{prefix}.self_attn.k_proj.weight", (shape.num_key_value_heads * head, hidden)),
        (f"{prefix}.self_attn.v_proj.weight", (shape.num_key_value_heads * head, hidden)),
        (f"{prefix}.self_attn.o_proj.weight", (hidden, shape.num_attention_heads * head)),
        (f"{prefix}.post_attention_layernorm.weight", (hidden,)),
        (f"{prefix}.mlp.gate_proj.weight", (inter, hidden)),
        (f"{prefix}.mlp.up_proj.weight", (inter, hidden)),
        (f"{prefix}.mlp.down_proj.weight", (hidden, inter)),
    ]


def shard_layout(shape: TinyLlamaShape, vocab_size: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Tensor names and shapes per shard: embeddings and the first half of the layers, then the rest."""
    split = max(1, shape.num_hidden_layers // 2)
    first = [("model.embed_tokens.weight", (vocab_size, shape.hidden_size))]
    second: list[tuple[str, tuple[int, ...]]] = []
    for layer in range(shape.num_hidden_layers):
        (first if layer < split else second).extend(_layer_shapes(shape, layer))
    second += [
        ("model.norm.weight", (shape.hidden_size,)),
        ("lm_head.weight", (vocab_size, shape.hidden_size)),
    ]
    return [first, second]


def to_half(values: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian 16-bit storage of ``values``: float16, or bfloat16 bit patterns as uint16."""
    values = np.ascontiguousarray(values, dtype="<f4")
    if dtype == "float16":
        return values.astype("<f2")
    bits = values.view("<u4")  # bfloat16: round-to-nearest-even on the top 16 bits of float32
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.ascontiguousarray(rounded.astype("<u2"))


def _tensor_values(rng: np.random.Generator, name: str, dims: tuple[int, ...]) -> np.ndarray:
    if name.endswith("norm.weight"):
        return np.ones(dims, dtype=np.float32)
    return rng.normal(0.0, 0.02, size=dims).astype(np.float32)


def _shard_bytes(tensors: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator, dtype: str) -> bytes:
    arrays = {name: to_half(_tensor_values(rng, name, dims), dtype) for name, dims in tensors}
    specs = {
        name: TensorSpec(dtype=dtype, shape=array.shape, data_ptr=array.ctypes.data, data_len=array.nbytes)
        for name, array in arrays.items()
    }
    return bytes(serialize(specs, metadata={"format": "pt"}))  # `arrays` keeps the buffers alive until here


# --- files ----------------------------------------------------------------------------------------------


def _json_bytes(document: object) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _model_config(
    shape: TinyLlamaShape, vocab_size: int, tokenizer: Tokenizer, dtype: str, name: str
) -> dict:
    return {
        "_name_or_path": name,
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": [tokenizer.token_to_id(EOS), tokenizer.token_to_id(IM_END)],
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "pad_token_id": tokenizer.token_to_id(PAD),
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "use_cache": True,
        "vocab_size": vocab_size,
    }


def _generation_config(tokenizer: Tokenizer) -> dict:
    return {
        "bos_token_id": tokenizer.token_to_id(BOS),
        "do_sample": True,
        "eos_token_id": [tokenizer.token_to_id(EOS), tokenizer.token_to_id(IM_END)],
        "pad_token_id": tokenizer.token_to_id(PAD),
        "temperature": 0.7,
        "top_p": 0.9,
    }


def model_files(seed: int, name: str, dtype: str, shape: TinyLlamaShape) -> Iterator[tuple[str, bytes]]:
    """Every model file (relative name, bytes) except the checksum lists."""
    tokenizer = train_tokenizer(shape)
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    rng = np.random.default_rng(seed)
    weight_map: dict[str, str] = {}
    total = 0
    for shard_name, tensors in zip(SHARD_NAMES, shard_layout(shape, vocab_size), strict=True):
        data = _shard_bytes(tensors, rng, dtype)
        weight_map.update({tensor: shard_name for tensor, _ in tensors})
        total += sum(int(np.prod(dims)) * 2 for _, dims in tensors)
        yield shard_name, data
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    yield "model.safetensors.index.json", _json_bytes(index)
    yield "config.json", _json_bytes(_model_config(shape, vocab_size, tokenizer, dtype, name))
    yield "generation_config.json", _json_bytes(_generation_config(tokenizer))
    yield "tokenizer.json", _tokenizer_json(tokenizer)
    yield "tokenizer_config.json", _json_bytes(_tokenizer_config(tokenizer, shape))
    special_map = {"bos_token": BOS, "eos_token": IM_END, "pad_token": PAD}
    yield "special_tokens_map.json", _json_bytes(special_map)


def checksum_lines(files: dict[str, bytes], algorithm: Callable[[bytes], hashlib._Hash]) -> bytes:
    """``<hex>  <path>`` lines, sorted by path: what md5sum/sha256sum print for these files."""
    return "".join(f"{algorithm(files[path]).hexdigest()}  {path}\n" for path in sorted(files)).encode()


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.is_file() and path.read_bytes() == data:
        return
    partial = path.with_name(f".{path.name}.part")
    partial.write_bytes(data)
    os.chmod(partial, 0o644)
    partial.replace(path)


def create_tiny_llama(
    out_dir: Path, *, seed: int = 0, name: str = "atlas-tiny-llama", dtype: str = "bfloat16"
) -> Path:
    """Write the tiny Llama into ``out_dir`` (created if needed) and return it; same seed, same bytes.

    Files already holding the right bytes are left untouched, so re-runs change nothing.
    """
    if dtype not in SUPPORTED_DTYPES:
        raise UsageError(f"dtype {dtype!r} is not supported", fix=f"use one of {', '.join(SUPPORTED_DTYPES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = dict(model_files(seed, name, dtype, TinyLlamaShape()))
    files_with_sums = dict(files)
    files_with_sums["md5sums.txt"] = checksum_lines(files, hashlib.md5)
    files_with_sums["sha256sums.txt"] = checksum_lines(files, hashlib.sha256)
    for relative, data in files_with_sums.items():
        _write_if_changed(out_dir / relative, data)
    return out_dir
