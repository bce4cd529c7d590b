"""The health probe in one call: each step against a real HTTP server, and the module entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import health

from support.engine_double import engines, metrics

REPO = Path(__file__).resolve().parents[3]
ACTIVE = {"ActiveState": "active", "SubState": "running"}


@pytest.fixture
def engine():
    with engines() as start:
        yield start


def _probe(url, unit=ACTIVE, key="", model="tiny", record=None, **kw):
    record = {"port": 1, "served_model_name": model, "release_id": "r1", "engine": "vllm", **(record or {})}
    return health.probe(record, url, None, "atlas-serving", lambda: dict(unit), key, kw.pop("timeout_s", 5),
                        kw.pop("poll_s", 0.01), "Hello", 4, **kw)


def test_a_healthy_engine_passes_every_step(engine) -> None:
    url, handler = engine(health=[503, 503, 200], key="s3cr3t")
    out = _probe(url, key="s3cr3t")
    assert (out["health"], out["models"], out["completion_tokens"], out["model"]) == (200, ["tiny"], 3, "tiny")
    assert [p for _, p, _ in handler.seen] == ["/health"] * 3 + ["/v1/models", "/v1/completions", "/metrics"]
    assert handler.seen[-2][2] == {"model": "tiny", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    # one /metrics sample on the healthy path: the verdict and its evidence, no window
    assert out["progress"]["verdict"] == "ok" and out["progress"]["evidence"]["before"] is None
    assert out["progress"]["evidence"]["after"]["progress"]["vllm:generation_tokens_total"] == 40.0
    assert out["progress"]["evidence"]["completion"]["status"] == 200


def test_a_refused_key_and_an_unlisted_model_are_named(engine) -> None:
    url, _ = engine(key="right")
    with pytest.raises(health.ProbeError, match=r"/v1/models answered HTTP 401 \(the API key was refused"):
        _probe(url, key="wrong")
    url, _ = engine(models=["other"])
    with pytest.raises(health.ProbeError, match=r"does not list the served model name 'tiny' \(it lists \['other'\]\)"):
        _probe(url)


@pytest.mark.parametrize("completion, why", [
    ({"choices": [], "usage": {"completion_tokens": 1}}, "one choice with text"),
    ({"choices": [{"text": None}], "usage": {"completion_tokens": 1}}, "one choice with text"),
    ({"choices": [{"text": "x"}], "usage": {"completion_tokens": 0}}, "completion_tokens 0"),
    ({"choices": [{"text": "x"}]}, "completion_tokens None"),
])
def test_a_completion_of_the_wrong_shape_fails(engine, completion, why) -> None:
    url, _ = engine(completion=completion)
    with pytest.raises(health.ProbeError, match=why):
        _probe(url)


RECOVER = ("Fix: drain the entry and restart every rank of the instance: "
           "ansible-playbook -i INV playbooks/recover.yml")
INSTANCE = {"instance": {"name": "ds", "nodes": ["n1", "n2"], "rank": 0, "head": "n1", "role": "entry",
                         "entry": True, "mode": "vllm-dp"}}

# (id, /metrics answers in turn, verdict, words in the message)
PAST_THE_DEADLINE = [
    ("hung: work present, nothing moved", [metrics(running=1)], "hung",
     ["no progress counter moved", "running+waiting 1 -> 1", "(instance ds, entry n1, ranks n1, n2)", RECOVER]),
    ("hung: no work in the gauges, the probe's own request", [metrics(running=0)], "hung",
     ["plus the probe's own completion", RECOVER]),
    ("slow: tokens still advancing", [metrics(tokens=40), metrics(tokens=44)], "slow",
     ["moved by 8", "overloaded, not hung", "do not restart it"]),
    ("no-metrics: SGLang without --enable-metrics", [None], "no-metrics",
     ["did not finish within its 0.3 s deadline", "/metrics answered HTTP 404", "--enable-metrics"]),
]


@pytest.mark.parametrize(("served", "verdict", "words"), [c[1:] for c in PAST_THE_DEADLINE],
                         ids=[c[0] for c in PAST_THE_DEADLINE])
def test_a_completion_past_its_deadline_is_judged_over_the_window(engine, served, verdict, words) -> None:
    url, handler = engine(hold_s=60, metrics=served)
    started = time.monotonic()
    with pytest.raises(health.HangError) as caught:
        _probe(url, record=INSTANCE, completion_deadline_s=0.3, hang_window_s=0.2)
    assert time.monotonic() - started < 5, "the deadline and the window, not the completion's 60 s"
    message = str(caught.value)
    assert message.startswith(f"engine {verdict} at {url}"), message
    assert [w for w in words if w not in message] == [], message
    evidence = json.loads(message.split(". Evidence: ", 1)[1])
    assert caught.value.progress["verdict"] == verdict and caught.value.progress["evidence"] == evidence
    assert evidence["completion"] == {**evidence["completion"], "status": None, "deadline_s": 0.3}
    assert evidence["window_s"] >= 0.2 and evidence["before"] and evidence["after"]
    assert [p for _, p, _ in handler.seen][-3:] == ["/v1/completions", "/metrics", "/metrics"]


def test_a_missed_deadline_with_the_window_off_fails_without_a_verdict(engine) -> None:
    url, handler = engine(hold_s=60)
    with pytest.raises(health.ProbeError, match=r"did not finish within its 0.3 s deadline; the hang check is off"):
        _probe(url, completion_deadline_s=0.3, hang_window_s=0)
    assert "/metrics" not in [p for _, p, _ in handler.seen]


def test_hang_check_samples_the_window_while_the_completion_runs(engine) -> None:
    url, handler = engine(metrics=[metrics(tokens=40), metrics(tokens=43)])
    out = _probe(url, hang_check=True, completion_deadline_s=5, hang_window_s=0.2)
    assert out["progress"]["verdict"] == "ok" and out["completion_tokens"] == 3
    assert out["progress"]["evidence"]["delta"]["vllm:generation_tokens_total"] == 3.0
    assert out["progress"]["evidence"]["window_s"] >= 0.2
    assert sorted(p for _, p, _ in handler.seen[-3:]) == ["/metrics", "/metrics", "/v1/completions"]


def test_hang_check_on_a_hung_engine_fails_at_the_deadline(engine) -> None:
    url, _ = engine(hold_s=60, metrics=[metrics(running=2)])
    with pytest.raises(health.HangError, match=r"^engine hung at .*running\+waiting 2 -> 2"):
        _probe(url, hang_check=True, completion_deadline_s=0.5, hang_window_s=0.2)


# (id, completion_deadline_s, hang_window_s, hang_check, message)
BAD_HANG_OPTIONS = [
    ("no deadline", 0, 10, False, r"completion_deadline_s must be above 0 \(it is 0\)"),
    ("negative window", 30, -1, False, r"hang_window_s must be 0 \(off\) or more \(it is -1\)"),
    ("forced check, no window", 30, 0, True, r"hang_check: true needs a window to sample over"),
]


@pytest.mark.parametrize(("deadline", "window", "check", "says"), [c[1:] for c in BAD_HANG_OPTIONS],
                         ids=[c[0] for c in BAD_HANG_OPTIONS])
def test_hang_options_that_cannot_work_fail_before_any_request(engine, deadline, window, check, says) -> None:
    url, handler = engine()
    with pytest.raises(health.ProbeError, match=says):
        _probe(url, completion_deadline_s=deadline, hang_window_s=window, hang_check=check)
    assert handler.seen == []


def test_an_inactive_unit_fails_before_any_request(engine) -> None:
    url, handler = engine()
    says = r"atlas-serving is failed \(failed\)\. See `journalctl -u atlas-serving`"
    with pytest.raises(health.ProbeError, match=says):
        _probe(url, unit={"ActiveState": "failed", "SubState": "failed"})
    assert handler.seen == []


def test_the_wait_ends_at_once_when_the_unit_fails_and_at_the_deadline_otherwise(engine) -> None:
    url, _ = engine(health=[503])
    states = iter([{"ActiveState": "activating", "SubState": "auto-restart"}, {"ActiveState": "failed",
                                                                               "SubState": "failed"}])
    now = [0.0]

    def sleep(s):
        now[0] += s

    says = r"is failed \(failed\) while .*/health was awaited \(last answer: HTTP 503\)"
    with pytest.raises(health.ProbeError, match=says):
        health.wait_health(url, "atlas-serving", lambda: next(states), 600, 1, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 1, "one poll interval, not the timeout"
    now[0] = 0.0
    with pytest.raises(health.ProbeError, match=r"did not answer 200 within 5 s \(last answer: HTTP 503\)"):
        health.wait_health(url, "atlas-serving", lambda: dict(ACTIVE), 5, 2, clock=lambda: now[0], sleep=sleep)
    assert now[0] == 5


def test_no_answer_is_named(engine) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, _, detail = health.request("GET", f"http://127.0.0.1:{port}/health", timeout=1)
    assert status is None and "refused" in detail.lower()


def test_the_record_is_read_or_named(tmp_path: Path) -> None:
    assert health.read_record(str(tmp_path / "none.json")) is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(health.ProbeError, match=r"bad.json cannot be read"):
        health.read_record(str(tmp_path / "bad.json"))
    (tmp_path / "short.json").write_text('{"port": 8000}')
    with pytest.raises(health.ProbeError, match=r"missing served_model_name, release_id"):
        health.read_record(str(tmp_path / "short.json"))


def _module(tmp_path: Path, *extra: str, **args) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"}
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c",
                           "local", "-e", f"ansible_python_interpreter={sys.executable}", *extra,
                           "-m", "atlas.serving.engine_health", "-a", json.dumps(args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    status, result = proc.stdout.split(" => ", 1)
    return {**json.loads(result), "_status": status}


def test_module_on_a_bare_node_passes_in_check_mode_only_and_never_shows_the_key(tmp_path: Path) -> None:
    record = str(tmp_path / "atlas-serving.json")
    check = _module(tmp_path, "--check", record=record, api_key="s3cr3t-key")
    assert "SUCCESS" in check["_status"] and check["record"] is None, check
    run = _module(tmp_path, record=record, api_key="s3cr3t-key")
    assert "FAILED" in run["_status"], run
    assert "the serving stage has not run on this node" in run["msg"]
    assert "s3cr3t-key" not in json.dumps(check) + json.dumps(run)


def test_module_takes_the_hang_options_and_refuses_a_forced_check_without_a_window(tmp_path: Path, engine) -> None:
    url, handler = engine()
    record = tmp_path / "atlas-serving.json"
    record.write_text(json.dumps({"port": 1, "served_model_name": "tiny", "release_id": "r1"}))
    check = _module(tmp_path, "--check", record=str(tmp_path / "none.json"), completion_deadline_s=5.5,
                    hang_window_s=2, hang_check=True)
    assert "SUCCESS" in check["_status"], check
    out = _module(tmp_path, record=str(record), url=url, hang_check=True, hang_window_s=0)
    assert "FAILED" in out["_status"] and "hang_check: true needs a window" in out["msg"], out
    assert out["progress"] is None and handler.seen == []


def test_module_names_a_unit_it_cannot_read_as_not_active(tmp_path: Path, engine) -> None:
    url, handler = engine()
    record = tmp_path / "atlas-serving.json"
    record.write_text(json.dumps({"port": 1, "served_model_name": "tiny", "release_id": "r1"}))
    out = _module(tmp_path, record=str(record), url=url, service="no-such-unit-here")
    assert "FAILED" in out["_status"] and "no-such-unit-here is " in out["msg"], out
    assert "See `journalctl -u no-such-unit-here`" in out["msg"]
    assert out["record"]["release_id"] == "r1" and handler.seen == []


def test_health_503_with_work_stuck_is_named_hung_and_otherwise_keeps_the_health_failure(engine) -> None:
    """SGLang's rank 0 answers /health 503 once its collective hangs: the wait's failure becomes `engine hung`
    when the engine's counters stand still under work; an engine that moves (still loading, say) keeps the
    /health failure; an engine that does not answer at all is never sampled."""
    url, handler = engine(health=[503], hold_s=60, metrics=[metrics(running=2)])
    with pytest.raises(health.HangError, match=r"^engine hung at .*running\+waiting 2 -> 2"):
        _probe(url, timeout_s=0.2, completion_deadline_s=0.3, hang_window_s=0.2)
    assert "/metrics" in [p for _, p, _ in handler.seen]
    url, _ = engine(health=[503], hold_s=60, metrics=[metrics(tokens=40), metrics(tokens=44)])
    with pytest.raises(health.ProbeError, match=r"/health did not answer 200 within 0.2 s \(last answer: HTTP 503\)"):
        _probe(url, timeout_s=0.2, completion_deadline_s=0.3, hang_window_s=0.2)
    url, handler = engine(health=[503], hold_s=60, metrics=[metrics(running=2)])
    with pytest.raises(health.ProbeError, match=r"/health did not answer 200") as caught:
        _probe(url, timeout_s=0.2, completion_deadline_s=0.3, hang_window_s=0)
    assert not isinstance(caught.value, health.HangError)
    assert "/metrics" not in [p for _, p, _ in handler.seen], "the window is off: no sample"


def test_a_health_that_takes_the_connection_and_never_answers_is_sampled_too(engine) -> None:
    """SGLang's rank 0 holds /health up to 20 s while its generate gets no reply: a wait that times out on it
    is checked like a 503; a refused connection is an engine not up, never sampled."""
    url, handler = engine(health=[503], hold_s=60, metrics=[metrics(running=2)])
    answers = iter([(None, b"", "timed out")])

    def get(method, target, headers=None, body=None, timeout=10.0):
        if target.endswith("/health"):
            return next(answers, (None, b"", "timed out"))
        return health.request(method, target, headers=headers, body=body, timeout=timeout)

    with pytest.raises(health.HangError, match=r"^engine hung at "):
        _probe(url, timeout_s=0.2, completion_deadline_s=0.3, hang_window_s=0.2, get=get)
    def refused(method, target, headers=None, body=None, timeout=10.0):
        return None, b"", "[Errno 111] Connection refused"

    with pytest.raises(health.ProbeError, match=r"Connection refused") as caught:
        _probe(url, timeout_s=0.2, completion_deadline_s=0.3, hang_window_s=0.2, get=refused)
    assert not isinstance(caught.value, health.HangError)
