"""The monitoring role on localhost, its files under tmp_path: the scrape targets and SLO thresholds generated from
an inventory (the nodes' service records and resolved profiles given as the facts the stage's first play sets),
every file checked by the real promtool before it is written, check mode writing nothing, a second run changing
nothing, and a short-lived Prometheus on 127.0.0.1 loading what was written (rules, targets and their labels).
systemctl is a stand-in that records its calls: no service of this machine is touched."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from support import tls_fixtures
from support.ansible_run import ansible_env
from support.monitoring_names import PROMETHEUS, PROMTOOL

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
pytestmark = [pytest.mark.role, pytest.mark.skipif(
    PROMTOOL is None or PROMETHEUS is None,
    reason="promtool and prometheus are not installed: `make venv` takes them out of Debian's prometheus package")]
PLAYBOOK = """
- name: monitoring role test
  hosts: monitoring
  gather_facts: false
  tasks:
    - name: targets
      ansible.builtin.include_role: {name: monitoring, tasks_from: targets}
    - name: configure
      ansible.builtin.include_role: {name: monitoring, tasks_from: configure}
    - name: service
      ansible.builtin.include_role: {name: monitoring, tasks_from: service}
      when: with_service | default(false) | bool
"""
SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_SYSTEMCTL_LOG"
case "$1" in
  show) printf 'Id=%s.service\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\n' "$2"
        echo UnitFileState=enabled;;
  is-enabled) echo enabled;;
  is-active) echo active;;
esac
exit 0
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _record(port, engine, release):
    return {"port": port, "engine": engine, "release_id": release, "service": "atlas-serving"}


class Stage:
    def __init__(self, tmp: Path):
        self.tmp, self.port = tmp, _free_port()
        self.etc = tmp / "etc-prometheus"
        fleet = {
            "n1": {"ansible_host": "127.0.0.11", "gateway_backend_record": _record(8000, "vllm", "r2"),
                   "serving_profile_resolved": {"slo": {"ttft_ms": 500}}},
            "n2": {"ansible_host": "127.0.0.12", "gateway_backend_record": _record(8000, "vllm", "r1"),
                   "serving_profile_resolved": {}},
            "n3": {"ansible_host": "127.0.0.13", "gateway_backend_record": _record(30000, "sglang", "r2")},
            "n4": {"ansible_host": "127.0.0.14", "gateway_backend_record": _record(30000, "sglang", "r2")},
        }
        inventory = {"all": {
            "vars": {"serving_instances": {"big": {"nodes": ["n3", "n4"]}}},
            "children": {
                "atlas_nodes": {"children": {"branch_east": {"hosts": {"n1": fleet["n1"], "n2": fleet["n2"]}},
                                             "branch_west": {"hosts": {"n3": fleet["n3"], "n4": fleet["n4"]}}}},
                "gateway": {"hosts": {"gw-east": {"ansible_host": "127.0.0.21", "gateway_branch": "east"}}},
                "monitoring": {"hosts": {"mon": {"ansible_connection": "local",
                                                 "ansible_python_interpreter": sys.executable}}},
            }}}
        (tmp / "inventory.json").write_text(json.dumps(inventory))
        (tmp / "play.yml").write_text(PLAYBOOK)
        bindir = tmp / "bin"
        bindir.mkdir()
        (bindir / "systemctl").write_text(SYSTEMCTL)
        (bindir / "systemctl").chmod(0o755)
        self.log = tmp / "systemctl.log"
        self.env = ansible_env(tmp, path=bindir, FAKE_SYSTEMCTL_LOG=str(self.log))
        # The role's files under tmp_path (extra vars win over role vars), Prometheus on a free port.
        # Plain HTTP here: test_tls_and_passwords_guard_prometheus runs the role's TLS and password setup.
        self.extra = {"__monitoring_prometheus_dir": str(self.etc), "__monitoring_promtool": PROMTOOL,
                      "__monitoring_prometheus_defaults": str(tmp / "default-prometheus"),
                      "monitoring_prometheus_port": self.port, "monitoring_alertmanagers": ["127.0.0.1:9093"],
                      "monitoring_tls": False}

    def play(self, *args: str, **extra) -> subprocess.CompletedProcess:
        cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(self.tmp / "inventory.json"), str(self.tmp / "play.yml"),
               "-e", json.dumps({**self.extra, **extra}), *args]
        return subprocess.run(cmd, cwd=self.tmp, env=self.env, capture_output=True, text=True, timeout=300)

    def calls(self) -> list[str]:
        """The systemctl calls that would change something (show, is-enabled, is-active only read)."""
        lines = self.log.read_text().splitlines() if self.log.is_file() else []
        return [c for c in lines if not c.startswith(("show ", "is-enabled ", "is-active "))]


def changed(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    return int(re.search(r"^mon\s*:.*changed=(\d+)", result.stdout.split("PLAY RECAP")[-1], re.M).group(1))


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Stage:
    return Stage(tmp_path_factory.mktemp("monitoring"))


def test_check_mode_writes_nothing(stage: Stage) -> None:
    assert changed(stage.play("--check")) > 0
    assert not stage.etc.exists() and stage.calls() == []


def test_first_run_writes_checked_files_and_reloads_through_the_handler(stage: Stage) -> None:
    # rules dir, rules, SLO thresholds, prometheus.yml, command line; the restart and reload handlers (the reload
    # waits for /-/ready: here the Prometheus the package would have started, on its own configuration)
    packaged = stage.tmp / "packaged.yml"
    packaged.write_text("global: {}\n")
    with _prometheus(stage, packaged, stage.tmp / "tsdb-packaged"):
        assert changed(stage.play()) == 7
    config = yaml.safe_load((stage.etc / "prometheus.yml").read_text())
    assert (stage.etc / "prometheus.yml").read_text().startswith("#")  # ansible_managed
    assert config["rule_files"] == [str(stage.etc / "rules/atlas-rules.yml"), str(stage.etc / "rules/atlas-slo.yml")]
    assert config["alerting"]["alertmanagers"] == [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert list(jobs) == ["prometheus", "atlas-engine", "atlas-npu-exporter", "atlas-node"]
    engines = {c["targets"][0]: c["labels"] for c in jobs["atlas-engine"]["static_configs"]}
    assert engines == {
        "127.0.0.11:8000": {"branch": "east", "node": "n1", "instance": "n1", "release": "r2", "engine": "vllm"},
        "127.0.0.12:8000": {"branch": "east", "node": "n2", "instance": "n2", "release": "r1", "engine": "vllm"},
        "127.0.0.13:30000": {"branch": "west", "node": "n3", "instance": "big", "release": "r2", "engine": "sglang"},
    }
    assert len(jobs["atlas-node"]["static_configs"]) == 5
    slo = yaml.safe_load((stage.etc / "rules/atlas-slo.yml").read_text())
    thresholds = {(r["record"], r["labels"]["node"]): r["expr"] for r in slo["groups"][0]["rules"]}
    assert thresholds[("atlas:slo_ttft_seconds", "n1")] == "vector(0.5)"  # its profile's slo
    assert thresholds[("atlas:slo_ttft_seconds", "n2")] == "vector(2)"  # the role's default
    assert ("atlas:slo_ttft_seconds", "n4") not in thresholds  # rank 1 of big serves no HTTP
    assert (stage.etc / "rules/atlas-rules.yml").read_text() == \
        (REPO / "roles/monitoring/files/atlas-rules.yml").read_text()
    assert f'--web.listen-address=:{stage.port} ' in (stage.tmp / "default-prometheus").read_text()
    assert stage.calls().count("reload prometheus") == 1 and stage.calls().count("restart prometheus") == 1


def test_a_file_promtool_refuses_is_not_written(stage: Stage) -> None:
    before = (stage.etc / "rules/atlas-slo.yml").read_text()
    result = stage.play(monitoring_scrape_timeout="30s")  # longer than the scrape interval: promtool refuses
    assert result.returncode != 0
    assert "scrape timeout greater than scrape interval" in result.stdout
    assert (stage.etc / "rules/atlas-slo.yml").read_text() == before
    assert "30s" not in (stage.etc / "prometheus.yml").read_text()


def test_a_reload_waits_until_prometheus_answers(tmp_path: Path) -> None:
    """A SIGHUP before Prometheus has its handler for it ends it, and systemd leaves it down (roles/monitoring/
    handlers/main.yml). With nothing answering /-/ready the run fails there, and the reload is never sent."""
    fresh = Stage(tmp_path)
    result = fresh.play(monitoring_ready_timeout_s=1)
    assert result.returncode != 0
    assert "wait until Prometheus answers before it is reloaded" in result.stdout
    assert f"127.0.0.1:{fresh.port}/-/ready" in result.stdout
    assert "restart prometheus" in fresh.calls() and "reload prometheus" not in fresh.calls()


def test_prometheus_loads_what_was_written_and_a_second_run_changes_nothing(stage: Stage) -> None:
    with _prometheus(stage, stage.etc / "prometheus.yml", stage.tmp / "tsdb"):
        api = f"http://127.0.0.1:{stage.port}/api/v1"
        calls = len(stage.calls())
        result = stage.play(with_service=True)
        assert changed(result) == 0
        assert "reload prometheus" not in stage.calls()[calls:]  # nothing changed, nothing reloaded
        groups = {g["name"]: g for g in _get(f"{api}/rules")["groups"]}
        assert set(groups) == {"atlas-engine-records", "atlas-engine-alerts", "atlas-npu-alerts",
                               "atlas-slo-thresholds"}
        alerts = {r["name"] for g in groups.values() for r in g["rules"] if r["type"] == "alerting"}
        assert {"AtlasEngineDown", "AtlasInstanceHung", "AtlasNpuUnhealthy", "AtlasTtftP95AboveSlo"} <= alerts
        engine = _engine_targets(api)
        assert {(t["node"], t["instance"], t["branch"], t["release"], t["engine"]) for t in engine} == {
            ("n1", "n1", "east", "r2", "vllm"), ("n2", "n2", "east", "r1", "vllm"),
            ("n3", "big", "west", "r2", "sglang")}


@contextlib.contextmanager
def _prometheus(stage: Stage, config: Path, data: Path) -> Iterator[None]:
    """A real Prometheus on the stage's port, ready, for the length of the block."""
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",
         f"--web.listen-address=127.0.0.1:{stage.port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_ready(f"http://127.0.0.1:{stage.port}/-/ready", server)
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def _get(url: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())["data"]


def _engine_targets(api: str, timeout: float = 60) -> list[dict]:
    """The atlas-engine job's active targets' labels, once Prometheus has them: /-/ready answers before
    service discovery hands the static targets to the scrape manager (it sends updates every 5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        engine = [t["labels"] for t in _get(f"{api}/targets")["activeTargets"]
                  if t["labels"]["job"] == "atlas-engine"]
        if engine or time.monotonic() > deadline:
            return engine
        time.sleep(0.5)


def _wait_ready(url: str, server: subprocess.Popen, timeout: float = 60) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"prometheus exited {server.returncode}: {server.stderr.read()[-2000:]}")
        try:
            with opener.open(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"prometheus was not ready at {url} in {timeout} s")


@pytest.mark.slow
def test_the_stage_playbook_in_check_mode_carries_each_node_s_record_to_the_targets(stage: Stage) -> None:
    """playbooks/monitoring.yml: its first play reads the node's service record (roles/gateway, port.yml) and
    resolves its profile; the second play's targets carry them. Check mode: nothing is installed or written."""
    tmp = stage.tmp
    (tmp / "record.json").write_text(json.dumps(_record(8001, "vllm", "r7")))
    node = {"ansible_host": "127.0.0.1", "serving_profile": "lab-vllm-cpu-tiny",
            "serving_record": str(tmp / "record.json")}
    inventory = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False,
                 "serving_profile_dirs": [str(REPO / "inventory/lab/profiles")]},
        "children": {"atlas_nodes": {"children": {"branch_east": {"hosts": {"n1": node}}}},
                     # addresses: the node's firewall admits its gateway and the monitoring host by them
                     "gateway": {"hosts": {"gw": {"gateway_branch": "east", "ansible_host": "127.0.0.21"}}},
                     "monitoring": {"hosts": {"mon": {"ansible_host": "127.0.0.30"}}}}}}
    (tmp / "stage.json").write_text(json.dumps(inventory))
    extra = {"__monitoring_prometheus_dir": str(tmp / "stage-etc"), "__monitoring_prometheus_defaults": str(tmp / "d"),
             "__monitoring_promtool": PROMTOOL,
             "monitoring_tls": False}
    result = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "stage.json"), str(REPO / "playbooks/monitoring.yml"), "--check",
         "--diff", "-e", json.dumps(extra)], cwd=tmp, env=stage.env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    config = result.stdout.split("prometheus.yml (scrape targets from the inventory)")[1].split("TASK [")[0]
    assert re.search(r"\+- job_name: atlas-engine\n.*\n.*\n\+  - targets:\n\+    - 127\.0\.0\.1:8001\n\+    labels:\n"
                     r"\+      branch: east\n\+      node: n1\n\+      instance: n1\n\+      release: r7\n"
                     r"\+      engine: vllm", config), config
    assert "+    - 127.0.0.21:9100" in config
    assert not (tmp / "stage-etc").exists()


def test_tls_and_passwords_guard_prometheus(tmp_path: Path) -> None:
    """With monitoring_tls (the default) the role writes Prometheus's web configuration (the host's certificate, the
    API user's bcrypt hash) and the passwords Prometheus scrapes with. A real Prometheus with that file (started
    before the run, as the package's would be, on the file the role writes: the hash is salted from the host and
    the user, so it is known ahead) refuses a request without the password or with a wrong one and serves the right
    one over TLS checked against the CA; the role's own readiness check and reload go through it. A second run
    changes nothing."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import monitoring

    (tmp_path / "stage").mkdir()
    fresh = Stage(tmp_path / "stage")
    tls = tls_fixtures.make(tmp_path)
    for name, text in (("api", "api-password-123456"), ("scrape", "scrape-password-123456")):
        (tmp_path / name).write_text(text + "\n")
    web = tmp_path / "web"
    web.mkdir()
    hashed = monitoring.web_password_hash("api-password-123456", "mon/atlas")
    (web / "prometheus.yml").write_text(yaml.safe_dump({
        "tls_server_config": {"cert_file": str(tls["cert"]), "key_file": str(tls["key"]), "min_version": "TLS12"},
        "basic_auth_users": {"atlas": hashed}}))
    extra = {"__monitoring_promtool": PROMTOOL, "monitoring_tls": True, "monitoring_web_dir": str(web),
             "atlas_tls_ca_file": str(tls["ca"]),
             "atlas_tls_cert_file": str(tls["cert"]), "atlas_tls_key_file": str(tls["key"]),
             "monitoring_api_password_file": str(tmp_path / "api"),
             "monitoring_scrape_password_file": str(tmp_path / "scrape"), "ansible_host": "127.0.0.1"}
    packaged = tmp_path / "packaged.yml"
    packaged.write_text("global: {}\n")
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={packaged}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{fresh.port}", f"--web.config.file={web / 'prometheus.yml'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        context = ssl.create_default_context(cafile=str(tls["ca"]))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))
        url = f"https://127.0.0.1:{fresh.port}/api/v1/status/runtimeinfo"

        def status(password: str | None) -> int:
            headers = {"Authorization": "Basic " + base64.b64encode(f"atlas:{password}".encode()).decode()} \
                if password else {}
            try:
                with opener.open(urllib.request.Request(url, headers=headers), timeout=5) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code
            except OSError:
                return 0

        deadline = time.monotonic() + 60
        while status("api-password-123456") != 200 and time.monotonic() < deadline:
            assert server.poll() is None, server.stderr.read()[-2000:]
            time.sleep(0.5)
        assert changed(fresh.play(**extra)) > 0
        assert "reload prometheus" in fresh.calls(), "the reload waited for /-/ready over TLS with the password"
        assert changed(fresh.play(**extra)) == 0, "a converged host changes nothing (the hashes are salted stably)"
        assert status("api-password-123456") == 200
        assert status(None) == 401 and status("wrong") == 401
    finally:
        server.terminate()
        server.wait(timeout=20)
    document = yaml.safe_load((web / "prometheus.yml").read_text())
    assert document["basic_auth_users"] == {"atlas": hashed}
    assert "api-password" not in (web / "prometheus.yml").read_text()
    assert (web / "scrape-password").read_text() == "scrape-password-123456"
    assert oct((web / "tls.key").stat().st_mode & 0o777) == "0o640"
    config = yaml.safe_load((fresh.etc / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["atlas-node"]["scheme"] == "https" and jobs["atlas-node"]["basic_auth"]["username"] == "atlas-scrape"
    assert jobs["prometheus"]["static_configs"][0]["targets"] == [f"127.0.0.1:{fresh.port}"]
    assert jobs["atlas-engine"].get("scheme", "http") == "http"  # the node's firewall guards the engines' port
    assert f"--web.config.file={web}/prometheus.yml" in (fresh.tmp / "default-prometheus").read_text()
