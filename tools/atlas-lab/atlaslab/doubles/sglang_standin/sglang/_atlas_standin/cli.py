"""SGLang's argparse command line, rebuilt from the schema extracted from the real release."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

SCHEMA_NAME = "schema.json"
# The help text of --device names these; SGLang validates the value at run time, not with argparse.
DEVICES = ("cuda", "xpu", "hpu", "npu", "cpu")
TORCH_DEVICE_TYPES = ("cpu, cuda, ipu, xpu, mkldnn, opengl, opencl, ideep, hip, ve, fpga, maia, xla, lazy, "
                      "vulkan, mps, meta, hpu, mtia, privateuseone")
# ServerArgs.from_cli_args renames these argparse destinations to dataclass fields.
RENAMED = {"tensor_parallel_size": "tp_size", "pipeline_parallel_size": "pp_size",
           "data_parallel_size": "dp_size", "expert_parallel_size": "ep_size"}


class StartupError(Exception):
    """A failure SGLang reports as an uncaught exception (traceback, exit status 1)."""

    def __init__(self, exc_type: str, message: str):
        super().__init__(message)
        self.exc_type = exc_type


def schema_file() -> Path:
    """The schema shipped inside the wheel; ``ATLAS_STANDIN_SCHEMA`` overrides it."""
    override = os.environ.get("ATLAS_STANDIN_SCHEMA")
    if override:
        return Path(override)
    return Path(__file__).with_name(SCHEMA_NAME)


def load_schema() -> dict[str, Any]:
    return json.loads(schema_file().read_text(encoding="utf-8"))


def loads(value: str) -> Any:  # the name argparse prints: "invalid loads value"
    return json.loads(value)


def json_list_type(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list.") from None


def nullable_str(val: str) -> str | None:
    if not val or val == "None":
        return None
    return val


TYPES = {"str": str, "int": int, "float": float, "json": loads, "json_list": json_list_type,
         "nullable_str": nullable_str}


def _kwargs(flag: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": flag["dest"], "help": flag.get("help", "").replace("%", "%%")}
    action = flag["action"]
    if action in ("store_true", "store_false"):
        kwargs.update(action=action, default=flag["default"])
        return kwargs
    kwargs["type"] = TYPES.get(flag["type"], str)
    kwargs["default"] = flag.get("default")
    for key in ("nargs", "choices"):
        if flag.get(key) is not None:
            kwargs[key] = flag[key]
    if "const" in flag:
        kwargs["const"] = flag["const"]
    if flag.get("required"):
        kwargs["required"] = True
    return kwargs


def build_parser(schema: dict[str, Any]) -> argparse.ArgumentParser:
    """``argparse.ArgumentParser()`` with every flag of ``ServerArgs.add_cli_args``, as SGLang builds it."""
    parser = argparse.ArgumentParser()
    for flag in schema["flags"]:
        parser.add_argument(*flag["options"], **_kwargs(flag))
    return parser


def server_args(namespace: argparse.Namespace) -> dict[str, Any]:
    """The ServerArgs fields with SGLang's filled-in defaults (``_handle_missing_default_values``)."""
    args = {RENAMED.get(k, k): v for k, v in vars(namespace).items()}
    args["tokenizer_path"] = args.get("tokenizer_path") or args["model_path"]
    args["served_model_name"] = args.get("served_model_name") or args["model_path"]
    args["device"] = args.get("device") or "npu"
    return args


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise StartupError("RuntimeError", f"Expected one of {TORCH_DEVICE_TYPES} device type at start of "
                                           f"device string: {device}")


def read_model_config(model_path: str) -> dict[str, Any]:
    """config.json of a local model directory; fails with the errors transformers 4.57.1 raises."""
    path = Path(model_path)
    if not path.is_dir():
        raise StartupError("OSError", (
            f"Can't load the configuration of '{model_path}'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name. "
            f"Otherwise, make sure '{model_path}' is the correct path to a directory containing a config.json file"))
    config = path / "config.json"
    if not config.is_file():
        raise StartupError("ValueError", (
            f"Unrecognized model in {model_path}. Should have a `model_type` key in its config.json, or contain "
            "one of the following strings in its name: llama, mistral, qwen2, qwen3"))
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise StartupError("OSError", f"It looks like the config file at '{config}' is not a valid JSON file.") \
            from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise StartupError("ValueError", (
            f"Unrecognized model in {model_path}. Should have a `model_type` key in its config.json, or contain "
            "one of the following strings in its name: llama, mistral, qwen2, qwen3"))
    return data


def _load_yaml(text: str) -> Any:
    """SGLang reads the file with ``yaml.safe_load``; without PyYAML in the stand-in's venv the
    files the suite writes (JSON, which is YAML) still load."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return json.loads(text) if text.strip() else None
    return yaml.safe_load(text)


def merge_config_file(argv: list[str], store_true: set[str]) -> list[str]:
    """SGLang's ``--config FILE`` (ConfigArgumentMerger, sglang/srt/server_args_config_parser.py):
    the YAML mapping becomes ``--key value`` arguments placed before the command line's own
    (so the command line wins), in-process: the values never appear in the process list.
    Booleans: a store_true flag is added when true; other flags get ``true``/``false``.
    Lists: ``--key item...``; empty lists are dropped. Errors are SGLang's ValueErrors."""
    where = [i for i, arg in enumerate(argv) if arg == "--config"]
    if not where:
        return argv
    if len(where) > 1:
        raise StartupError("ValueError", "Multiple config files specified! Only one allowed.")
    index = where[0]
    if index == len(argv) - 1:
        raise StartupError("ValueError", "No config file specified after --config flag!")
    path = Path(argv[index + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise StartupError("ValueError", f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise StartupError("ValueError", f"Config file not found: {path}")
    data = _load_yaml(path.read_text(encoding="utf-8"))  # PermissionError, as SGLang, when unreadable
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise StartupError("ValueError", "Config file must contain a dictionary at root level")
    merged: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            if key in store_true:
                merged += [f"--{key}"] if value else []
            else:
                merged += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            merged += [f"--{key}", *map(str, value)] if value else []
        else:
            merged += [f"--{key}", str(value)]
    return merged + argv[:index] + argv[index + 2:]


def store_true_names(schema: dict[str, Any]) -> set[str]:
    """The option names (without ``--``) of the schema's store_true flags."""
    return {opt[2:] for flag in schema["flags"] if flag["action"] == "store_true"
            for opt in flag["options"] if opt.startswith("--")}
