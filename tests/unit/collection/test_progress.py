"""The hang check's parts: Prometheus text parsed, the engines' counters picked, the verdict, the sampler."""

from __future__ import annotations

import json
import math

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import progress
from hypothesis import given, settings
from hypothesis import strategies as st

# vLLM 0.11.1 as prometheus_client writes it (labels model_name, engine; request_success by finished_reason;
# _created samples beside counters; histogram buckets): two DP engines, summed per name.
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 3.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 4.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.25
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 145.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} NaN
"""

SGLANG = """\
# HELP sglang:num_running_reqs Multiprocess metric
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 1.0
sglang:num_queue_reqs{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 0.0
sglang:generation_tokens_total{model_name="m"} 7.0
sglang:num_requests_total{model_name="m"} 1.0
sglang:time_to_first_token_seconds_count{model_name="m"} 2.0
sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="m"} 30.0
sglang:inter_token_latency_seconds_count{model_name="m"} 30.0
"""


# --- parsing ----------------------------------------------------------------------------------------------

# (id, text, expected totals)
PARSE = [
    ("plain", "a 1\nb 2.5\n", {"a": 1.0, "b": 2.5}),
    ("label sets add up", 'x{k="1"} 1\nx{k="2"} 2\n', {"x": 3.0}),
    ("comments, blank, EOF", "# HELP x h\n# TYPE x counter\n\nx_total 4\n# EOF\n", {"x_total": 4.0}),
    ("timestamp after the value", "x 3 1700000000000\n", {"x": 3.0}),
    ("escaped quote, comma, brace in a value", 'x{a="b\\"c,}d",e="\\\\"} 5\n', {"x": 5.0}),
    ("trailing comma, spaces", 'x{ a = "1" , } 6\n', {"x": 6.0}),
    ("empty label set", "x{} 7\n", {"x": 7.0}),
    ("NaN and infinities left out", "x NaN\ny +Inf\nz -Inf\nw 1\nw NaN\n", {"w": 1.0}),
    ("exponent, sign", "x 1e3\ny -2.5E-1\n", {"x": 1000.0, "y": -0.25}),
    ("indented line", "   x 1\n", {"x": 1.0}),
    ("garbage skipped", 'garbage\n{a="b"} 1\nx{a="b" 1\nx{a=b} 1\nx 1x\nx\ny{a="open} 1\nz1\n9x 1\nok 2\n',
     {"ok": 2.0}),
    ("name glued to the value", "x{a=\"1\"}2\n", {}),
    ("colons in names", "vllm:num_requests_running 2\n", {"vllm:num_requests_running": 2.0}),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in PARSE], ids=[c[0] for c in PARSE])
def test_totals(text, expected):
    assert progress.totals(text) == expected


def test_samples_keep_labels_and_non_finite_values():
    found = list(progress.samples('x{a="q\\"1",b="\\n"} NaN\ny +Inf\n'))
    assert found[0][:2] == ("x", {"a": 'q"1', "b": "\n"}) and math.isnan(found[0][2])
    assert found[1] == ("y", {}, math.inf)


def test_vllm_and_sglang_expositions_give_their_work_and_progress():
    vllm = progress.reading(VLLM)
    assert vllm["engine"] == "vllm"
    assert vllm["work"] == {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 3.0}
    assert vllm["progress"] == {"vllm:generation_tokens_total": 150.0, "vllm:request_success_total": 5.0,
                                "vllm:time_to_first_token_seconds_count": 5.0,
                                "vllm:inter_token_latency_seconds_count": 145.0}
    sglang = progress.reading(SGLANG)
    assert sglang["engine"] == "sglang" and sum(sglang["work"].values()) == 1.0
    assert sglang["progress"]["sglang:inter_token_latency_seconds_count"] == 30.0


# (id, values, the record's engine, expected)
PICK = [
    ("record says vllm", {"sglang:num_running_reqs": 1}, "vllm", "vllm"),
    ("record says a vllm release", {}, "vllm-ascend", "vllm"),
    ("record says sglang", {}, "sglang", "sglang"),
    ("by what is present", {"sglang:num_running_reqs": 1, "sglang:num_queue_reqs": 0}, None, "sglang"),
    ("unknown engine name, by what is present", {"vllm:num_requests_running": 0}, "tgi", "vllm"),
    ("nothing present", {"other": 1}, None, None),
]


@pytest.mark.parametrize(("values", "hint", "expected"), [c[1:] for c in PICK], ids=[c[0] for c in PICK])
def test_pick_engine(values, hint, expected):
    assert progress.pick_engine(values, hint) == expected


def test_a_sample_without_an_answer_has_no_values():
    assert progress.reading(VLLM, "vllm", 404, "HTTP 404") == {
        "status": 404, "error": "HTTP 404", "engine": "vllm", "work": {}, "progress": {}}


# --- the verdict ------------------------------------------------------------------------------------------


def vllm(running=1.0, waiting=0.0, tokens=10.0, success=1.0, ttft=1.0, itl=9.0):
    values = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
              "vllm:generation_tokens_total": tokens, "vllm:request_success_total": success,
              "vllm:time_to_first_token_seconds_count": ttft, "vllm:inter_token_latency_seconds_count": itl}
    return progress.reading("\n".join(f"{k} {v}" for k, v in values.items() if v is not None), "vllm")


def sglang(running=1.0, queued=0.0, tokens=7.0, requests=1.0, ttft=2.0, itl=30.0):
    values = {"sglang:num_running_reqs": running, "sglang:num_queue_reqs": queued,
              "sglang:generation_tokens_total": tokens, "sglang:num_requests_total": requests,
              "sglang:time_to_first_token_seconds_count": ttft, "sglang:inter_token_latency_seconds_count": itl}
    return progress.reading("\n".join(f"{k} {v}" for k, v in values.items()), "sglang")


def done(seconds=0.4, status=200, error=None, deadline=30.0):
    return {"status": status, "seconds": seconds, "error": error, "deadline_s": deadline}


MISSED = done(seconds=30.0, status=None, error="no answer within 30 s")
REFUSED_KEY = done(seconds=0.01, status=401, error="HTTP 401")
NO_METRICS = progress.reading("", "sglang", 404, "HTTP 404")

# (id, before, after, completion, verdict, words in the reason)
JUDGE = [
    ("ok: the completion finished", vllm(), vllm(), done(), "ok", "finished in 0.4 s"),
    ("ok: one sample, healthy path", None, vllm(), done(), "ok", "finished"),
    ("ok: counters moved, the completion refused", vllm(), vllm(tokens=20), REFUSED_KEY, "ok", "moved by 10"),
    ("idle: no work, nothing moved", vllm(running=0), vllm(running=0), REFUSED_KEY, "idle", "no work present"),
    ("idle: work at one sample only", vllm(running=0), vllm(running=1), REFUSED_KEY, "idle", "no work"),
    ("slow: tokens advanced, deadline missed", vllm(), vllm(tokens=11, itl=10), MISSED, "slow",
     "overloaded, not hung"),
    ("slow: answered after the deadline", vllm(), vllm(tokens=18), done(seconds=31.0), "slow", "after 31.0 s"),
    ("slow: SGLang long generation, no request finished, ITL moved", sglang(), sglang(itl=31), MISSED, "slow",
     "moved by 1"),
    ("slow: only the TTFT count moved", sglang(), sglang(ttft=3), MISSED, "slow", "moved"),
    ("slow: a counter fell (the engine restarted)", vllm(tokens=100), vllm(tokens=3), MISSED, "slow", "moved by"),
    ("slow: a counter first appears", vllm(itl=None), vllm(), MISSED, "slow", "moved by 9"),
    ("hung: work at both samples, nothing moved, deadline missed", vllm(running=2), vllm(running=2), MISSED,
     "hung", "running+waiting 2 -> 2 plus the probe's own completion"),
    ("hung: the probe's own request is the only work", sglang(running=0), sglang(running=0), MISSED, "hung",
     "did not finish within its 30 s deadline"),
    ("hung: queued work, nothing moved, completion refused", vllm(running=0, waiting=4),
     vllm(running=0, waiting=4), REFUSED_KEY, "hung", "answered HTTP 401"),
    ("no-metrics: SGLang without --enable-metrics", NO_METRICS, NO_METRICS, MISSED, "no-metrics",
     "/metrics answered HTTP 404"),
    ("no-metrics: the completion finished, still none", None, NO_METRICS, done(), "no-metrics", "--enable-metrics"),
    ("no-metrics: 200 but no engine counters", progress.reading("up 1"), progress.reading("up 1"), MISSED,
     "no-metrics", "lists none of vllm:generation_tokens_total"),
    ("no-metrics: the second sample got no answer", vllm(), progress.reading("", "vllm", None, "timed out"),
     MISSED, "no-metrics", "answered timed out"),
    ("no-metrics: nothing read", None, None, MISSED, "no-metrics", "was not read"),
]


@pytest.mark.parametrize(("before", "after", "completion", "verdict", "words"), [c[1:] for c in JUDGE],
                         ids=[c[0] for c in JUDGE])
def test_judge(before, after, completion, verdict, words):
    out = progress.judge(before, after, 10.0, completion)
    assert (out["verdict"], words in out["reason"]) == (verdict, True), out["reason"]
    evidence = out["evidence"]
    assert (evidence["before"], evidence["after"], evidence["completion"]) == (before, after, completion)
    assert evidence["window_s"] == 10.0
    json.dumps(out)  # the module returns it


def test_every_verdict_has_a_case_and_a_fix():
    assert {c[4] for c in JUDGE} == set(progress.VERDICTS)
    assert set(progress.FIXES) == {"hung", "slow", "no-metrics"}
    assert progress.FIXES["hung"] == ("drain the entry and restart every rank of the instance: "
                                      "ansible-playbook -i INV playbooks/recover.yml")


def test_the_evidence_shows_each_counter_of_both_samples():
    out = progress.judge(vllm(), vllm(tokens=15), 10.0, MISSED)
    assert out["evidence"]["before"]["progress"]["vllm:generation_tokens_total"] == 10.0
    assert out["evidence"]["after"]["progress"]["vllm:generation_tokens_total"] == 15.0
    assert out["evidence"]["delta"]["vllm:generation_tokens_total"] == 5.0


# (id, completion, state)
STATES = [
    ("200 in time", done(), "completed"),
    ("200 at the deadline", done(seconds=30.0), "completed"),
    ("200 late", done(seconds=30.5), "missed"),
    ("still out", MISSED, "missed"),
    ("refused quickly", done(seconds=0.0, status=None, error="Connection refused"), "failed"),
    ("HTTP 500", done(seconds=2.0, status=500, error="HTTP 500"), "failed"),
    ("none sent", None, "none"),
]


@pytest.mark.parametrize(("completion", "state"), [c[1:] for c in STATES], ids=[c[0] for c in STATES])
def test_completion_state(completion, state):
    assert progress.completion_state(completion) == state


# --- properties -------------------------------------------------------------------------------------------

_PROM_ALPHABET = st.sampled_from(list('abc:_{}="\\, \t#\n0123456789.+-eEInfNa'))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.text(_PROM_ALPHABET)))
def test_parse_never_raises_on_any_text(text):
    for name, labels, value in progress.samples(text):
        assert isinstance(name, str) and isinstance(labels, dict) and isinstance(value, float)
    assert all(math.isfinite(v) for v in progress.totals(text).values())
    progress.reading(text)


_NAMES = st.sampled_from(["vllm:generation_tokens_total", "vllm:num_requests_running", "x_total", "y_count"])
_VALUES = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9)
_LABEL_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_NAMES, st.dictionaries(st.sampled_from(["a", "b", "le"]), _LABEL_VALUES, max_size=3),
                          _VALUES), max_size=12))
def test_written_samples_read_back_and_add_up(written):
    def escape(v):
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    text = "\n".join(name + "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "} " + repr(value)
                     for name, labels, value in written)
    assert [(n, lb) for n, lb, _ in progress.samples(text)] == [(n, lb) for n, lb, _ in written]
    totals = progress.totals(text)
    for name in {n for n, _, _ in written}:
        assert totals[name] == pytest.approx(sum(v for n, _, v in written if n == name), abs=1e-6)


_COUNTS = st.floats(min_value=0, max_value=1e6, allow_nan=False)
_READINGS = st.builds(vllm, running=_COUNTS, waiting=_COUNTS, tokens=_COUNTS, success=_COUNTS, ttft=_COUNTS,
                      itl=_COUNTS)
_STATUSES = st.sampled_from([None, 200, 401, 500])
_COMPLETIONS = st.one_of(st.none(), st.builds(done, seconds=st.floats(0, 100), status=_STATUSES,
                                              deadline=st.floats(0.1, 60)))


@settings(max_examples=300, deadline=None)
@given(_READINGS, _READINGS, _COMPLETIONS, st.sampled_from(sorted(progress.ENGINES["vllm"]["progress"])),
       st.floats(min_value=1, max_value=1e3))
def test_a_counter_that_increased_is_never_hung(before, after, completion, name, more):
    after = dict(after, progress=dict(after["progress"], **{name: before["progress"][name] + more}))
    out = progress.judge(before, after, 10.0, completion)
    assert out["verdict"] != "hung"
    assert out["verdict"] in progress.VERDICTS


@settings(max_examples=200, deadline=None)
@given(_READINGS, _READINGS, st.floats(0, 30))
def test_a_completion_back_in_time_is_never_hung_or_slow(before, after, seconds):
    assert progress.judge(before, after, 10.0, done(seconds=seconds))["verdict"] == "ok"


# --- the sampler: completion in the background, one sample or two ----------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class FakeJob:
    """A completion that answers ``answer`` ``takes`` seconds after it starts, on the fake clock."""

    def __init__(self, fn, clock, takes, answer):
        self.clock, self.started, self.takes, self.answer = clock, clock(), takes, answer

    @property
    def value(self):
        return self.answer if self.clock() - self.started >= self.takes else None

    def wait(self, timeout):
        end = self.started + self.takes
        self.clock.now = min(end, self.clock.now + max(0.0, timeout)) if self.clock.now < end else self.clock.now
        return self.clock.now >= end

    def outcome(self, deadline_s, clock):
        if self.value is None:
            return done(clock() - self.started, None, f"no answer within {deadline_s:g} s", deadline_s)
        return done(self.takes, self.answer[0], None if self.answer[0] == 200 else self.answer[2], deadline_s)


ANSWER = (200, b'{"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}}', "HTTP 200")


def observe(takes, window, always=False, answer=ANSWER, deadline=30.0):
    clock, calls = Clock(), []

    def get(method, url, headers=None, body=None, timeout=10.0):
        calls.append((url.rsplit("/", 1)[-1], clock()))
        return 200, b"vllm:generation_tokens_total 1\n", "HTTP 200"

    out = progress.observe(get, "http://n", "m", {}, "vllm", "hi", 1, deadline, window, always=always, clock=clock,
                           sleep=clock.sleep, spawn=lambda fn, c: FakeJob(fn, c, takes, answer))
    return out, calls


# (id, completion takes, window, always, metrics sample times, window measured, completion state)
OBSERVE = [
    ("healthy path: one sample after the completion", 0.5, 10.0, False, [0.5], 0.0, "completed"),
    ("missed: two samples from the deadline on", 99.0, 10.0, False, [30.0, 40.0], 10.0, "missed"),
    ("missed, window off: no sample", 99.0, 0.0, False, [], 0.0, "missed"),
    ("refused: no sample", 0.1, 10.0, False, [], 0.0, "failed"),
    ("hang_check: the window while the completion runs", 0.5, 10.0, True, [0.0, 10.0], 10.0, "completed"),
    ("hang_check, slow completion: then its deadline", 25.0, 10.0, True, [0.0, 10.0], 10.0, "completed"),
    ("hang_check, hung: deadline after the window", 99.0, 10.0, True, [0.0, 10.0], 10.0, "missed"),
]


@pytest.mark.parametrize(("takes", "window", "always", "times", "measured", "state"), [c[1:] for c in OBSERVE],
                         ids=[c[0] for c in OBSERVE])
def test_observe(takes, window, always, times, measured, state):
    answer = (None, b"", "Connection refused") if state == "failed" else ANSWER
    out, calls = observe(takes, window, always, answer)
    assert [t for what, t in calls if what == "metrics"] == times
    assert (out["window_s"], progress.completion_state(out["completion"])) == (measured, state)
    assert (out["before"] is None, out["after"] is None) == (len(times) < 2, not times)
    assert (out["body"] is not None) == (state == "completed")


# --- the words both the health probe and doctor begin with -----------------------------------------------

# (id, record, place)
PLACES = [
    ("single node", {"port": 8000}, "http://n:8000"),
    ("entry of an instance", {"instance": {"name": "ds", "nodes": ["n1", "n2"], "head": "n1", "entry": True}},
     "http://n:8000 (instance ds, entry n1, ranks n1, n2)"),
    ("not a record", None, "http://n:8000"),
]


@pytest.mark.parametrize(("record", "place"), [c[1:] for c in PLACES], ids=[c[0] for c in PLACES])
def test_where(record, place):
    assert progress.where("http://n:8000", record) == place


def test_headline_names_the_verdict_and_for_no_metrics_the_completion_too():
    hung = progress.judge(vllm(), vllm(), 10.0, MISSED)
    assert progress.headline(hung, "X").startswith("engine hung at X: no progress counter moved in 10.0 s")
    bare = progress.judge(NO_METRICS, NO_METRICS, 10.0, MISSED)
    assert progress.headline(bare, "X").startswith(
        "engine no-metrics at X: the completion did not finish within its 30 s deadline; the engine exports no")
