"""The monitoring stage's rules (roles/monitoring/files/atlas-rules.yml): checked and unit-tested by promtool
(tests/fixtures/monitoring/atlas-rules.test.yml: every alert firing and not firing), and held to the names the
engines and exporters export, the scrape jobs the stage generates and the hang rule of module_utils/progress.py."""

from __future__ import annotations

import re
import shutil
import subprocess

import yaml
from ansible_collections.atlas.serving.plugins.module_utils import progress
from ansible_collections.atlas.serving.plugins.plugin_utils import monitoring as mon

from support.monitoring_names import PROMTOOL, ROOT, RULES, exported, needs_promtool, promql_names, recorded, rules

TESTS = ROOT / "tests/fixtures/monitoring/atlas-rules.test.yml"
# The fleet of the promtool tests: SLO thresholds for n1 and n3 (n4 is rank 1 of n3's instance), none for n2.
FLEET = ["n1", "n2", "n3", "n4"]
INSTANCES = {"big": {"nodes": ["n3", "n4"]}}
SLOS = {"n1": {"ttft_ms": 1000, "tpot_ms": 100}, "n3": {"ttft_ms": 1000, "tpot_ms": 100}}


def _promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def _slo_file(path):
    path.write_text(yaml.safe_dump(mon.slo_rules(FLEET, INSTANCES, SLOS, {}), sort_keys=False))
    return path


@needs_promtool
def test_promtool_checks_the_rules_and_the_generated_thresholds(tmp_path):
    for path in (RULES, _slo_file(tmp_path / "atlas-slo.yml")):
        run = _promtool("check", "rules", str(path))
        assert run.returncode == 0, run.stdout + run.stderr
        assert "SUCCESS" in run.stdout


@needs_promtool
def test_promtool_unit_tests_of_every_alert_pass(tmp_path):
    shutil.copy(RULES, tmp_path / "atlas-rules.yml")
    shutil.copy(TESTS, tmp_path / TESTS.name)
    _slo_file(tmp_path / "atlas-slo.yml")
    run = _promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


@needs_promtool
def test_the_promtool_tests_can_fail(tmp_path):
    """A hang rule that read only the generated tokens (SGLang counts them when a request finishes) would call
    a long generation hung: the tests see it."""
    text = RULES.read_text()
    broken = re.sub(r'\n\s+or label_replace\(increase\((vllm|sglang):(time_to_first_token|inter_token_latency)'
                    r'_seconds_count\[5m\]\), "counter", "\w+", "", ""\)', "", text)
    assert broken != text
    (tmp_path / "atlas-rules.yml").write_text(broken)
    shutil.copy(TESTS, tmp_path / TESTS.name)
    _slo_file(tmp_path / "atlas-slo.yml")
    run = _promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert run.returncode != 0 and "alertname: AtlasInstanceHung" in run.stdout + run.stderr


def _alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def test_every_alert_has_a_firing_and_a_not_firing_promtool_case():
    cases: dict[str, set[bool]] = {}
    for test in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    assert set(cases) == set(_alerts()), "each alert of atlas-rules.yml needs cases in atlas-rules.test.yml"
    assert {name: seen for name, seen in cases.items() if seen != {True, False}} == {}


def test_every_alert_waits_has_a_severity_and_names_where_and_the_fix():
    for name, rule in _alerts().items():
        assert re.fullmatch(r"\d+[smh]", str(rule.get("for", ""))), name
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        summary, description = rule["annotations"]["summary"], rule["annotations"]["description"]
        for label in ("node", "instance", "branch"):
            assert f"$labels.{label}" in summary, (name, label)
        assert "Fix:" in description, name


def test_every_metric_the_rules_use_is_exported_or_recorded():
    known = exported() | recorded()
    used = {n for r in rules() for n in promql_names(r["expr"])}
    assert used - known == set(), "add the name, with its source, to tests/fixtures/monitoring/metrics.yml"
    assert {"npu_chip_info_health_status", "npu_chip_info_link_status",
            "npu_chip_info_hbm_ecc_double_bit_error_cnt", "up"} <= used


def test_the_jobs_the_rules_name_are_the_jobs_the_stage_generates():
    jobs = set()
    for rule in rules():
        for op, value in re.findall(r'job\s*(=~|=)\s*"([^"]*)"', rule["expr"]):
            jobs |= set(value.split("|")) if op == "=~" else {value}
    assert jobs and jobs <= set(mon.JOBS.values())


def test_the_hang_rules_read_every_counter_and_gauge_of_progress_py():
    """One rule of progress, two implementations (the probe's progress.py, Prometheus's rules): the same names."""
    engines = progress.ENGINES
    by_record = {r["record"]: promql_names(r["expr"]) for r in rules() if "record" in r}
    assert by_record["atlas:engine_progress:increase5m"] == {n for e in engines.values() for n in e["progress"]}
    assert by_record["atlas:engine_work:sum"] == {n for e in engines.values() for n in e["work"]}
    hung = _alerts()["AtlasInstanceHung"]["expr"]
    assert promql_names(hung) == {"atlas:engine_progress:increase5m", "atlas:engine_work:sum"}


def test_every_series_aggregates_to_the_target_labels():
    for rule in rules():
        for clause in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            labels = [x.strip() for x in clause.split(",")]
            assert [x for x in labels if x != "le"] == list(mon.LABELS), rule.get("record") or rule.get("alert")


def test_the_name_extraction_sees_names_and_skips_the_rest():
    expr = ('sum by (le, node) (rate(a:b_bucket{x="y", job=~"p|q"}[5m]) or rate(c_total[1m:10s])) > on (node) '
            'group_left (slo) d offset 5m and label_replace(e, "f", "g", "", "")')
    assert promql_names(expr) == {"a:b_bucket", "c_total", "d", "e"}
