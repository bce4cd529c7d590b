"""``/metrics`` in the Prometheus text format SGLang 0.5.6 serves (prometheus_client, multiprocess mode).

Labels as in the release: scheduler gauges carry ``model_name, engine_type, tp_rank, pp_rank``
(SchedulerMetricsCollector); tokenizer counters and histograms carry ``model_name``
(TokenizerMetricsCollector). In multiprocess mode every family's HELP reads "Multiprocess metric".
"""

from __future__ import annotations

from sglang._atlas_standin.engine import Engine, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HELP = "Multiprocess metric"


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _family(name: str, kind: str, samples: list[str]) -> list[str]:
    return [f"# HELP {name} {HELP}", f"# TYPE {name} {kind}", *samples]


def _gauge(name: str, labels: dict[str, str], value: float) -> list[str]:
    return _family(name, "gauge", [f"{name}{_labels(labels)} {_num(value)}"])


def _counter(name: str, labels: dict[str, str], value: float) -> list[str]:
    return _family(name, "counter", [f"{name}{_labels(labels)} {_num(value)}"])


def _histogram(name: str, labels: dict[str, str], hist: Histogram) -> list[str]:
    samples = []
    for bound, count in zip(hist.buckets, hist.counts, strict=True):
        samples.append(f"{name}_bucket{_labels({**labels, 'le': _num(bound)})} {_num(count)}")
    samples.append(f"{name}_bucket{_labels({**labels, 'le': '+Inf'})} {_num(hist.total)}")
    samples.append(f"{name}_count{_labels(labels)} {_num(hist.total)}")
    samples.append(f"{name}_sum{_labels(labels)} {_num(hist.sum)}")
    return _family(name, "histogram", samples)


def render(engine: Engine, served_model_name: str, tp_rank: int = 0, pp_rank: int = 0) -> str:
    sched = {"model_name": served_model_name, "engine_type": "unified", "tp_rank": str(tp_rank),
             "pp_rank": str(pp_rank)}
    tok = {"model_name": served_model_name}
    stats = engine.stats
    lines: list[str] = []
    lines += _gauge("sglang:num_running_reqs", sched, engine.running)
    lines += _gauge("sglang:num_used_tokens", sched, engine.used_tokens)
    lines += _gauge("sglang:token_usage", sched, engine.token_usage())
    lines += _gauge("sglang:gen_throughput", sched, engine.gen_throughput())
    lines += _gauge("sglang:num_queue_reqs", sched, engine.queued)
    lines += _gauge("sglang:cache_hit_rate", sched, stats.last_cache_hit_rate)
    lines += _gauge("sglang:max_total_num_tokens", sched, engine.max_total_num_tokens)
    lines += _gauge("sglang:is_cuda_graph", sched, 0)
    lines += _counter("sglang:prompt_tokens_total", tok, stats.prompt_tokens)
    lines += _counter("sglang:generation_tokens_total", tok, stats.generation_tokens)
    lines += _counter("sglang:cached_tokens_total", tok, stats.cached_tokens)
    lines += _counter("sglang:num_requests_total", tok, stats.requests)
    lines += _counter("sglang:num_aborted_requests_total", tok, stats.aborted)
    lines += _histogram("sglang:time_to_first_token_seconds", tok, stats.ttft)
    lines += _histogram("sglang:inter_token_latency_seconds", tok, stats.itl)
    lines += _histogram("sglang:e2e_request_latency_seconds", tok, stats.e2e)
    return "\n".join(lines) + "\n"
