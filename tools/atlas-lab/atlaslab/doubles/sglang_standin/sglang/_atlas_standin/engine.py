"""A deterministic "model": exact token counts, timed tokens, a bounded running batch, SGLang's metrics.

Tokenizer: a token is a run of word characters or one other non-space character
(``re.findall(r"\\w+|[^\\w\\s]", text)``). A chat prompt counts each message's content tokens plus 2 (role
and end-of-turn) plus 1 (assistant start). Output tokens are words of the prompt (or a fixed vocabulary),
each emitted as ``" " + word``: one token per SSE chunk, and re-tokenizing the text gives the same count.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sglang._atlas_standin.knobs import Knobs

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
WORD_RE = re.compile(r"^\w+$")
VOCAB = ("atlas", "ascend", "serving", "token", "model", "bank", "branch", "lab", "npu", "cache", "batch",
         "prefill", "decode", "stream", "route", "wave")

# Buckets of sglang/srt/metrics/collector.py (TokenizerMetricsCollector defaults), 0.5.6.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
               0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
THROUGHPUT_WINDOW_S = 5.0


def tokenize(text: str) -> list[str]:
    return TOKEN_RE.findall(text)


def chat_prompt_tokens(messages: list[dict[str, Any]]) -> list[str]:
    tokens: list[str] = []
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
        tokens += ["<role>", *tokenize(str(content)), "<eot>"]
    return [*tokens, "<assistant>"]


def output_words(prompt_tokens: list[str], count: int) -> list[str]:
    words = [t for t in prompt_tokens if WORD_RE.match(t)] or list(VOCAB)
    seed = sum(len(w) for w in words)
    return [" " + words[(seed + i) % len(words)] for i in range(count)]


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


@dataclass
class Stats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    aborted: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    last_cache_hit_rate: float = 0.0


@dataclass
class Request:
    prompt_tokens: list[str]
    max_new_tokens: int
    ignore_eos: bool
    generated: int = 0
    finish_reason: str | None = None
    matched_stop: int | str | None = None
    cached: int = 0


class Engine:
    """Requests beyond the running-request slots wait in a queue, as in SGLang's scheduler."""

    def __init__(self, knobs: Knobs, max_running: int, context_len: int, eos_token_id: int, radix_cache: bool,
                 group: Any = None):
        self.knobs = knobs
        self.group = group  # multi-node rank 0: a dist.HeadGroup; every token is then one collective step
        self.max_running = max_running
        self.context_len = context_len
        self.eos_token_id = eos_token_id
        self.radix_cache = radix_cache
        self.max_total_num_tokens = knobs.kv_tokens
        self._slots = threading.BoundedSemaphore(max_running)
        self._lock = threading.Lock()
        self.running = 0
        self.queued = 0
        self.used_tokens = 0
        self.stats = Stats()
        self._prefixes: collections.OrderedDict[tuple[str, ...], None] = collections.OrderedDict()
        self._recent: collections.deque[tuple[float, int]] = collections.deque()

    def validate(self, input_tokens: int, max_new_tokens: int) -> str | None:
        """SGLang's TokenizerManager message when a request does not fit the context, else None."""
        total = input_tokens + max_new_tokens
        if total < self.context_len:
            return None
        return (f"Requested token count exceeds the model's maximum context length of {self.context_len} tokens. "
                f"You requested a total of {total} tokens: {input_tokens} tokens from the input messages and "
                f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit.")

    def default_max_new_tokens(self, input_tokens: int) -> int:
        return max(1, self.context_len - input_tokens - 1)

    @contextmanager
    def admit(self, req: Request) -> Iterator[None]:
        with self._lock:
            self.queued += 1
        self._slots.acquire()
        with self._lock:
            self.queued -= 1
            self.running += 1
            self.used_tokens += len(req.prompt_tokens)
            req.cached = self._cache_lookup(req.prompt_tokens)
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
                self.used_tokens -= len(req.prompt_tokens) + req.generated
            self._slots.release()

    def _cache_lookup(self, tokens: list[str]) -> int:
        """Radix-cache hit: the longest remembered prefix (prompts are remembered whole, LRU of 1024)."""
        if not self.radix_cache:
            return 0
        best = 0
        for prefix in self._prefixes:
            if len(prefix) > best and len(prefix) < len(tokens) and tuple(tokens[:len(prefix)]) == prefix:
                best = len(prefix)
        key = tuple(tokens)
        if key in self._prefixes:
            best = max(best, len(tokens) - 1)
        self._prefixes[key] = None
        self._prefixes.move_to_end(key)
        while len(self._prefixes) > 1024:
            self._prefixes.popitem(last=False)
        return best

    def tokens(self, req: Request) -> Iterator[str]:
        """Yield output tokens with the configured timing; sets finish_reason and matched_stop."""
        limit = req.max_new_tokens
        stop_at_eos = not req.ignore_eos and 0 < self.knobs.eos_after < limit
        count = self.knobs.eos_after if stop_at_eos else limit
        started = time.perf_counter()
        self._pace(self.knobs.ttft_s)
        last = time.perf_counter()
        self.record_prefill(req, last - started)
        for i, word in enumerate(output_words(req.prompt_tokens, count)):
            if i:
                self._pace(self.knobs.itl_s)
                now = time.perf_counter()
                self.record_token(now - last)
                last = now
            else:
                self.record_token(None)
            req.generated += 1
            if i == count - 1:
                req.finish_reason = "stop" if stop_at_eos else "length"
                req.matched_stop = self.eos_token_id if stop_at_eos else None
            yield word
        self.record_finish(time.perf_counter() - started)

    def _pace(self, seconds: float) -> None:
        if self.group is not None:
            self.group.step(seconds)
        else:
            time.sleep(seconds)

    def record_prefill(self, req: Request, ttft: float) -> None:
        with self._lock:
            self.stats.requests += 1
            self.stats.prompt_tokens += len(req.prompt_tokens)
            self.stats.cached_tokens += req.cached
            self.stats.last_cache_hit_rate = req.cached / len(req.prompt_tokens) if req.prompt_tokens else 0.0
            self.stats.ttft.observe(ttft)

    def record_token(self, itl: float | None) -> None:
        now = time.monotonic()
        with self._lock:
            self.stats.generation_tokens += 1
            self.used_tokens += 1
            if itl is not None:
                self.stats.itl.observe(itl)
            self._recent.append((now, 1))

    def record_finish(self, e2e: float) -> None:
        with self._lock:
            self.stats.e2e.observe(e2e)

    def record_abort(self) -> None:
        with self._lock:
            self.stats.aborted += 1

    def gen_throughput(self) -> float:
        cutoff = time.monotonic() - THROUGHPUT_WINDOW_S
        with self._lock:
            while self._recent and self._recent[0][0] < cutoff:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / THROUGHPUT_WINDOW_S

    def token_usage(self) -> float:
        return min(1.0, self.used_tokens / self.max_total_num_tokens) if self.max_total_num_tokens else 0.0
