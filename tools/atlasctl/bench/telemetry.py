"""NPU telemetry during a benchmark: ``npu-smi info`` sampled every few seconds on the node.

The command is given by the user (``npu-smi info`` on the node itself, ``ssh root@NODE npu-smi info``
from the controller) and parsed by the collection's defensive ``npu_smi`` module_utils parser, so the
figures are the ones the health stage reads: AICore utilisation % and HBM used/total MB per chip.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from dataclasses import dataclass, field


def _parser():
    from ansible_collections.atlas.serving.plugins.module_utils import npu_smi

    return npu_smi


def sample_from_text(text: str, t_s: float) -> dict:
    """One sample: {'t', 'util_pct' (mean AICore over chips), 'hbm_used_mb', 'hbm_total_mb', 'health'}."""
    devices = _parser().parse_info(text)["devices"]
    if not devices:
        raise ValueError("npu-smi printed no NPU rows")
    utils = [d["aicore_pct"] for d in devices if d.get("aicore_pct") is not None]
    used = sum(d.get("hbm_used_mb") or 0 for d in devices)
    total = sum(d.get("hbm_total_mb") or 0 for d in devices)
    return {
        "t": round(t_s, 3),
        "util_pct": round(sum(utils) / len(utils), 1) if utils else None,
        "hbm_used_mb": used,
        "hbm_total_mb": total,
        "hbm_pct": round(100.0 * used / total, 1) if total else None,
        "health": sorted({str(d.get("health")) for d in devices}),
        "chips": len(devices),
    }


@dataclass
class Sampler:
    command: str
    interval_s: float = 2.0
    timeout_s: float = 10.0
    samples: list[dict] = field(default_factory=list)
    error: str = ""

    async def run(self, t0_ns: int, stop: asyncio.Event) -> None:
        argv = shlex.split(self.command)
        while not stop.is_set():
            try:
                text = await self._once(argv)
                self.samples.append(sample_from_text(text, (time.perf_counter_ns() - t0_ns) / 1e9))
            except (OSError, ValueError, TimeoutError) as exc:
                self.error = f"`{self.command}`: {exc}"
                return  # one clear error, no retries flooding the node
            try:
                await asyncio.wait_for(stop.wait(), self.interval_s)
            except TimeoutError:
                pass

    async def _once(self, argv: list[str]) -> str:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise ValueError(f"exit {proc.returncode}: {err.decode(errors='replace').strip()[:300]}")
        return out.decode(errors="replace")

    def summary(self) -> dict:
        utils = [s["util_pct"] for s in self.samples if s["util_pct"] is not None]
        hbm = [s["hbm_pct"] for s in self.samples if s["hbm_pct"] is not None]
        return {
            "command": self.command,
            "samples": len(self.samples),
            "util_pct_mean": round(sum(utils) / len(utils), 1) if utils else None,
            "util_pct_max": max(utils) if utils else None,
            "hbm_pct_max": max(hbm) if hbm else None,
            "hbm_used_mb_max": max((s["hbm_used_mb"] for s in self.samples), default=None),
            "error": self.error,
        }
