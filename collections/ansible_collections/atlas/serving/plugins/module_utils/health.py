# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The health probe of a serving node, in one module call.

What the probe proves, in order (each step names the node's state and the fix when it fails):

1. the service record the serving stage wrote can be read (engine, release, port, model);
2. the systemd unit is active;
3. ``GET /health`` answers 200 within the timeout, polled on the node itself (a poll is a
   local HTTP request, not a round trip from the controller); a unit that fails or stops while
   it is awaited ends the wait at once, instead of at the timeout;
4. ``GET /v1/models`` lists the served model name;
5. ``POST /v1/completions`` returns one choice with text and ``usage.completion_tokens >= 1`` within
   ``completion_deadline_s``. One that misses it is judged by two ``/metrics`` samples ``hang_window_s``
   apart (module_utils ``progress``): ``engine hung`` (work present, no progress counter moved: vLLM's
   ``/health`` stays 200 through a hung collective) or ``engine slow`` (tokens still advancing:
   overloaded). The result's ``progress`` holds the verdict and its evidence; a healthy probe takes one
   sample only, unless ``hang_check`` asks for the window while the completion runs.

A non-head rank of a multi-node instance (the record's ``instance.entry`` is false) serves no HTTP:
steps 3-5 are skipped there (``headless: true`` in the result); its instance is probed on its head.

Both engines answer these endpoints with these shapes (vLLM's OpenAI server and SGLang's
``sglang.launch_server``; docs/engines.md). Requests never go through a proxy: the probe asks
the node's own engine. Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import json
import time

# request: one HTTP request to the engine (it lives with the sampler, which runs on nodes alone too).
from ansible_collections.atlas.serving.plugins.module_utils.progress import (
    FIXES,
    completion_state,
    describe_completion,
    headline,
    judge,
    local_url,
    observe,
    request,
    where,
)


class ProbeError(Exception):
    """The node is not healthy; the message names what failed and where to look."""


class HangError(ProbeError):
    """The completion missed its deadline (or the window found no progress under work): ``progress`` is
    the verdict (``hung``, ``slow``, ``no-metrics``), its reason and its evidence."""

    def __init__(self, message, progress):
        super().__init__(message)
        self.progress = progress


def read_record(path):
    """The service record as a dict, or None when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ProbeError(f"{path} cannot be read ({exc}): run the serving stage (playbooks/serving.yml) "
                         "to write it again") from None
    missing = [k for k in ("port", "served_model_name", "release_id") if k not in record]
    if not isinstance(record, dict) or missing:
        raise ProbeError(f"{path} is not a service record (missing {', '.join(missing) or 'everything'}): "
                         "run the serving stage (playbooks/serving.yml) to write it again")
    return record


def _json(data):
    try:
        return json.loads(data)
    except ValueError:
        return None


def wait_health(url, service, unit_state, timeout_s, poll_s, clock=time.monotonic, sleep=time.sleep,
                get=request):
    """Poll ``url/health`` until it answers 200. Returns (status, seconds waited). Raises
    ProbeError at the deadline, or as soon as the unit is failed or inactive (nothing restarts it)."""
    start = clock()
    deadline = start + timeout_s
    while True:
        status, _body, detail = get("GET", f"{url}/health", timeout=min(10.0, max(timeout_s, 1.0)))
        if status == 200:
            return status, round(clock() - start, 1)
        state = unit_state()
        if state.get("ActiveState") in ("failed", "inactive"):
            raise ProbeError(f"{service} is {state.get('ActiveState')} ({state.get('SubState', '?')}) while "
                             f"{url}/health was awaited (last answer: {detail}). "
                             f"See `journalctl -u {service}`.")
        now = clock()
        if now >= deadline:
            error = ProbeError(f"{url}/health did not answer 200 within {timeout_s:g} s (last answer: {detail}); "
                               f"{service} is {state.get('ActiveState', '?')} ({state.get('SubState', '?')}). "
                               f"See `journalctl -u {service}`; an engine that loads large weights needs a longer "
                               "health_timeout_s.")
            # the engine listens: it answered, or took the connection and gave no answer in time
            error.listening = status is not None or "timed out" in str(detail)
            raise error
        sleep(min(poll_s, deadline - now))


def check_models(url, model, headers, get=request):
    """The ids /v1/models lists; raises unless it answers 200 and lists ``model``."""
    status, data, detail = get("GET", f"{url}/v1/models", headers=headers, timeout=30)
    if status != 200:
        hint = " (the API key was refused: check serving_api_keys)" if status == 401 else ""
        raise ProbeError(f"{url}/v1/models answered {detail}{hint}")
    ids = [m.get("id") for m in ((_json(data) or {}).get("data") or []) if isinstance(m, dict)]
    if model not in ids:
        raise ProbeError(f"{url}/v1/models does not list the served model name {model!r} (it lists {ids}): "
                         "the engine serves another name than serving_served_model_name")
    return ids


def completion_tokens(url, status, data, detail):
    """completion_tokens of the completion's answer; raises unless it has the shape both engines return."""
    data = data or b""
    if status != 200:
        raise ProbeError(f"{url}/v1/completions answered {detail}: {data[:300].decode(errors='replace')}")
    out = _json(data) or {}
    out = out if isinstance(out, dict) else {}
    choices = out.get("choices") if isinstance(out.get("choices"), list) else []
    tokens = (out.get("usage") or {}).get("completion_tokens") if isinstance(out.get("usage"), dict) else None
    if len(choices) != 1 or not isinstance(choices[0], dict) or not isinstance(choices[0].get("text"), str):
        shown = data[:300].decode(errors="replace")
        raise ProbeError(f"{url}/v1/completions did not return one choice with text: {shown}")
    if not isinstance(tokens, int) or tokens < 1:
        raise ProbeError(f"{url}/v1/completions reported completion_tokens {tokens!r}, not at least 1")
    return tokens


def check_hang_options(deadline_s, window_s, hang_check):
    """Raises on option values the hang check cannot use."""
    if not deadline_s or deadline_s <= 0:
        raise ProbeError(f"completion_deadline_s must be above 0 (it is {deadline_s!r})")
    if window_s is None or window_s < 0:
        raise ProbeError(f"hang_window_s must be 0 (off) or more (it is {window_s!r})")
    if hang_check and window_s == 0:
        raise ProbeError("hang_check: true needs a window to sample over: set hang_window_s above 0")


def hang_error(url, record, progress):
    """The ProbeError of a completion that missed its deadline (or of a hung window): ``engine VERDICT at
    WHERE: REASON. Fix: FIX. Evidence: JSON``."""
    evidence = json.dumps(progress["evidence"], sort_keys=True)
    return HangError(f"{headline(progress, where(url, record))}. Fix: {FIXES[progress['verdict']]}. "
                     f"Evidence: {evidence}", progress)


def check_completion(url, model, headers, record, prompt, max_tokens, deadline_s, window_s, hang_check,
                     get=request, clock=time.monotonic, sleep=time.sleep, spawn=None):
    """(completion_tokens, progress) of one completion sent with ``deadline_s`` (module_utils progress,
    :func:`progress.observe`). Raises HangError when it missed the deadline or the window judged the engine
    hung, ProbeError when it answered something else than a completion."""
    seen = observe(get, url, model, headers, record.get("engine"), prompt, max_tokens, deadline_s, window_s,
                   always=hang_check, clock=clock, sleep=sleep, **({"spawn": spawn} if spawn else {}))
    outcome = seen["completion"]
    state = completion_state(outcome)
    if state == "missed" and seen["after"] is None:
        raise ProbeError(f"{url}/v1/completions {describe_completion(outcome)}; the hang check is off "
                         "(hang_window_s 0), so hung and slow are not told apart")
    progress = judge(seen["before"], seen["after"], seen["window_s"], outcome) if seen["after"] is not None else None
    if state == "missed" or (progress and progress["verdict"] == "hung"):
        raise hang_error(url, record, progress)
    tokens = completion_tokens(url, outcome["status"], seen["body"], outcome["error"])
    return tokens, progress


def headless(record):
    """The record's ``instance`` when it is a non-entry rank of a multi-node instance, else None."""
    instance = record.get("instance") if isinstance(record, dict) else None
    if isinstance(instance, dict) and instance.get("entry") is False:
        return instance
    return None


def probe(record, url, model, service, unit_state, api_key, timeout_s, poll_s, prompt, max_tokens,
          get=request, clock=time.monotonic, sleep=time.sleep, completion_deadline_s=30.0, hang_window_s=10.0,
          hang_check=False, spawn=None):
    """Steps 2-5 of the module docstring; returns the result (without the record)."""
    url = (url or local_url(record)).rstrip("/")
    model = model or record["served_model_name"]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    check_hang_options(completion_deadline_s, hang_window_s, hang_check)
    unit = unit_state()
    if unit.get("ActiveState") != "active":
        raise ProbeError(f"{service} is {unit.get('ActiveState', '?')} ({unit.get('SubState', '?')}). "
                         f"See `journalctl -u {service}`.")
    instance = headless(record)
    if instance is not None:
        # A non-head rank serves no HTTP (vLLM --headless; SGLang rank >= 1 answers a dummy /health):
        # its unit is what this node can show; the instance is probed through its entry, the head.
        return {"url": None, "model": model, "unit": unit, "health": None, "waited_s": 0.0, "models": [],
                "completion_tokens": None, "progress": None, "headless": True, "instance": instance}
    try:
        status, waited = wait_health(url, service, unit_state, timeout_s, poll_s, clock=clock, sleep=sleep, get=get)
    except ProbeError as exc:
        # /health answers, but not 200, or takes the connection and does not answer in time: an engine still
        # loading, or one whose collective hangs (SGLang's rank 0 /health waits up to SGLANG_HEALTH_CHECK_TIMEOUT,
        # 20 s, for its own 1-token generate, then answers 503). Its own counters tell them apart: a hung engine
        # is named hung; anything else keeps the /health failure. A refused connection is an engine not up.
        if not getattr(exc, "listening", False) or not hang_window_s:
            raise
        try:
            check_completion(url, model, headers, record, prompt, max_tokens, completion_deadline_s, hang_window_s,
                             True, get=get, clock=clock, sleep=sleep, spawn=spawn)
        except HangError as hang:
            if hang.progress and hang.progress.get("verdict") == "hung":
                raise hang from None
        except ProbeError:
            pass
        raise
    ids = check_models(url, model, headers, get=get)
    tokens, progress = check_completion(url, model, headers, record, prompt, max_tokens, completion_deadline_s,
                                        hang_window_s, hang_check, get=get, clock=clock, sleep=sleep, spawn=spawn)
    return {"url": url, "model": model, "unit": unit, "health": status, "waited_s": waited, "models": ids,
            "completion_tokens": tokens, "progress": progress}


def parse_show(text):
    """``systemctl show -p A -p B`` output as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
