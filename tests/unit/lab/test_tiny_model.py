"""The tiny Llama generator: real formats, consistent shapes, byte-determinism, checksum lists."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jinja2
import numpy as np
import pytest
from safetensors import deserialize
from tokenizers import Tokenizer

from atlasctl.errors import UsageError
from atlaslab.doubles import tiny_model
from atlaslab.doubles.tiny_model import SHARD_NAMES, create_tiny_llama

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    *SHARD_NAMES,
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_tiny_llama(tmp_path_factory.mktemp("model") / "atlas-tiny-llama")


def _all_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def _tensors(directory: Path) -> dict[str, dict]:
    tensors: dict[str, dict] = {}
    for shard in SHARD_NAMES:
        for name, info in deserialize((directory / shard).read_bytes()):
            tensors[name] = {**info, "shard": shard}
    return tensors


def _json(directory: Path, name: str) -> dict:
    return json.loads((directory / name).read_text())


def test_writes_every_model_file_and_the_checksum_lists(model_dir: Path) -> None:
    assert {p.name for p in model_dir.iterdir()} == EXPECTED_FILES | {"md5sums.txt", "sha256sums.txt"}


def test_same_seed_gives_identical_bytes(model_dir: Path, tmp_path: Path) -> None:
    again = create_tiny_llama(tmp_path / "again")
    assert _all_bytes(again) == _all_bytes(model_dir)


def test_another_seed_changes_the_weights_but_not_the_tokenizer(model_dir: Path, tmp_path: Path) -> None:
    other = create_tiny_llama(tmp_path / "other", seed=1)
    assert (other / SHARD_NAMES[0]).read_bytes() != (model_dir / SHARD_NAMES[0]).read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_rerun_leaves_files_untouched(tmp_path: Path) -> None:
    target = create_tiny_llama(tmp_path / "m")
    before = {p.name: p.stat().st_mtime_ns for p in target.iterdir()}
    create_tiny_llama(target)
    assert {p.name: p.stat().st_mtime_ns for p in target.iterdir()} == before


def test_rerun_repairs_a_corrupted_file(tmp_path: Path) -> None:
    target = create_tiny_llama(tmp_path / "m")
    good = (target / SHARD_NAMES[1]).read_bytes()
    (target / SHARD_NAMES[1]).write_bytes(b"garbage")
    create_tiny_llama(target)
    assert (target / SHARD_NAMES[1]).read_bytes() == good


def test_checksum_lists_verify_with_md5sum_and_sha256sum(model_dir: Path) -> None:
    for tool, listing in (("md5sum", "md5sums.txt"), ("sha256sum", "sha256sums.txt")):
        result = subprocess.run([tool, "-c", listing], cwd=model_dir, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        listed = {line.split("  ", 1)[1] for line in (model_dir / listing).read_text().splitlines()}
        assert listed == EXPECTED_FILES


def test_checksum_lists_have_md5sum_output_format(model_dir: Path) -> None:
    names = sorted(EXPECTED_FILES)
    printed = subprocess.run(["md5sum", *names], cwd=model_dir, capture_output=True, text=True, check=True)
    assert (model_dir / "md5sums.txt").read_text() == printed.stdout


def test_index_maps_every_tensor_to_its_shard_and_counts_its_bytes(model_dir: Path) -> None:
    index = _json(model_dir, "model.safetensors.index.json")
    tensors = _tensors(model_dir)
    assert index["weight_map"] == {name: info["shard"] for name, info in tensors.items()}
    assert index["metadata"]["total_size"] == sum(len(info["data"]) for info in tensors.values())
    assert {info["shard"] for info in tensors.values()} == set(SHARD_NAMES)


def test_tensor_shapes_follow_the_config(model_dir: Path) -> None:
    config = _json(model_dir, "config.json")
    tensors = _tensors(model_dir)
    hidden, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], hidden, heads, kv) == (2, 128, 4, 2)
    assert tensors["model.embed_tokens.weight"]["shape"] == [config["vocab_size"], hidden]
    assert tensors["lm_head.weight"]["shape"] == [config["vocab_size"], hidden]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        assert tensors[f"{prefix}.self_attn.q_proj.weight"]["shape"] == [heads * head_dim, hidden]
        assert tensors[f"{prefix}.self_attn.k_proj.weight"]["shape"] == [kv * head_dim, hidden]
        assert tensors[f"{prefix}.mlp.down_proj.weight"]["shape"] == [hidden, config["intermediate_size"]]
    assert {info["dtype"] for info in tensors.values()} == {"BF16"}  # the safetensors header spelling
    assert config["torch_dtype"] == "bfloat16"


def test_bfloat16_weights_decode_to_small_random_values_and_unit_norms(model_dir: Path) -> None:
    tensors = _tensors(model_dir)

    def as_float(name: str) -> np.ndarray:
        bits = np.frombuffer(bytes(tensors[name]["data"]), dtype="<u2").astype("<u4") << 16
        return bits.view("<f4")

    embed = as_float("model.embed_tokens.weight")
    assert 0.015 < float(embed.std()) < 0.025
    assert np.all(as_float("model.norm.weight") == 1.0)


def test_bfloat16_conversion_rounds_to_nearest() -> None:
    half = tiny_model.to_half(np.array([1.0, -2.5, 0.1, 3.0e38], dtype=np.float32), "bfloat16")
    back = (half.astype("<u4") << 16).view("<f4")
    assert back[:2].tolist() == [1.0, -2.5]
    assert abs(back[2] - 0.1) < 0.001
    assert np.isfinite(back[3])


def test_float16_variant_loads_with_safetensors_numpy(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    target = create_tiny_llama(tmp_path / "f16", dtype="float16")
    weights = load_file(target / SHARD_NAMES[1])
    assert weights["model.norm.weight"].dtype == np.float16
    assert _json(target, "config.json")["torch_dtype"] == "float16"


def test_unknown_dtype_is_refused_with_the_choices() -> None:
    with pytest.raises(UsageError, match="float32") as caught:
        create_tiny_llama(Path("/nonexistent/never-written"), dtype="float32")
    assert "bfloat16" in (caught.value.fix or "")


def test_tokenizer_roundtrips_bank_text_and_prepends_bos(model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = _json(model_dir, "config.json")
    text = "Please block my card, I lost it in Zürich!"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == config["bos_token_id"] == tokenizer.token_to_id(tiny_model.BOS)
    assert tokenizer.decode(encoding.ids, skip_special_tokens=True) == text
    assert 256 < tokenizer.get_vocab_size() == config["vocab_size"] <= 1024
    # merges learnt from the corpus make common words cheaper than bytes
    assert len(tokenizer.encode("account", add_special_tokens=False).ids) <= 2


def test_chat_template_renders_chatml_with_generation_prompt(model_dir: Path) -> None:
    tok_config = _json(model_dir, "tokenizer_config.json")
    template = jinja2.Environment().from_string(tok_config["chat_template"])
    text = template.render(
        messages=[{"role": "user", "content": "Hi"}], add_generation_prompt=True, bos_token=tok_config["bos_token"]
    )
    assert text == "<|begin_of_text|><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert tok_config["eos_token"] == "<|im_end|>"
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.token_to_id("<|im_end|>") in ids


def test_generation_config_stops_on_both_end_tokens(model_dir: Path) -> None:
    generation = _json(model_dir, "generation_config.json")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert generation["eos_token_id"] == [tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|im_end|>")]
