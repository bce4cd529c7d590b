"""The npu_network role against two fake nodes on localhost (the lab's hccn_tool double, its state and
fabric in tmp_path; no network is touched): check mode changes nothing, the first run configures, the
second changes nothing, a host with nothing to do ends at once, and a link down or an unreachable pair
fails naming both nodes and both NPUs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atlaslab import npu
from support.ansible_run import ansible_env, run_playbook
from support.hccn_nodes import FakeNodes

pytestmark = pytest.mark.role

ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
MASK, GW = "255.255.255.0", "10.20.0.1"
PLAYBOOK = """
- name: npu_network role test
  hosts: all
  gather_facts: false
  roles:
    - role: npu_network
"""


class Stage:
    def __init__(self, tmp: Path):
        self.tmp, self.lab = tmp, FakeNodes(tmp)
        hosts = {}
        for name, base in (("n1", 10), ("n2", 20)):
            hosts[name] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                           "npu_network_addresses": [f"10.20.0.{base}", f"10.20.0.{base + 1}"],
                           "npu_network_netmask": MASK, "npu_network_gateway": GW,
                           "npu_network_hccn_tool_path": self.lab.tool(name),
                           "npu_network_conf_path": str(tmp / f"{name}-hccn.conf")}
        hosts["n3"] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        inventory = {"all": {"hosts": hosts, "vars": {"serving_instances": {"ds": {"nodes": ["n1", "n2"]},
                                                                            "solo": {"nodes": ["n3"]}}}}}
        (tmp / "inventory.json").write_text(json.dumps(inventory))
        (tmp / "play.yml").write_text(PLAYBOOK)
        root = self.lab.roots["n1"]
        self.env = ansible_env(tmp, path=root / "usr/local/bin", NPU_SMI_STATE=str(root / npu.STATE_REL))

    def play(self, *extra: str) -> subprocess.CompletedProcess:
        return run_playbook(self.tmp / "inventory.json", self.tmp / "play.yml", *extra, cwd=self.tmp, env=self.env)


def recap(result: subprocess.CompletedProcess) -> dict[str, dict[str, int]]:
    tail = result.stdout.split("PLAY RECAP")[-1]
    found = {name: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", rest)}
             for name, rest in re.findall(r"^(n\d)\s*:\s*(.*)$", tail, re.MULTILINE)}
    assert set(found) == {"n1", "n2", "n3"}, result.stdout[-3000:] + result.stderr[-2000:]
    return found


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Stage:
    return Stage(tmp_path_factory.mktemp("npu-network"))


def test_check_mode_on_bare_nodes_changes_nothing(stage: Stage) -> None:
    before = {n: stage.lab.state(n) for n in ("n1", "n2")}
    result = stage.play("--check", "--diff")
    assert result.returncode == 0, result.stdout[-4000:]
    counts = recap(result)
    assert counts["n1"]["changed"] == 1 and counts["n2"]["changed"] == 1
    assert "+address_0=10.20.0.10" in result.stdout and "NPU 0 ip: unset -> 10.20.0.10/255.255.255.0" in result.stdout
    assert {n: stage.lab.state(n) for n in ("n1", "n2")} == before
    assert not (stage.tmp / "n1-hccn.conf").exists()


@pytest.mark.slow
def test_converge_then_nothing_changes(stage: Stage) -> None:
    first = stage.play()
    assert first.returncode == 0, first.stdout[-4000:]
    counts = recap(first)
    assert counts["n1"]["changed"] == 1 and counts["n2"]["changed"] == 1 and counts["n3"]["failed"] == 0
    assert "address_1=10.20.0.11" in (stage.tmp / "n1-hccn.conf").read_text()
    assert {d["tls"] for d in stage.lab.state("n2")["devices"]} == {0}
    second = stage.play()
    assert second.returncode == 0, second.stdout[-4000:]
    assert {n: c["changed"] for n, c in recap(second).items()} == {"n1": 0, "n2": 0, "n3": 0}


def test_a_host_with_nothing_to_do_runs_no_module(stage: Stage) -> None:
    result = stage.play("-v")
    assert result.returncode == 0
    # the argument spec check (an action on the controller), then the meta that ends the host: no module
    assert recap(result)["n3"]["ok"] == 1
    blocks = result.stdout.split("\nTASK [")[1:]
    tasks = [b.split("]")[0] for b in blocks if re.search(r"^(ok|changed|skipping|fatal): \[n3\]", b, re.MULTILINE)]
    assert len(tasks) == 1 and "Validating arguments" in tasks[0], tasks


def test_a_link_down_fails_naming_the_npu(stage: Stage) -> None:
    stage.lab.fault("n2", device=1, link="DOWN")
    try:
        result = stage.play()
    finally:
        stage.lab.fault("n2", device=1, link="UP")
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "n2 NPU 1: link DOWN, not UP; n2 NPU 1: net health Fault, not Success" in out
    assert recap(result)["n2"]["failed"] == 1


def test_an_unreachable_pair_names_both_nodes_and_npus(stage: Stage) -> None:
    stage.lab.fault("n1", unreachable="10.20.0.21")
    try:
        result = stage.play()
    finally:
        stage.lab.fault("n1", reachable="10.20.0.21")
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "2 of 4 NPU pairs unreachable" in out
    assert ("n1 NPU 0 -> n2 NPU 1 (10.20.0.21): 3 packets transmitted, 0 received, 100.00% packet loss" in out)
    assert recap(result)["n1"]["failed"] == 1 and recap(result)["n2"]["failed"] == 0


def test_inconsistent_tls_is_refused_before_anything_changes(stage: Stage) -> None:
    before = stage.lab.state("n1")
    result = stage.play("-e", "npu_network_tls_enable=1", "--limit", "n1")
    # -e sets it everywhere: consistent, so the stage turns TLS on for n1 only (n2 is limited out)
    assert result.returncode == 0, result.stdout[-3000:]
    assert {d["tls"] for d in stage.lab.state("n1")["devices"]} == {1}
    stage.lab.run("n1", "-i", "0", "-tls", "-s", "enable", "0")
    stage.lab.run("n1", "-i", "1", "-tls", "-s", "enable", "0")
    inventory = json.loads((stage.tmp / "inventory.json").read_text())
    inventory["all"]["hosts"]["n2"]["npu_network_tls_enable"] = 1
    (stage.tmp / "inventory-tls.json").write_text(json.dumps(inventory))
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", str(stage.tmp / "inventory-tls.json"), str(stage.tmp / "play.yml")]
    refused = subprocess.run(cmd, cwd=stage.tmp, env=stage.env, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0
    out = " ".join(refused.stdout.split())
    assert "instance ds: npu_network_tls_enable differs between its nodes (n1=0, n2=1)" in out
    assert stage.lab.state("n1")["devices"][0]["tls"] == before["devices"][0]["tls"] == 0
