"""Summary statistics as `vllm bench serve` computes them (numpy semantics, no numpy).

``percentile`` is numpy's default ``method='linear'`` (same as ``statistics.quantiles(...,
method='inclusive')``): with the sorted samples x[0..n-1], h = (n-1)*p/100 and the result is
x[floor(h)] + (h - floor(h)) * (x[floor(h)+1] - x[floor(h)]). ``std`` is the population standard
deviation (numpy ``ddof=0``). An empty sample gives 0 for everything, as vLLM's ``np.mean(x or 0)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES = (90.0, 95.0, 99.0)


def percentile(values: Sequence[float], p: float) -> float:
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} is outside 0..100")
    if not values:
        return 0.0
    xs = sorted(values)
    h = (len(xs) - 1) * p / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def std(values: Sequence[float]) -> float:
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / len(values))


def summary(values: Sequence[float], percentiles: Sequence[float] = PERCENTILES) -> dict[str, float]:
    """{'n', 'mean', 'median', 'std', 'min', 'max', 'p90', 'p95', 'p99'} of ``values``."""
    out = {
        "n": len(values),
        "mean": mean(values),
        "median": percentile(values, 50.0),
        "std": std(values),
        "min": min(values) if values else 0.0,
        "max": max(values) if values else 0.0,
    }
    for p in percentiles:
        out[pct_key(p)] = percentile(values, p)
    return out


def pct_key(p: float) -> str:
    return f"p{p:g}".replace(".", "_")


def histogram(values: Sequence[float], bins: int = 30) -> dict:
    """Equal-width bins between min and max: {'edges': [...], 'counts': [...]} (last bin closed)."""
    if not values:
        return {"edges": [], "counts": []}
    lo, hi = min(values), max(values)
    if hi <= lo:
        return {"edges": [lo, lo], "counts": [len(values)]}
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    return {"edges": [lo + i * width for i in range(bins + 1)], "counts": counts}
