"""The rollout's SLO gate (playbooks/rollout/tasks/slo.yml) on localhost: `atlasctl bench` against a reference
server, and, when the inventory names Prometheus, the node's p95 latency from it (a fake Prometheus API) before
the engine's restart (systemctl is a stand-in answering its start time) and after the bench, recorded beside the
bench's figures. Without a Prometheus nothing of that runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.ansible_run import ansible_env, run_playbook
from support.prometheus import FakePrometheus
from support.refserver import RefServer

pytestmark = pytest.mark.role

REPO = Path(__file__).resolve().parents[2]
STARTED = 1700000000
PLAYBOOK = f"""
- name: SLO gate test
  hosts: n1
  gather_facts: false
  tasks:
    - name: the gate
      ansible.builtin.include_tasks: {REPO}/playbooks/rollout/tasks/slo.yml
    - name: what it measured
      ansible.builtin.copy:
        content: "{{{{ rollout_slo_measured | to_json }}}}"
        dest: "{{{{ measured_file }}}}"
        mode: "0644"
      delegate_to: localhost
"""
SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
case "$1" in show) echo '{started}';; esac
"""
ANSWERS = {"atlas:engine_ttft_seconds": [({"node": "n1"}, "0.2")],
           "time_to_first_token_seconds_bucket": [({"node": "n1"}, "0.2"), ({"node": "n2"}, "9")],
           "inter_token_latency_seconds_bucket": [({"node": "n1"}, "0.02")]}


def _gate(tmp: Path, engine_url: str, prometheus_port: int | None,
          started: str = f"@{STARTED}") -> tuple[subprocess.CompletedProcess, dict, list]:
    (tmp / "playbooks").mkdir(exist_ok=True)
    for part in ("tools", "collections"):  # slo.yml runs atlasctl and its collection from <playbook_dir>/..
        if not (tmp / part).exists():
            (tmp / part).symlink_to(REPO / part)
    (tmp / "playbooks/gate.yml").write_text(PLAYBOOK)
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "systemctl").write_text(SYSTEMCTL.format(started=started))
    (bindir / "systemctl").chmod(0o755)
    node = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_host": "127.0.0.1",
            "health_probe": {"record": {"port": int(engine_url.rsplit(":", 1)[1])}, "model": "refmodel"},
            "serving_profile_resolved": {"slo": {"ttft_ms": 5000}}, "serving_service_name": "atlas-serving",
            "rollout_bench_requests": 4, "rollout_bench_duration_s": 20, "measured_file": str(tmp / "measured.json")}
    groups = {"fleet": {"hosts": {"n1": node}}}
    if prometheus_port is not None:
        groups["monitoring"] = {"hosts": {"mon": {"ansible_host": "127.0.0.1", "monitoring_tls": False,
                                                  "monitoring_prometheus_port": prometheus_port}}}
    (tmp / "inventory.json").write_text(json.dumps({"all": {"children": groups}}))
    env = ansible_env(tmp, path=bindir, ATLAS_STATE_DIR=str(tmp / "state"),
                      FAKE_SYSTEMCTL_LOG=str(tmp / "systemctl.log"))
    result = run_playbook(tmp / "inventory.json", tmp / "playbooks/gate.yml", cwd=tmp, env=env)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    calls = (tmp / "systemctl.log").read_text().splitlines() if (tmp / "systemctl.log").is_file() else []
    return result, json.loads((tmp / "measured.json").read_text()), calls


def test_without_prometheus_the_gate_is_the_bench_alone(tmp_path: Path) -> None:
    with RefServer(ttft_ms=2, itl_ms=1) as engine:
        result, measured, calls = _gate(tmp_path, engine.url, None)
    assert measured["completed"] == 4 and measured["violations"] == []
    assert "prometheus" not in measured and calls == []
    assert not re.search(r"TASK \[Rollout \| slo \| p95 TTFT.*\n(ok|changed)", result.stdout)


def test_with_prometheus_the_live_latency_before_and_after_is_recorded(tmp_path: Path) -> None:
    with RefServer(ttft_ms=2, itl_ms=1) as engine, FakePrometheus(ANSWERS) as prom:
        _result, measured, calls = _gate(tmp_path, engine.url, int(prom.url.rsplit(":", 1)[1]))
    assert measured["completed"] == 4 and measured["violations"] == []  # the gate itself is the bench's
    live = measured["prometheus"]
    assert (live["url"], live["window"], live["error"]) == (prom.url, "5m", None)
    assert live["before"] == live["after"] == {"ttft_p95_ms": 200.0, "tpot_p95_ms": 20.0, "kv_cache_pct": None,
                                               "requests_running": None}
    assert calls == ["show --timestamp=unix -p ExecMainStartTimestamp --value atlas-serving"]
    times = sorted({q.get("time", "now") for q in prom.queries})
    assert times == [f"{STARTED}.000", "now"]  # the window before the restart, and the one after the bench


@pytest.mark.parametrize("started", ["@1700000000", ""])
def test_prometheus_not_answering_is_a_note(tmp_path: Path, started: str) -> None:
    with RefServer(ttft_ms=2, itl_ms=1) as engine:
        with FakePrometheus() as prom:
            port = int(prom.url.rsplit(":", 1)[1])
        _result, measured, _calls = _gate(tmp_path, engine.url, port, started)  # the fake is closed: nothing answers
    assert measured["completed"] == 4
    assert measured["prometheus"]["before"] is None and measured["prometheus"]["after"] is None
    assert "did not answer" in measured["prometheus"]["error"]


def test_the_report_shows_the_live_latency_before_and_after() -> None:
    from atlasctl import rollout

    live = {"url": "http://p:9090", "window": "5m", "error": None,
            "before": {"ttft_p95_ms": 180.4, "tpot_p95_ms": 21.0}, "after": {"ttft_p95_ms": 250.0, "tpot_p95_ms": None}}
    assert rollout.live_brief(live) == "TTFT 180ms -> 250ms, TPOT 21ms -> - (5m)"
    assert rollout.live_brief({"error": "Prometheus at http://p:9090 did not answer"}).startswith("none: Prometheus")
    assert rollout.live_brief(None) == rollout.live_brief({}) == ""
    report = {"release": "r2", "status": "ok", "inventory": "inv", "started_at": "t", "seconds": 1.0,
              "plan": [{"name": "canary", "hosts": ["n1"]}], "completed": ["canary"], "wave_seconds": {},
              "failure": None, "nodes": [{"host": "n1", "wave": "canary", "previous": "r1", "release": "r2",
                                          "slo": {"metrics": {}, "prometheus": live}}]}
    page = rollout.html_report(report)
    assert "<th>Prometheus p95 before -> after</th>" in page and "TTFT 180ms -&gt; 250ms" in page
