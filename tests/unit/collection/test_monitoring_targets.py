"""What Prometheus scrapes, from the inventory (plugin_utils/monitoring.py, filters monitoring_*)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter import monitoring as filters
from ansible_collections.atlas.serving.plugins.plugin_utils import monitoring as mon

ROOT = Path(__file__).resolve().parents[3]

FLEET = ["n1", "n2", "n3", "n4"]
HOSTVARS = {
    "n1": {"ansible_host": "10.0.0.11", "group_names": ["atlas_nodes", "branch_east", "canary"]},
    "n2": {"ansible_host": "10.0.0.12", "group_names": ["atlas_nodes", "branch_east"]},
    "n3": {"ansible_host": "10.0.0.13", "group_names": ["atlas_nodes", "branch_west"]},
    "n4": {"ansible_host": "10.0.0.14", "group_names": ["atlas_nodes", "branch_west"]},
    "gw-east": {"ansible_host": "10.0.0.21", "group_names": ["gateway"], "gateway_branch": "east"},
    "mon": {"ansible_host": "10.0.0.30", "group_names": ["monitoring"]},
}
INSTANCES = {"big": {"nodes": ["n3", "n4"]}}
RECORDS = {
    "n1": {"port": 8000, "engine": "vllm", "release_id": "r2"},
    "n2": {"port": 8000, "engine": "vllm", "release_id": "r1"},
    "n3": {"port": 30000, "engine": "sglang", "release_id": "r2"},
    "n4": {"port": 30000, "engine": "sglang", "release_id": "r2"},
}


def _jobs(result):
    return {job["job_name"]: job for job in result["scrape_configs"]}


def _targets(job):
    return {c["targets"][0]: c["labels"] for c in job["static_configs"]}


def test_every_entry_node_engine_every_npu_exporter_every_node_exporter():
    result = mon.targets(FLEET, HOSTVARS, gateways=["gw-east"], serving_instances=INSTANCES, records=RECORDS)
    jobs = _jobs(result)
    assert list(jobs) == ["atlas-engine", "atlas-npu-exporter", "atlas-node"]
    assert {j["metrics_path"] for j in jobs.values()} == {"/metrics"}
    # n4 is rank 1 of instance big: it serves no HTTP, so it has no engine target
    assert _targets(jobs["atlas-engine"]) == {
        "10.0.0.11:8000": {"branch": "east", "node": "n1", "instance": "n1", "release": "r2", "engine": "vllm"},
        "10.0.0.12:8000": {"branch": "east", "node": "n2", "instance": "n2", "release": "r1", "engine": "vllm"},
        "10.0.0.13:30000": {"branch": "west", "node": "n3", "instance": "big", "release": "r2", "engine": "sglang"},
    }
    assert sorted(_targets(jobs["atlas-npu-exporter"])) == [f"10.0.0.1{i}:8082" for i in range(1, 5)]
    assert _targets(jobs["atlas-npu-exporter"])["10.0.0.14:8082"]["instance"] == "big"
    nodes = _targets(jobs["atlas-node"])
    assert sorted(nodes) == ["10.0.0.11:9100", "10.0.0.12:9100", "10.0.0.13:9100", "10.0.0.14:9100",
                             "10.0.0.21:9100"]
    assert nodes["10.0.0.21:9100"] == {"branch": "east", "node": "gw-east", "instance": "gw-east",
                                       "release": "none", "engine": "none"}
    assert result["unread"] == []
    for job in jobs.values():
        assert all(set(c["labels"]) == set(mon.LABELS) for c in job["static_configs"])


@pytest.mark.parametrize(("records", "engine_targets", "unread", "release"), [
    ({**RECORDS, "n2": None}, ["10.0.0.11:8000", "10.0.0.13:30000"], ["n2"], "unknown"),
    ({**RECORDS, "n2": {}}, ["10.0.0.11:8000", "10.0.0.13:30000"], ["n2"], "unknown"),
    ({**RECORDS, "n2": {"port": 8001}}, ["10.0.0.11:8000", "10.0.0.12:8001", "10.0.0.13:30000"], [], "unknown"),
    ({}, [], ["n1", "n2", "n3"], "unknown"),
])
def test_a_node_without_its_service_record(records, engine_targets, unread, release):
    result = mon.targets(FLEET, HOSTVARS, serving_instances=INSTANCES, records=records)
    jobs = _jobs(result)
    assert sorted(_targets(jobs["atlas-engine"])) == engine_targets
    assert result["unread"] == unread
    # its exporters are scraped all the same
    assert _targets(jobs["atlas-node"])["10.0.0.12:9100"]["release"] == release
    assert len(jobs["atlas-npu-exporter"]["static_configs"]) == 4


def test_ports_and_addresses():
    hostvars = {**HOSTVARS, "n1": {"group_names": ["branch_east"]}, "n2": {"ansible_host": "fd00::12",
                                                                           "group_names": []}}
    result = mon.targets(["n1", "n2"], hostvars, records=RECORDS, node_exporter_port=9101, npu_exporter_port="8090")
    jobs = _jobs(result)
    assert sorted(_targets(jobs["atlas-engine"])) == ["[fd00::12]:8000", "n1:8000"]
    assert sorted(_targets(jobs["atlas-npu-exporter"])) == ["[fd00::12]:8090", "n1:8090"]
    assert _targets(jobs["atlas-node"])["[fd00::12]:9101"]["branch"] == "none"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"node_exporter_port": 0}, "monitoring_node_exporter_port must be a TCP port"),
    ({"npu_exporter_port": "x"}, "monitoring_npu_exporter_port must be a TCP port"),
    ({"records": {"n1": {"port": 70000}}}, "n1: the service record's port must be a TCP port"),
    ({"hostvars": {"n1": {"group_names": ["branch_a", "branch_b"]}}},
     "n1 is in 2 branch groups (branch_a, branch_b): a node belongs to one branch"),
    ({"serving_instances": {"a": {"nodes": ["n1", "n2"]}, "b": {"nodes": ["n1", "n3"]}}},
     "n1 is in 2 serving instances (a, b)"),
])
def test_bad_inputs_name_the_input_and_the_fix(kwargs, message):
    hostvars = kwargs.pop("hostvars", HOSTVARS)
    with pytest.raises(mon.MonitoringError) as exc:
        mon.targets(["n1"], hostvars, **{"records": RECORDS, **kwargs})
    assert message in str(exc.value)


def test_the_filter_reads_the_records_from_a_fact_and_words_errors_for_ansible():
    hostvars = {h: {**v, "gateway_backend_record": RECORDS.get(h)} for h, v in HOSTVARS.items()}
    result = filters.monitoring_targets(FLEET, hostvars, ["gw-east"], INSTANCES)
    assert len(_jobs(result)["atlas-engine"]["static_configs"]) == 3
    with pytest.raises(AnsibleFilterError, match="must be a TCP port"):
        filters.monitoring_targets(FLEET, hostvars, node_exporter_port=-1)


@pytest.mark.parametrize(("slos", "defaults", "rules"), [
    # the profile's slo wins over the defaults, key by key; a non-head rank has none (no HTTP)
    ({"n1": {"ttft_ms": 500}, "n3": {"ttft_ms": 800, "tpot_ms": 50.5}}, {"ttft_ms": 2000, "tpot_ms": 200},
     [("atlas:slo_ttft_seconds", "n1", "vector(0.5)", "500"), ("atlas:slo_tpot_seconds", "n1", "vector(0.2)", "200"),
      ("atlas:slo_ttft_seconds", "n2", "vector(2)", "2000"), ("atlas:slo_tpot_seconds", "n2", "vector(0.2)", "200"),
      ("atlas:slo_ttft_seconds", "n3", "vector(0.8)", "800"),
      ("atlas:slo_tpot_seconds", "n3", "vector(0.0505)", "50.5")]),
    # no threshold set anywhere: no rule, no alert
    ({"n1": {"e2el_ms": 300}}, {}, []),
])
def test_slo_thresholds_one_series_per_entry_node(slos, defaults, rules):
    doc = mon.slo_rules(FLEET, INSTANCES, slos, defaults)
    got = [(r["record"], r["labels"]["node"], r["expr"], r["labels"]["slo_ms"])
           for g in doc["groups"] for r in g["rules"]]
    assert got == rules
    assert [g["name"] for g in doc["groups"]] == (["atlas-slo-thresholds"] if rules else [])


@pytest.mark.parametrize("bad", [0, -5, "2000", True, float("nan")])
def test_a_bad_threshold_names_the_node_and_the_profile(bad):
    with pytest.raises(mon.MonitoringError, match=r"n1: slo.ttft_ms must be a number of milliseconds > 0"):
        mon.slo_rules(["n1"], {}, {"n1": {"ttft_ms": bad}}, {})


def test_the_slo_filter_reads_each_node_profile():
    hostvars = {"n1": {"serving_profile_resolved": {"slo": {"tpot_ms": 100}}}, "n2": {}}
    doc = filters.monitoring_slo_rules(["n1", "n2"], hostvars, {}, {"ttft_ms": 1000})
    assert [(r["record"], r["labels"]["node"]) for r in doc["groups"][0]["rules"]] == [
        ("atlas:slo_ttft_seconds", "n1"), ("atlas:slo_tpot_seconds", "n1"), ("atlas:slo_ttft_seconds", "n2")]


@pytest.mark.parametrize(("explicit", "hosts", "hostvars", "url"), [
    ("", [], {}, ""),
    ("", ["mon"], HOSTVARS, "https://10.0.0.30:9090"),
    ("", ["mon", "other"], {"mon": {"monitoring_prometheus_port": 9091}}, "https://mon:9091"),
    ("", ["mon"], {"mon": {"monitoring_tls": False}}, "http://mon:9090"),
    ("", ["mon"], {"mon": {"monitoring_tls": "false"}}, "http://mon:9090"),
    ("https://prom.bank.example:443/", ["mon"], HOSTVARS, "https://prom.bank.example:443"),
])
def test_where_prometheus_is(explicit, hosts, hostvars, url):
    assert mon.prometheus_url(explicit, hosts, hostvars) == url
    assert filters.monitoring_prometheus_url(hosts, hostvars, explicit) == url


def test_a_bad_prometheus_url_names_the_variable():
    with pytest.raises(AnsibleFilterError, match="monitoring_prometheus_url 'prom:9090' is not an http"):
        filters.monitoring_prometheus_url([], {}, "prom:9090")


def test_the_role_defaults_are_the_ones_the_code_falls_back_to():
    import inspect

    import yaml

    defaults = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    assert defaults["monitoring_prometheus_port"] == mon.DEFAULT_PROMETHEUS_PORT
    params = inspect.signature(mon.targets).parameters
    ports = yaml.safe_load((ROOT / "roles/layout/defaults/main.yml").read_text())
    assert ports["monitoring_node_exporter_port"] == params["node_exporter_port"].default
    assert ports["monitoring_npu_exporter_port"] == params["npu_exporter_port"].default
    assert defaults["monitoring_branch_group_prefix"] == params["branch_prefix"].default


def test_how_a_client_reaches_prometheus_names_the_ca_and_the_password_file_never_the_password():
    hostvars = {"mon": {"ansible_host": "10.0.0.30", "atlas_tls_ca_file": "/etc/site/ca.pem",
                        "monitoring_api_password_file": "/etc/site/prom-api"}}
    assert mon.prometheus_access("", ["mon"], hostvars) == {
        "url": "https://10.0.0.30:9090", "ca_file": "/etc/site/ca.pem", "user": mon.DEFAULT_API_USER,
        "password_file": "/etc/site/prom-api"}
    assert mon.prometheus_access("", [], {})["url"] == ""
    explicit = mon.prometheus_access("https://prom.bank.example", [], {"n1": {"monitoring_api_user": "ops"}})
    assert explicit["url"] == "https://prom.bank.example" and explicit["user"] == "ops"


def test_the_role_defaults_name_the_same_api_user():
    import yaml

    defaults = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    assert defaults["monitoring_api_user"] == mon.DEFAULT_API_USER
    assert defaults["monitoring_tls"] is True


def test_web_password_hashes_are_bcrypt_stable_per_host_and_user():
    import bcrypt

    one = mon.web_password_hash("correct horse battery", "mon/atlas")
    assert bcrypt.checkpw(b"correct horse battery", one.encode())
    assert not bcrypt.checkpw(b"wrong", one.encode())
    assert one == mon.web_password_hash("correct horse battery\n", "mon/atlas"), "a converged host changes nothing"
    assert one != mon.web_password_hash("correct horse battery", "n1/atlas"), "another salt on another host"
    assert one.startswith(f"$2b${mon.WEB_PASSWORD_COST:02d}$")
    with pytest.raises(mon.MonitoringError, match="password is empty"):
        mon.web_password_hash("  \n", "mon/atlas")
