"""The fleet dashboard (roles/monitoring/files/grafana/atlas-fleet.json): importable into Grafana, every expression
valid PromQL (promtool), every metric it reads exported by the lab's engines and exporters or recorded by the
rules, every panel narrowed to the chosen branches, and the panels the fleet needs."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from support.monitoring_names import PROMTOOL, ROOT, exported, needs_promtool, promql_names, recorded

DASHBOARD = ROOT / "roles/monitoring/files/grafana/atlas-fleet.json"
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


def _doc() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels() -> list[dict]:
    return [p for p in _doc()["panels"] if p["type"] != "row"]


def _exprs() -> list[str]:
    return [t["expr"] for p in _panels() for t in p["targets"]]


def _variable_exprs() -> list[str]:
    out = []
    for var in _doc()["templating"]["list"]:
        match = _LABEL_VALUES.match(var["query"])
        assert match, f"variable {var['name']}: label_values(<selector>, <label>) expected"
        out.append(match.group(1))
    return out


def test_it_imports_with_a_prometheus_data_source_chosen_at_import():
    doc = _doc()
    assert doc["uid"] == "atlas-fleet" and doc["title"]
    assert [i["name"] for i in doc["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert panel["targets"] and all(t["refId"] for t in panel["targets"]), panel["title"]
    assert {v["name"] for v in doc["templating"]["list"]} == {"branch", "instance", "release"}


def test_every_metric_it_reads_is_exported_or_recorded():
    used = {n for e in _exprs() + _variable_exprs() for n in promql_names(e)}
    assert used - (exported() | recorded()) == set(), "add the name, with its source, to monitoring/metrics.yml"


def test_the_panels_the_fleet_needs():
    used = {n for e in _exprs() for n in promql_names(e)}
    assert {"atlas:engine_requests:rate5m", "atlas:engine_ttft_seconds:p95_5m", "atlas:engine_tpot_seconds:p95_5m",
            "atlas:engine_generation_tokens:rate5m", "atlas:engine_kv_cache_usage:ratio",
            "atlas:engine_requests_running:sum", "atlas:engine_requests_waiting:sum", "npu_chip_info_health_status",
            "npu_chip_info_hbm_used_memory", "npu_chip_info_utilization", "up"} <= used
    release = [e for e in _exprs() if re.search(r"\bby \(release\b", e)]
    assert len(release) >= 3  # the release comparison: TTFT, TPOT, tokens per second per release


def test_every_panel_follows_the_branch_choice():
    assert [e for e in _exprs() if 'branch=~"$branch"' not in e] == []


@needs_promtool
def test_every_expression_is_valid_promql(tmp_path):
    """promtool parses each expression as a recording rule, Grafana's variables replaced by values."""
    def concrete(expr: str) -> str:
        return expr.replace("$__rate_interval", "1m").replace("$branch", ".*").replace("$instance", ".*") \
            .replace("$release", ".*")
    rules = [{"record": f"dashboard:expr_{i}", "expr": concrete(e)} for i, e in enumerate(_exprs() + _variable_exprs())]
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
