"""`atlasctl bench`: an SLO benchmark for OpenAI-compatible LLM endpoints (vLLM, SGLang).

The rollout gate calls::

    from atlasctl.bench import BenchConfig, SLO, run_bench
    result = run_bench(BenchConfig(url="http://10.77.0.11:8000", concurrency=10, num_requests=50))
    violations = result.meets(SLO(e2el_ms=300, min_output_tps=30))   # [] when the SLO is met

Figures follow `vllm bench serve` definitions (see :data:`atlasctl.bench.core.DEFINITIONS`).
"""

from atlasctl.bench.core import DEFINITIONS, SLO, BenchConfig, BenchResult, run_bench

__all__ = ["DEFINITIONS", "SLO", "BenchConfig", "BenchResult", "run_bench"]
