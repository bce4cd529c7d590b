# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Is a serving engine making progress? Two ``/metrics`` samples and one completion with a deadline.

A hung collective leaves vLLM's ``/health`` at 200 (it reads only an ``errored`` flag) and an SGLang
rank >= 1 answers a dummy 200 (docs/multinode-serving.md, "Hang detection"), so health alone cannot
tell a hung instance from a busy one. The engine's own counters can:

- **work present**: the gauges of running and waiting (queued) requests, summed;
- **progress**: the sum of every progress counter the engine exports: generated tokens, finished
  requests, and the counts of the time-to-first-token and inter-token-latency histograms. SGLang
  counts generated tokens and requests only when a request finishes, while its histogram counts move
  as tokens reach the tokenizer manager: no single counter is enough, and a window in which no request
  finished is not a hang by itself.

Verdicts (:func:`judge`, a pure function of two samples W seconds apart and the completion's outcome):
``ok`` (the completion finished, or counters moved), ``idle`` (nothing to do, nothing moved), ``slow``
(counters moved but the completion missed its deadline: overloaded, not hung), ``hung`` (work present at
both samples, no progress counter moved, and the completion did not complete; a completion still out at
its deadline is work present itself), ``no-metrics`` (the engine exports no progress counter).

:func:`observe` runs the completion and the samples (HTTP, clock and thread injected; :func:`request`
is the HTTP); :func:`headline` and :func:`where` word the result. The health probe (module_utils
``health``) and ``atlasctl doctor`` (which runs this file's source on the node with a short driver, and
judges what comes back with this same file) share them. Standard library only, and no import of another
module_utils: this file ships to the nodes, and runs there alone.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.error
import urllib.request

# Sample names (as exposed: counters with _total, histograms' _count) per engine.
# vLLM 0.11.1 v1/metrics/loggers.py; SGLang 0.5.6 srt/metrics/collector.py (docs/multinode-serving.md).
ENGINES = {
    "vllm": {
        "work": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        "progress": ("vllm:generation_tokens_total", "vllm:request_success_total",
                     "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count"),
    },
    "sglang": {
        "work": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        "progress": ("sglang:generation_tokens_total", "sglang:num_requests_total",
                     "sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_count"),
    },
}
VERDICTS = ("ok", "idle", "slow", "hung", "no-metrics")
RECOVER = "ansible-playbook -i INV playbooks/recover.yml"
FIXES = {
    "hung": "drain the entry and restart every rank of the instance: " + RECOVER,
    "slow": "the engine is overloaded, not hung: do not restart it; lower its load (drain the node at the "
            "gateway until the queue empties) or allow a longer completion deadline",
    "no-metrics": "let the engine export its metrics (SGLang: `--enable-metrics: true` in the profile's flags; "
                  "vLLM serves /metrics by default) so a hang can be told from a slow engine",
}

# The probes ask the engine directly: proxy variables of the node's environment never apply.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*\"")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


# --- Prometheus text exposition ----------------------------------------------------------------


def samples(text):
    """(name, labels, value) of every sample line of Prometheus text exposition. Comments (``# HELP``,
    ``# TYPE``, ``# EOF``), blank and malformed lines are skipped; never raises on text."""
    for line in str(text).split("\n"):  # the format's line end; a label value may hold any other
        parsed = _sample(line.strip())
        if parsed is not None:
            yield parsed


def _sample(line):
    match = _NAME.match(line)
    if match is None:
        return None
    labels, rest = {}, line[match.end():]
    if rest.startswith("{"):
        labels, rest = _labels(rest)
        if labels is None:
            return None
    fields = rest.split()
    if not fields or not rest[0].isspace():
        return None
    try:
        value = float(fields[0])  # NaN, +Inf, -Inf, 1e3 as Prometheus writes them; a timestamp may follow
    except ValueError:
        return None
    return match.group(), labels, value


def _labels(text):
    """``{a="x",b="y\\"z"}`` at the start of ``text`` -> (labels, rest), or (None, "") when malformed."""
    labels, i = {}, 1
    while True:
        while i < len(text) and text[i] in " \t":
            i += 1
        if text[i:i + 1] == "}":
            return labels, text[i + 1:]
        match = _LABEL.match(text, i)
        if match is None:
            return None, ""
        value, i = _quoted(text, match.end())
        if value is None:
            return None, ""
        labels[match.group(1)] = value
        while i < len(text) and text[i] in " \t":
            i += 1
        if text[i:i + 1] == ",":
            i += 1
        elif text[i:i + 1] != "}":
            return None, ""


def _quoted(text, i):
    """The label value starting at ``text[i]`` (after its opening quote) -> (value, index after the closing
    quote), or (None, i) when it never closes."""
    out = []
    while i < len(text):
        char = text[i]
        if char == '"':
            return "".join(out), i + 1
        if char == "\\" and i + 1 < len(text):
            out.append(_ESCAPES.get(text[i + 1], "\\" + text[i + 1]))
            i += 2
            continue
        out.append(char)
        i += 1
    return None, i


def totals(text):
    """{sample name: sum over its label sets} of the finite values in ``text`` (several engines, DP ranks,
    ``finished_reason`` labels add up); a name with no finite value is left out."""
    out = {}
    for name, _labels, value in samples(text):
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


# --- what one sample says ----------------------------------------------------------------------


def pick_engine(values, hint=None):
    """The engine whose metrics to read: the record's (``vllm...``, ``sglang...``), else the one with the
    most of its names in ``values``; None when none is there."""
    hint = str(hint or "").lower()
    for engine in ENGINES:
        if hint.startswith(engine):
            return engine
    found = {engine: sum(1 for name in spec["work"] + spec["progress"] if name in values)
             for engine, spec in ENGINES.items()}
    best = max(found, key=found.get)
    return best if found[best] else None


def reading(text, engine=None, status=200, error=None):
    """One sample: ``/metrics`` answered ``status`` with ``text`` (or no answer: status None, ``error``).
    Keeps the engine's work gauges and progress counters that are present."""
    values = totals(text) if status == 200 else {}
    chosen = pick_engine(values, engine)
    spec = ENGINES.get(chosen, {"work": (), "progress": ()})
    return {"status": status, "error": error, "engine": chosen,
            "work": {name: values[name] for name in spec["work"] if name in values},
            "progress": {name: values[name] for name in spec["progress"] if name in values}}


def completion_state(completion):
    """``completed`` (200 within the deadline), ``missed`` (still out at the deadline, or answered after it),
    ``failed`` (another answer, or none, before the deadline), ``none`` (no completion sent)."""
    if not completion:
        return "none"
    seconds, deadline = completion.get("seconds") or 0.0, completion.get("deadline_s") or 0.0
    if completion.get("status") == 200 and seconds <= deadline:
        return "completed"
    return "missed" if seconds >= deadline else "failed"


# --- the verdict -------------------------------------------------------------------------------


def judge(before, after, window_s, completion):
    """The verdict over two samples ``window_s`` seconds apart (``before`` None: one sample, as on the
    healthy path) and the completion's outcome ({status, seconds, error, deadline_s} or None).
    Returns {verdict, reason, evidence}; pure."""
    evidence = {"engine": (after or before or {}).get("engine"), "window_s": round(float(window_s), 3),
                "before": before, "after": after, "completion": completion, "delta": {}}
    bare = [s for s in (before, after) if s is not None and not s.get("progress")]
    if after is None or bare:
        return _verdict("no-metrics", _no_metrics_reason((bare or [after])[0], evidence["engine"]), evidence)
    delta = _delta(before["progress"], after["progress"]) if before is not None else {}
    evidence["delta"] = delta
    state = completion_state(completion)
    said = describe_completion(completion)
    moved = sum(abs(value) for value in delta.values())
    if state == "completed":
        return _verdict("ok", f"the completion {said}", evidence)
    if moved:
        slow = state == "missed"
        return _verdict("slow" if slow else "ok", f"progress counters moved by {moved:g} in {window_s:.1f} s but "
                        f"the completion {said}" + (": overloaded, not hung" if slow else ""), evidence)
    # A completion still out at its deadline is work present at both samples itself.
    if before is not None and all(_load(s) > 0 or state == "missed" for s in (before, after)):
        loads = " -> ".join(f"{_load(s):g}" for s in (before, after))
        own = " plus the probe's own completion" if state == "missed" else ""
        return _verdict("hung", f"no progress counter moved in {window_s:.1f} s while work was present at both "
                                f"samples (running+waiting {loads}{own}) and the completion {said}", evidence)
    return _verdict("idle", f"no work present and no progress counter moved in {window_s:.1f} s "
                            f"(the completion {said})", evidence)


def headline(progress, place):
    """``engine VERDICT at PLACE: REASON``: how the health probe's error and doctor's finding begin."""
    reason = progress["reason"]
    if progress["verdict"] == "no-metrics":
        reason = f"the completion {describe_completion(progress['evidence']['completion'])}; {reason}"
    return f"engine {progress['verdict']} at {place}: {reason}"


# An engine that listens on every address is reached from its own node on the loopback address.
_ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")


def local_url(record):
    """The engine's base URL from its own node: the address its service record says it listens on (the
    node's backend address; the loopback address for every address or a record without one) and its port."""
    host = str(record.get("host") or "").strip()
    host = "127.0.0.1" if host in _ANY_ADDRESS else host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{int(record['port'])}"


def where(url, record):
    """``url``, with the instance, its entry and its ranks when the record is a rank of one."""
    instance = record.get("instance") if isinstance(record, dict) else None
    if not isinstance(instance, dict):
        return url
    nodes = ", ".join(str(n) for n in instance.get("nodes") or [])
    return f"{url} (instance {instance.get('name')}, entry {instance.get('head')}, ranks {nodes})"


def _verdict(verdict, reason, evidence):
    return {"verdict": verdict, "reason": reason, "evidence": evidence}


def _delta(before, after):
    """Per counter, after - before; a counter missing from a sample counts 0 (its labels appear on first
    use). A fall is a reset (the engine restarted): it counts as movement, never as a stall."""
    return {name: after.get(name, 0.0) - before.get(name, 0.0) for name in sorted(set(before) | set(after))}


def _load(sample):
    return sum(sample.get("work", {}).values())


def describe_completion(completion):
    """What became of the completion, as a phrase: "finished in 0.4 s", "did not finish within its 30 s
    deadline", "answered HTTP 401 after 0.0 s", "was not sent"."""
    state = completion_state(completion)
    if state == "none":
        return "was not sent"
    seconds, deadline = completion.get("seconds") or 0.0, completion.get("deadline_s") or 0.0
    if state == "completed":
        return f"finished in {seconds:.1f} s"
    if state == "missed":
        late = f" (answered {_answer(completion)} after {seconds:.1f} s)" if completion.get("status") else ""
        return f"did not finish within its {deadline:g} s deadline{late}"
    return f"answered {_answer(completion)} after {seconds:.1f} s"


def _answer(completion):
    return completion.get("error") or f"HTTP {completion.get('status')}"


def _no_metrics_reason(sample, engine):
    names = [name for e, spec in ENGINES.items() if engine in (None, e) for name in spec["progress"]]
    if sample is None:
        said = "/metrics was not read"
    elif sample.get("status") != 200:
        said = f"/metrics answered {sample.get('error') or sample.get('status')}"
    else:
        said = f"/metrics lists none of {', '.join(names)}"
    return (f"the engine exports no progress counter ({said}), so a hang cannot be told from a slow engine: "
            "SGLang serves /metrics only with --enable-metrics")


# --- the samples and the completion (HTTP, clock and thread injected) --------------------------


def request(method, url, headers=None, body=None, timeout=10.0):
    """(status, body bytes, detail) of one HTTP request; status is None when no answer came
    (refused, timed out, reset), with the reason in detail."""
    data = None if body is None else json.dumps(body).encode()
    hdrs = dict(headers or {})
    if data is not None:
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method)
    try:
        with _OPENER.open(req, timeout=timeout) as response:
            return response.status, response.read(), f"HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read() if exc.fp else b"", f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, b"", str(reason) or type(exc).__name__


class _Job:
    """``fn()`` in a daemon thread: its (status, body, detail) as ``value``, and the seconds it took. The
    default ``spawn`` of :func:`observe` (a test passes another with ``wait``, ``outcome``, ``value``,
    ``started``)."""

    def __init__(self, fn, clock):
        self.value, self.seconds = None, None
        self._done = threading.Event()
        self.started = started = clock()

        def run():
            try:
                self.value = fn()
            except Exception as exc:  # noqa: BLE001 - any failure of the request is its answer
                self.value = (None, b"", str(exc) or type(exc).__name__)
            self.seconds = clock() - started
            self._done.set()

        threading.Thread(target=run, daemon=True).start()

    def wait(self, timeout):
        return self._done.wait(max(0.0, timeout))

    def outcome(self, deadline_s, clock):
        """{status, seconds, error, deadline_s}; a job still running is no answer within the deadline."""
        if not self._done.is_set():
            return {"status": None, "seconds": round(clock() - self.started, 3),
                    "error": f"no answer within {deadline_s:g} s", "deadline_s": deadline_s}
        status, _body, detail = self.value
        return {"status": status, "seconds": round(self.seconds, 3), "error": None if status == 200 else detail,
                "deadline_s": deadline_s}


def completion_body(model, prompt, max_tokens):
    """The smoke completion both engines answer (OpenAI ``/v1/completions``)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


def observe(get, url, model, headers, engine, prompt, max_tokens, deadline_s, window_s, always=False,
            clock=time.monotonic, sleep=time.sleep, spawn=_Job):
    """Send the completion and sample ``url/metrics``; ``get(method, url, headers, body, timeout)`` returns
    (status, body bytes, detail). The completion runs in the background, its request kept open for the
    window too (an abandoned request is aborted by the engine and would no longer be work present).

    - ``always`` false: wait up to ``deadline_s``; a completion back by then gets one sample (the healthy
      path pays no window); one still out gets two samples ``window_s`` apart (none when ``window_s`` is 0).
    - ``always`` true: two samples ``window_s`` apart while the completion runs, then its deadline.

    Returns {completion (outcome), body (the bytes of its answer, None without one), before, after (readings
    or None), window_s}."""
    body = completion_body(model, prompt, max_tokens)
    timeout = deadline_s + window_s + 5.0

    def sample():
        status, data, detail = get("GET", f"{url}/metrics", headers=headers, timeout=min(10.0, timeout))
        return reading(data.decode("utf-8", "replace") if status == 200 else "", engine, status,
                       None if status == 200 else detail)

    job = spawn(lambda: get("POST", f"{url}/v1/completions", headers=headers, body=body, timeout=timeout), clock)
    out = {"before": None, "after": None, "window_s": 0.0}
    if not always and job.wait(deadline_s):
        outcome = job.outcome(deadline_s, clock)
        if completion_state(outcome) == "completed":
            out["after"] = sample()
    elif window_s > 0:
        started = clock()
        out["before"] = sample()
        sleep(window_s)
        out["after"] = sample()
        out["window_s"] = round(clock() - started, 3)
        job.wait(deadline_s - (clock() - job.started))
    outcome = job.outcome(deadline_s, clock)
    return {"completion": outcome, "body": job.value[1] if outcome["status"] is not None else None, **out}
