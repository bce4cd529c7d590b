"""The stand-in's own settings: environment variables ``ATLAS_STANDIN_*`` (lab knobs, never for a real engine).

| variable | default | effect |
|---|---|---|
| ATLAS_STANDIN_LOAD_SECONDS | 0 | "weight loading" before the port opens (connection refused meanwhile) |
| ATLAS_STANDIN_STARTUP_SECONDS | 1.0 | port open, ``/health`` and ``/health_generate`` answer 503 (warm-up) |
| ATLAS_STANDIN_TTFT_MS | 20 | prefill time of a request (time to first token, on an idle server) |
| ATLAS_STANDIN_ITL_MS | 10 | time per output token after the first |
| ATLAS_STANDIN_EOS_AFTER | 256 | the "model" emits EOS after this many tokens unless ``ignore_eos`` (0: never) |
| ATLAS_STANDIN_KV_TOKENS | 65536 | KV pool size in tokens (``max_total_num_tokens``, ``sglang:token_usage``) |
| ATLAS_STANDIN_MAX_RUNNING | 128 | running-request slots when ``--max-running-requests`` is not given |
| ATLAS_STANDIN_FAIL_HEALTH_FILE | unset | while this file exists, ``/health*`` answer 503 (fault injection) |
| ATLAS_STANDIN_SCHEMA | shipped | path of another schema JSON to build the command line from |
| ATLAS_STANDIN_DEV_DIR | /dev | where the NPU devices ``davinciN`` are that the scheduler holds open (``npu.py``) |
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number; unset it or give a number like {default}") from None


@dataclass(frozen=True)
class Knobs:
    load_seconds: float
    startup_seconds: float
    ttft_s: float
    itl_s: float
    eos_after: int
    kv_tokens: int
    max_running: int
    fail_health_file: str | None

    @classmethod
    def from_env(cls) -> Knobs:
        return cls(
            load_seconds=_float("ATLAS_STANDIN_LOAD_SECONDS", 0.0),
            startup_seconds=_float("ATLAS_STANDIN_STARTUP_SECONDS", 1.0),
            ttft_s=_float("ATLAS_STANDIN_TTFT_MS", 20.0) / 1000.0,
            itl_s=_float("ATLAS_STANDIN_ITL_MS", 10.0) / 1000.0,
            eos_after=int(_float("ATLAS_STANDIN_EOS_AFTER", 256)),
            kv_tokens=int(_float("ATLAS_STANDIN_KV_TOKENS", 65536)),
            max_running=int(_float("ATLAS_STANDIN_MAX_RUNNING", 128)),
            fail_health_file=os.environ.get("ATLAS_STANDIN_FAIL_HEALTH_FILE") or None,
        )
