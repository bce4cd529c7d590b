"""Live figures from Prometheus (atlasctl.prometheus, `atlasctl live`, the live columns of `atlasctl health`), against
a fake Prometheus HTTP API on 127.0.0.1."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from atlasctl import cli, exitcodes, prometheus
from atlasctl.commands import health
from atlasctl.runner import HostResult, RunResult
from support import tls_fixtures
from support.prometheus import FakePrometheus


def _closed_url() -> str:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()
    return url


def test_the_figures_are_the_recording_rules_over_the_window_asked():
    rules = prometheus.recording_rules()
    assert prometheus.expression("atlas:engine_ttft_seconds:p95_5m") == rules["atlas:engine_ttft_seconds:p95_5m"]
    ten = prometheus.expression("atlas:engine_ttft_seconds:p95_5m", "10m")
    assert "[10m]" in ten and "[5m]" not in ten
    assert prometheus.expression("atlas:engine_kv_cache_usage:ratio", "10m") == \
        rules["atlas:engine_kv_cache_usage:ratio"]  # a gauge: no window
    with pytest.raises(prometheus.UsageError, match="window '5 m' is not a Prometheus duration"):
        prometheus.expression("atlas:engine_ttft_seconds:p95_5m", "5 m")


def test_live_figures_per_node_scaled_and_nan_as_none():
    with FakePrometheus() as fake:
        result = prometheus.live(fake.url, "10m", at=1700000000.5)
    assert result.error is None
    assert result.nodes == {
        "n1": {"ttft_p95_ms": 250.0, "tpot_p95_ms": 31.0, "kv_cache_pct": 50.0, "requests_running": 3.0},
        "n2": {"ttft_p95_ms": None, "tpot_p95_ms": None, "kv_cache_pct": 97.0, "requests_running": 0.0},
    }
    assert [q["query"].split(" (")[0] for q in fake.queries] == ["max by", "max by", "max by", "sum by"]
    assert all(q["time"] == "1700000000.500" for q in fake.queries)
    assert "[10m]" in fake.queries[0]["query"]
    assert prometheus.cells(result.nodes["n1"]) == {"ttft_p95_ms": "250ms", "tpot_p95_ms": "31ms",
                                                    "kv_cache_pct": "50%", "requests_running": "3"}
    assert prometheus.cells(None)["ttft_p95_ms"] == "-"


def test_prometheus_not_answering_or_refusing_is_a_note():
    url = _closed_url()
    result = prometheus.live(url)
    assert result.nodes == {} and f"Prometheus at {url} did not answer" in result.error
    with FakePrometheus(fail="kv_cache") as fake:
        result = prometheus.live(fake.url)
    assert "refused" in result.error and "parse error" in result.error


@pytest.mark.parametrize(("document", "url"), [
    ({"_meta": {"hostvars": {"n1": {}}}}, ""),
    ({"_meta": {"hostvars": {"n1": {}, "mon": {"ansible_host": "10.0.0.9"}}}, "monitoring": {"hosts": ["mon"]}},
     "https://10.0.0.9:9090"),
    ({"_meta": {"hostvars": {"n1": {}, "mon": {"ansible_host": "10.0.0.9", "monitoring_tls": False}}},
      "monitoring": {"hosts": ["mon"]}}, "http://10.0.0.9:9090"),
    ({"_meta": {"hostvars": {"n1": {"monitoring_prometheus_url": "http://prom:9090/"},
                             "mon": {"ansible_host": "10.0.0.9"}}}, "monitoring": {"hosts": ["mon"]}},
     "http://prom:9090"),
])
def test_where_the_inventory_s_prometheus_is(document, url):
    assert prometheus.url_of(document) == url


def test_for_an_inventory_read_as_ansible_reads_it(tmp_path: Path):
    with FakePrometheus() as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
            "atlas_nodes": {"hosts": {"n1": {}, "n2": {}}},
            "monitoring": {"hosts": {"mon": {"ansible_host": "127.0.0.1", "monitoring_prometheus_port": port,
                                             "monitoring_tls": False}}}}}}))
        result = prometheus.for_inventory(tmp_path / "hosts.yml")
    assert result.url == fake.url and result.nodes["n1"]["requests_running"] == 3.0
    (tmp_path / "bare.yml").write_text(yaml.safe_dump({"all": {"hosts": {"n1": {}}}}))
    assert prometheus.for_inventory(tmp_path / "bare.yml") is None


def test_over_https_with_the_site_ca_and_the_api_user_s_password(tmp_path: Path):
    """The inventory names the CA and the password file; the password never leaves the file but for the header."""
    tls = tls_fixtures.make(tmp_path)
    (tmp_path / "api-password").write_text("s3cret-api-password\n")
    with FakePrometheus(tls=tls, auth=("atlas", "s3cret-api-password")) as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        mon = {"ansible_host": "127.0.0.1", "monitoring_prometheus_port": port, "atlas_tls_ca_file": str(tls["ca"]),
               "monitoring_api_password_file": str(tmp_path / "api-password")}
        (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {
            "atlas_nodes": {"hosts": {"n1": {}}}, "monitoring": {"hosts": {"mon": mon}}}}}))
        result = prometheus.for_inventory(tmp_path / "hosts.yml")
        assert result.error is None and result.url == fake.url and result.nodes["n1"]["requests_running"] == 3.0
        (tmp_path / "api-password").write_text("wrong\n")
        refused = prometheus.for_inventory(tmp_path / "hosts.yml")
        assert "HTTP 401" in refused.error and not refused.nodes
        untrusted = prometheus.live(prometheus.Access(fake.url, None, "atlas", str(tmp_path / "api-password")))
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.error, untrusted.error
        assert cli.main(["live", "--prometheus", fake.url, "--ca-file", str(tls["ca"]), "--user", "atlas",
                         "--password-file", str(tmp_path / "api-password"), "--json"]) == exitcodes.ENVIRONMENT


def _run_result(prometheus_url: str = "") -> RunResult:
    """A health run; the fleet table play set health_prometheus on the host it ran on (run_once)."""
    facts = {"health_report": {"host": "n1", "service": "active", "health": "200"}}
    if prometheus_url is not None:
        facts["health_prometheus"] = {"url": prometheus_url, "ca_file": "", "user": "atlas", "password_file": ""}
    return RunResult("successful", 0, {
        "n1": HostResult("n1", facts=facts),
        "n2": HostResult("n2", facts={"health_report": {"host": "n2", "service": "active", "health": "200"}}),
    }, Path("/tmp"), 1.0)


def test_health_table_gains_the_live_columns():
    with FakePrometheus() as fake:
        result = _run_result(fake.url)
        live = health.live_figures(result)
    rows = health.add_live(health.rows_from(result), live)
    lines = health.render_table(rows, live).splitlines()
    header = lines[0]
    assert header.index("NPU") < header.index("TTFT p95") < header.index("TPOT p95") < header.index("KV") \
        < header.index("RUN") < header.index("LAST BENCH")
    n1 = next(line for line in lines if line.startswith("n1"))
    assert "250ms" in n1 and "31ms" in n1 and "50%" in n1
    assert lines[-1] == f"live figures: {fake.url}, over 5m"
    assert "TTFT p95" not in health.render_table(rows)  # no Prometheus: no live columns
    assert health.live_figures(_run_result("")) is None and health.live_figures(_run_result(None)) is None


def test_health_with_prometheus_down_notes_it_and_keeps_its_verdict(monkeypatch, capsys):
    url = _closed_url()
    monkeypatch.setattr(health, "run_playbook", lambda *a, **k: _run_result(url))
    assert cli.main(["health", "-i", "inventory/lab"]) == exitcodes.OK
    out = capsys.readouterr().out
    assert f"live figures: none (Prometheus at {url} did not answer" in out
    assert cli.main(["health", "-i", "inventory/lab", "--json"]) == exitcodes.OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["prometheus"]["url"] == url and "did not answer" in doc["prometheus"]["error"]
    assert doc["hosts"][0]["live"] is None


def test_health_without_prometheus_is_as_before(monkeypatch, capsys):
    monkeypatch.setattr(health, "run_playbook", lambda *a, **k: _run_result(""))
    assert cli.main(["health", "-i", "inventory/lab", "--json"]) == exitcodes.OK
    doc = json.loads(capsys.readouterr().out)
    assert "prometheus" not in doc and "live" not in doc["hosts"][0]


def test_the_health_playbook_names_the_prometheus_it_resolves():
    play = yaml.safe_load((prometheus.suite_root() / "playbooks/health.yml").read_text())
    tasks = [t for p in play for t in p.get("tasks", [])]
    task = next(t for t in tasks if "health_prometheus" in t.get("ansible.builtin.set_fact", {}))
    assert "atlas.serving.monitoring_prometheus_access" in task["ansible.builtin.set_fact"]["health_prometheus"]
    assert task["run_once"] is True


def test_live_command_json_text_and_exit_codes(capsys):
    with FakePrometheus() as fake:
        assert cli.main(["live", "--prometheus", fake.url, "--node", "n1", "--window", "10m", "--at", "1700000000",
                         "--json"]) == exitcodes.OK
        doc = json.loads(capsys.readouterr().out)
        assert doc["nodes"] == {"n1": {"ttft_p95_ms": 250.0, "tpot_p95_ms": 31.0, "kv_cache_pct": 50.0,
                                       "requests_running": 3.0}}
        assert (doc["window"], doc["at"], doc["error"]) == ("10m", 1700000000.0, None)
        assert cli.main(["live", "--prometheus", fake.url]) == exitcodes.OK
        text = capsys.readouterr().out.splitlines()
        assert text[0].split()[0] == "NODE" and text[2].startswith("n1") and text[-1].startswith(f"({fake.url}")
    url = _closed_url()
    assert cli.main(["live", "--prometheus", url, "--json"]) == exitcodes.ENVIRONMENT
    assert "did not answer" in json.loads(capsys.readouterr().out)["error"]
    assert cli.main(["live", "--prometheus", url, "--window", "ten"]) == exitcodes.USAGE


def test_live_command_with_an_inventory_naming_no_prometheus(tmp_path: Path, capsys):
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"n1": {}}}}))
    assert cli.main(["live", "-i", str(tmp_path / "hosts.yml")]) == exitcodes.USAGE
    assert "names no Prometheus" in capsys.readouterr().err
