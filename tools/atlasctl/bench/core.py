"""The load generator and its figures: ``run_bench(BenchConfig) -> BenchResult``.

Definitions (the same as `vllm bench serve`, vllm/benchmarks/serve.py):

* TTFT: from just before the request is written to the socket to the arrival of the first streamed
  chunk that carries generated text (prefill included).
* ITL: the gaps between consecutive token-bearing chunks of one request (all requests pooled).
* E2EL: from the request send to the arrival of the last token-bearing chunk.
* TPOT: per request (E2EL - TTFT) / (output_tokens - 1), only for requests with more than one token.
* output tokens: the server's ``usage.completion_tokens`` (asked for with
  ``stream_options.include_usage``); when the server sends no usage, the tokenizer's count of the
  generated text when a tokenizer is given, else the number of token chunks.
* request/output/total token throughput: completed requests, output tokens, prompt + output tokens
  divided by the measured duration (first measured send to the last measured completion).
* goodput: completed requests per second meeting every goodput threshold (TTFT, TPOT, E2EL), vLLM's
  ``--goodput`` semantics (a request with one token has TPOT 0).
* mean, median, std (population), p90, p95, p99: numpy's default linear interpolation.

Bounds: a run stops after ``num_requests`` measured requests or ``duration_s`` seconds, whichever
comes first; requests still in flight ``timeout_s`` after the deadline are cancelled and counted as
such. Warm-up requests run first and never enter the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from atlasctl.bench import stats
from atlasctl.bench.client import Exchange, HTTPError, Pool, SSEParser, Target, get_json
from atlasctl.bench.prompts import Prompt, TokenCounter, customer_service, synthetic
from atlasctl.bench.telemetry import Sampler
from atlasctl.errors import UsageError

METRICS = ("ttft", "tpot", "itl", "e2el")
REQUEST_FIELDS = ("start_s", "ttft_ms", "e2el_ms", "tpot_ms", "output_tokens", "prompt_tokens", "ok")
DEFINITIONS = {
    "ttft": "time to first token: request send to the first streamed chunk with generated text (prefill included)",
    "tpot": "time per output token: (E2EL - TTFT) / (output_tokens - 1) per request with > 1 token",
    "itl": "inter-token latency: gaps between consecutive streamed token chunks, all requests pooled",
    "e2el": "end-to-end latency: request send to the last streamed token chunk",
    "output_tokens": "server usage.completion_tokens (stream_options.include_usage); else tokenizer count, "
                     "else chunk count",
    "throughput": "completed requests / output tokens / prompt+output tokens over the measured duration",
    "goodput": "completed requests per second meeting every goodput threshold (vLLM --goodput semantics)",
    "percentiles": "numpy default linear interpolation (statistics.quantiles method='inclusive'); "
                   "std is the population standard deviation",
}


@dataclass
class SLO:
    """Thresholds for the rollout gate. Latencies are checked at ``percentile`` (50 = median)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    min_output_tps: float | None = None  # aggregate output tokens/s
    max_failed_pct: float | None = 0.0
    min_goodput_pct: float | None = None  # share of completed requests meeting the goodput thresholds
    max_hbm_pct: float | None = None  # from NPU telemetry; a violation when telemetry is missing
    percentile: float = 95.0

    @classmethod
    def deployment_guide(cls) -> SLO:
        """The deployment guide's bank SLO: end-to-end latency <= 300 ms, >= 30 tokens/s, HBM use <= 85 %."""
        return cls(e2el_ms=300.0, min_output_tps=30.0, max_hbm_pct=None)


@dataclass
class BenchConfig:
    url: str
    model: str | None = None  # None: the first id of GET /v1/models
    endpoint: str = "completions"  # or "chat"
    concurrency: int | None = 10  # closed loop when request_rate is None; cap otherwise
    request_rate: float | None = None  # Poisson arrivals (gamma when burstiness != 1)
    burstiness: float = 1.0
    num_requests: int = 100
    duration_s: float = 120.0
    warmup_requests: int = 2
    dataset: str = "customer-service"  # or "synthetic"
    input_len: int = 128
    output_len: int = 128
    tokenizer: str | None = None
    ignore_eos: bool = False
    api_key: str | None = None
    timeout_s: float = 60.0
    seed: int = 0
    goodput: dict[str, float] = field(default_factory=dict)  # {"ttft"|"tpot"|"e2el": ms}
    npu_smi: str | None = None
    npu_interval_s: float = 2.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    ca_file: str | None = None  # an https URL: the CA its certificate is checked against (None: the system's)

    def validate(self) -> None:
        checks = [
            (self.endpoint in ("completions", "chat"), f"endpoint {self.endpoint!r} is not completions or chat"),
            (self.num_requests >= 1, f"--num-requests {self.num_requests} must be at least 1"),
            (0 < self.duration_s < math.inf, f"--duration {self.duration_s} must be a positive number of seconds"),
            (self.warmup_requests >= 0, f"--warmup {self.warmup_requests} must be >= 0"),
            (self.concurrency is None or self.concurrency >= 1, f"--concurrency {self.concurrency} must be >= 1"),
            (self.request_rate is not None or self.concurrency is not None,
             "give --concurrency or --request-rate"),
            (self.request_rate is None or self.request_rate > 0, f"--request-rate {self.request_rate} must be > 0"),
            (self.burstiness > 0, f"--burstiness {self.burstiness} must be > 0"),
            (self.output_len >= 1, f"--output-len {self.output_len} must be >= 1"),
            (self.dataset in ("customer-service", "synthetic"), f"dataset {self.dataset!r} is unknown"),
            (set(self.goodput) <= set(("ttft", "tpot", "e2el")), f"goodput keys {sorted(self.goodput)} "
             "must be among ttft, tpot, e2el"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message, fix="see `atlasctl bench --help`")
        if self.dataset == "synthetic" and not self.tokenizer:
            raise UsageError("synthetic prompts of exact token counts need the model's tokenizer",
                             fix="pass --tokenizer MODEL_DIR (with tokenizer.json), or --dataset customer-service")


@dataclass
class RequestRecord:
    warmup: bool
    prompt_tokens: int | None
    sent: bool = False  # an attempt was made (connect, send); False: stopped by the duration bound
    start_ns: int = 0
    ttft_ns: int = 0
    latency_ns: int = 0
    itl_ns: list[int] = field(default_factory=list)
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each token chunk, absolute ns
    output_tokens: int = 0
    usage_tokens: bool = False
    text: str = ""
    success: bool = False
    error: str = ""

    @property
    def tpot_ns(self) -> float:
        if self.output_tokens > 1:
            return (self.latency_ns - self.ttft_ns) / (self.output_tokens - 1)
        return 0.0


# --- one request ---------------------------------------------------------------------------------------


def _chunk_text(data: dict, chat: bool) -> str | None:
    choices = data.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    if chat:
        delta = choice.get("delta") or {}
        return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or None
    return choice.get("text") or None


def _body(config: BenchConfig, model: str, prompt: Prompt) -> dict:
    body: dict[str, Any] = {"model": model, "max_tokens": config.output_len, "stream": True,
                            "stream_options": {"include_usage": True}, "temperature": 0.0}
    if config.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt.text}]
    else:
        body["prompt"] = prompt.text
    if config.ignore_eos:
        body["ignore_eos"] = True
    body.update(config.extra_body)
    return body


async def _one(pool: Pool, config: BenchConfig, model: str, prompt: Prompt, headers: dict[str, str],
               rec: RequestRecord) -> None:
    chat = config.endpoint == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    exchange = Exchange(pool, "POST", path, _body(config, model, prompt), headers)
    parser = SSEParser()
    pieces: list[str] = []
    rec.sent, rec.start_ns = True, time.perf_counter_ns()
    try:
        async with asyncio.timeout(config.timeout_s):
            status = await exchange.start()
            rec.start_ns = exchange.sent_ns
            if status != 200:
                raw = await exchange.read_all()
                rec.error = f"HTTP {status}: {raw[:300].decode(errors='replace')}"
                return
            async for t_ns, data in exchange.pieces():
                for event in parser.feed(data):
                    _on_event(event, t_ns, rec, chat, pieces)
    except TimeoutError:
        rec.error = f"no complete answer within {config.timeout_s:g} s"
        return
    except (HTTPError, ValueError) as exc:
        rec.error = str(exc)
        return
    finally:
        exchange.close()
    rec.text = "".join(pieces)
    if not rec.chunk_ns:
        rec.error = rec.error or "the stream carried no token chunk"
        return
    rec.latency_ns = rec.chunk_ns[-1] - rec.start_ns
    rec.success = True


def _on_event(event: str, t_ns: int, rec: RequestRecord, chat: bool, pieces: list[str]) -> None:
    if event.strip() == "[DONE]":
        return
    data = json.loads(event)
    if "error" in data and not data.get("choices"):
        raise ValueError(f"server error in stream: {str(data['error'])[:300]}")
    text = _chunk_text(data, chat)
    if text is not None:
        if rec.chunk_ns:
            rec.itl_ns.append(t_ns - rec.chunk_ns[-1])
        else:
            rec.ttft_ns = t_ns - rec.start_ns
        rec.chunk_ns.append(t_ns)
        pieces.append(text)
    usage = data.get("usage")
    if usage:
        if usage.get("completion_tokens") is not None:
            rec.output_tokens = int(usage["completion_tokens"])
            rec.usage_tokens = True
        if usage.get("prompt_tokens") is not None:
            rec.prompt_tokens = int(usage["prompt_tokens"])


# --- scheduling ----------------------------------------------------------------------------------------


def arrival_offsets(n: int, rate: float | None, burstiness: float, seed: int) -> list[float]:
    """Seconds after start at which request i is due: all 0 for rate None/inf, else gamma gaps with mean
    1/rate (shape = burstiness; 1 = Poisson), as vLLM's get_request draws them."""
    if rate is None or math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, theta)
    return out


async def _measured(pool: Pool, config: BenchConfig, model: str, prompts: list[Prompt], headers: dict[str, str],
                    records: list[RequestRecord], t0_ns: int) -> None:
    deadline_ns = t0_ns + int(config.duration_s * 1e9)
    offsets = arrival_offsets(len(prompts), config.request_rate, config.burstiness, config.seed)
    limit = asyncio.Semaphore(config.concurrency) if config.concurrency else None
    tasks: list[asyncio.Task] = []

    async def fire(i: int) -> None:
        if limit is None:
            await _one(pool, config, model, prompts[i], headers, records[i])
            return
        async with limit:
            if time.perf_counter_ns() >= deadline_ns:
                records[i].error = "not sent: duration reached"
                return
            await _one(pool, config, model, prompts[i], headers, records[i])

    for i, offset in enumerate(offsets):
        due_ns = t0_ns + int(offset * 1e9)
        if due_ns >= deadline_ns:
            break
        delay = (due_ns - time.perf_counter_ns()) / 1e9
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(fire(i)))
    if not tasks:
        return
    grace = max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9) + config.timeout_s
    _done, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _bench(config: BenchConfig) -> BenchResult:
    pool = Pool(Target.parse(config.url), ca_file=config.ca_file)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    try:
        model = config.model or await _first_model(pool, headers)
        counter = TokenCounter(config.tokenizer) if config.tokenizer else None
        total = config.warmup_requests + config.num_requests
        if config.dataset == "synthetic":
            assert counter is not None
            prompts = synthetic(total, config.input_len, counter, config.seed)
        else:
            prompts = customer_service(total, counter, config.seed)
        warm = [RequestRecord(True, p.tokens) for p in prompts[: config.warmup_requests]]
        if warm:
            sem = asyncio.Semaphore(config.concurrency or len(warm))

            async def one_warm(i: int) -> None:
                async with sem:
                    await _one(pool, config, model, prompts[i], headers, warm[i])

            await asyncio.gather(*(one_warm(i) for i in range(len(warm))))
        measured = prompts[config.warmup_requests:]
        records = [RequestRecord(False, p.tokens) for p in measured]
        sampler = Sampler(config.npu_smi, config.npu_interval_s) if config.npu_smi else None
        stop = asyncio.Event()
        t0_ns = time.perf_counter_ns()
        sampler_task = asyncio.create_task(sampler.run(t0_ns, stop)) if sampler else None
        await _measured(pool, config, model, measured, headers, records, t0_ns)
        end_ns = max([r.start_ns + r.latency_ns for r in records if r.success], default=time.perf_counter_ns())
        stop.set()
        if sampler_task:
            await sampler_task
    finally:
        pool.close()
    return BenchResult.build(config, model, records, warm, t0_ns, end_ns, sampler, counter)


async def _first_model(pool: Pool, headers: dict[str, str]) -> str:
    try:
        doc = await get_json(pool, "/v1/models", headers)
        return str(doc["data"][0]["id"])
    except (HTTPError, KeyError, IndexError, ValueError) as exc:
        raise UsageError(f"cannot learn the served model from {pool.target.url('/v1/models')}: {exc}",
                         fix="pass --model NAME (the engine's --served-model-name)") from exc


def run_bench(config: BenchConfig) -> BenchResult:
    """Run one bounded benchmark (blocking). Raises UsageError for bad configuration."""
    config.validate()
    return asyncio.run(_bench(config))


# --- the result ------------------------------------------------------------------------------------------


@dataclass
class BenchResult:
    config: dict
    model: str
    completed: int
    failed: int
    not_sent: int
    duration_s: float
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    max_concurrent_requests: int
    metrics: dict[str, dict[str, float]]  # ttft/tpot/itl/e2el -> summary in ms
    histograms: dict[str, dict]
    timeline: list[dict]  # per second: output tokens, completed requests, requests in flight
    requests: list[list]  # per measured request sent, fields REQUEST_FIELDS
    errors: list[str]
    token_source: str
    warmup: dict
    telemetry: dict | None = None
    telemetry_samples: list[dict] = field(default_factory=list)
    definitions: dict = field(default_factory=lambda: dict(DEFINITIONS))

    @classmethod
    def build(cls, config: BenchConfig, model: str, records: list[RequestRecord], warm: list[RequestRecord],
              t0_ns: int, end_ns: int, sampler: Sampler | None, counter: TokenCounter | None) -> BenchResult:
        ok = [r for r in records if r.success]
        sources = set()
        for r in ok:
            if not r.usage_tokens:
                r.output_tokens = counter.count(r.text) if counter else len(r.chunk_ns)
                sources.add("tokenizer" if counter else "chunks")
            else:
                sources.add("usage")
        dur = max((end_ns - t0_ns) / 1e9, 1e-9)
        ms = 1e-6
        series = {
            "ttft": [r.ttft_ns * ms for r in ok],
            "tpot": [r.tpot_ns * ms for r in ok if r.output_tokens > 1],
            "itl": [g * ms for r in ok for g in r.itl_ns],
            "e2el": [r.latency_ns * ms for r in ok],
        }
        total_in = sum(r.prompt_tokens or 0 for r in ok)
        total_out = sum(r.output_tokens for r in ok)
        good = _goodput(ok, config.goodput) if config.goodput else None
        timeline = _timeline(ok, t0_ns, end_ns)
        errors = sorted({r.error for r in records if not r.success and r.error})
        cfg = asdict(config)
        cfg["api_key"] = "***" if config.api_key else None
        return cls(
            config=cfg, model=model, completed=len(ok),
            failed=sum(1 for r in records if not r.success and r.sent),
            not_sent=sum(1 for r in records if not r.sent),
            duration_s=dur, total_input=total_in, total_output=total_out,
            request_throughput=len(ok) / dur,
            request_goodput=None if good is None else good / dur,
            output_throughput=total_out / dur, total_token_throughput=(total_in + total_out) / dur,
            max_output_tokens_per_s=max((b["output_tokens"] for b in timeline), default=0),
            max_concurrent_requests=max((b["in_flight"] for b in timeline), default=0),
            metrics={k: stats.summary(v) for k, v in series.items()},
            histograms={k: stats.histogram(v) for k, v in series.items()},
            timeline=timeline,
            requests=[[round((r.start_ns - t0_ns) / 1e9, 6), round(r.ttft_ns * ms, 4), round(r.latency_ns * ms, 4),
                       round(r.tpot_ns * ms, 4), r.output_tokens, r.prompt_tokens, r.success]
                      for r in records if r.sent],
            errors=errors[:20], token_source="+".join(sorted(sources)) or "none",
            warmup={"requests": len(warm), "completed": sum(1 for r in warm if r.success),
                    "errors": sorted({r.error for r in warm if r.error})[:5]},
            telemetry=sampler.summary() if sampler else None,
            telemetry_samples=sampler.samples if sampler else [],
        )

    @property
    def good_pct(self) -> float | None:
        if self.request_goodput is None or not self.request_throughput:
            return None
        return 100.0 * self.request_goodput / self.request_throughput

    def column(self, metric: str) -> list[float]:
        """Per completed request values in ms of ``ttft``, ``e2el`` or ``tpot`` (requests with > 1 token)."""
        col = REQUEST_FIELDS.index(f"{metric}_ms")
        ok = REQUEST_FIELDS.index("ok")
        tokens = REQUEST_FIELDS.index("output_tokens")
        return [r[col] for r in self.requests if r[ok] and (metric != "tpot" or r[tokens] > 1)]

    def meets(self, slo: SLO) -> list[str]:
        """Violations of ``slo`` as sentences; an empty list means the SLO is met."""
        out = []
        sent = self.completed + self.failed
        if self.completed == 0:
            return [f"no request completed ({self.failed} failed): {'; '.join(self.errors[:3]) or 'no error text'}"]
        if slo.max_failed_pct is not None and sent and 100.0 * self.failed / sent > slo.max_failed_pct:
            out.append(f"failed requests {self.failed}/{sent} ({100.0 * self.failed / sent:.1f} %) "
                       f"> {slo.max_failed_pct:g} %")
        tag = "median" if slo.percentile == 50 else f"p{slo.percentile:g}"
        for metric, limit in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2el", slo.e2el_ms)):
            if limit is not None:
                value = stats.percentile(self.column(metric), slo.percentile)
                if value > limit:
                    out.append(f"{tag} {metric.upper()} {value:.1f} ms > {limit:g} ms")
        if slo.min_output_tps is not None and self.output_throughput < slo.min_output_tps:
            out.append(f"output throughput {self.output_throughput:.1f} tokens/s < {slo.min_output_tps:g} tokens/s")
        if slo.min_goodput_pct is not None:
            if self.good_pct is None:
                out.append("goodput not measured: give goodput thresholds (--goodput) with --slo-min-goodput-pct")
            elif self.good_pct < slo.min_goodput_pct:
                out.append(f"goodput {self.good_pct:.1f} % of requests < {slo.min_goodput_pct:g} %")
        if slo.max_hbm_pct is not None:
            peak = (self.telemetry or {}).get("hbm_pct_max")
            if peak is None:
                out.append("HBM use not measured: pass --npu-smi CMD for NPU telemetry")
            elif peak > slo.max_hbm_pct:
                out.append(f"peak HBM use {peak:.1f} % > {slo.max_hbm_pct:g} %")
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def _goodput(ok: list[RequestRecord], thresholds: dict[str, float]) -> int:
    good = 0
    for r in ok:
        values = {"ttft": r.ttft_ns / 1e6, "tpot": r.tpot_ns / 1e6, "e2el": r.latency_ns / 1e6}
        if all(values[k] <= v for k, v in thresholds.items()):
            good += 1
    return good


def _timeline(ok: list[RequestRecord], t0_ns: int, end_ns: int) -> list[dict]:
    """Per-second buckets from the measured start: output tokens (chunks weighted so each request's sum is its
    token count), completions, and requests active at some time during the second ("in_flight", vLLM's
    concurrent-requests-per-second, whose maximum is ``max_concurrent_requests``)."""
    seconds = max(1, math.ceil((end_ns - t0_ns) / 1e9)) if ok else 0
    tokens = [0.0] * seconds
    done = [0] * seconds
    flight = [0] * seconds
    for r in ok:
        weight = r.output_tokens / len(r.chunk_ns)
        for t in r.chunk_ns:
            tokens[min(int((t - t0_ns) // 1_000_000_000), seconds - 1)] += weight
        first = max(0, int((r.start_ns - t0_ns) // 1_000_000_000))
        last = min(seconds - 1, int((r.start_ns + r.latency_ns - t0_ns) // 1_000_000_000))
        done[last] += 1
        for s in range(first, last + 1):
            flight[s] += 1
    return [{"t": s, "output_tokens": round(tokens[s], 3), "completed": done[s], "in_flight": flight[s]}
            for s in range(seconds)]
