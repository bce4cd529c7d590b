"""The lab itself: nodes boot, are isolated from each other and from the world, and come and go cleanly.

Runs `atlas-lab up|ssh|power|down` end to end (root, debootstrap, systemd-nspawn). The lab is always
brought down in the fixture's teardown, even when a test fails.
"""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import labtools
import pytest
from labtools import fresh_lab_session, lab, lab_prerequisites

from atlaslab import api, net, node, paths

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[2]
# `atlas-lab ssh` itself, here where the lab's own commands are tested (the other modules' commands on nodes
# share one SSH connection per node: labtools.lab)
on_node = functools.partial(labtools.on_node, cli=True)


@pytest.fixture(scope="module")
def fleet():
    reason = lab_prerequisites()
    if reason:
        pytest.skip(reason)
    with fresh_lab_session(bundle=False):
        yield api.load_config()


def test_up_is_a_noop_when_healthy(fleet) -> None:
    out = lab("up").stdout
    assert "already up" in out
    status = json.loads(lab("status", "--json").stdout)
    assert [n["name"] for n in status["nodes"]] == [n.name for n in fleet.nodes]
    assert all(n["state"] == "running" and n["ssh"] for n in status["nodes"])


def test_ssh_uses_strict_host_key_checking(fleet, tmp_path: Path) -> None:
    first = fleet.nodes[0]
    assert on_node(first.name, "hostname").stdout.strip() == first.name
    # the same connection with an empty known_hosts file must be refused, not silently trusted
    argv = api.ssh_argv(first.name, ["true"])
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = [a.replace(str(paths.known_hosts()), str(empty)) for a in argv]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr


def test_branch_west_is_reached_over_ssh_only_through_its_jump_host(fleet) -> None:
    """From the controller address, SSH to a node behind the jump host is refused; through the inventory's
    ProxyCommand (the jump host) it works, as every tool connects (docs/lab.md, "The jump host")."""
    behind = [n for n in fleet.nodes if n.via]
    assert behind and all(n.via == "atlas-jump" for n in behind)
    west = behind[0]
    direct = [a.replace(f"BindAddress={west.harness}", f"BindAddress={fleet.controller_ip}")
              for a in api.ssh_argv(west.name, ["true"])]
    assert f"BindAddress={fleet.controller_ip}" in direct
    refused = subprocess.run(direct, capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 255 and "refused" in refused.stderr.lower(), refused.stderr
    from atlasctl import inventory

    target = inventory.targets(ROOT / "inventory/lab", limit=west.name, group="all")[0]
    assert "ProxyCommand=" in " ".join(target.ssh_argv())
    through = subprocess.run([*target.ssh_argv(), "-o", f"BindAddress={fleet.controller_ip}", target.remote,
                              "hostname"], capture_output=True, text=True, timeout=60, check=False)
    assert through.returncode == 0 and through.stdout.strip() == west.name, through.stderr


def test_nodes_have_their_own_identity_and_no_default_route(fleet) -> None:
    a, b = fleet.nodes[0], fleet.nodes[1]
    facts = {}
    for spec in (a, b):
        out = on_node(spec.name, "cat /etc/machine-id; hostname; ip -4 -o addr show dev eth0; ip route").stdout
        facts[spec.name] = out.splitlines()
        assert f"inet {spec.ip}/" in out
        assert "default" not in out
    assert facts[a.name][0] != facts[b.name][0]  # machine-id
    assert facts[a.name][1] == a.name and facts[b.name][1] == b.name


def test_nodes_reach_each_other_but_nothing_outside_the_lab(fleet) -> None:
    a, b = fleet.nodes[0], fleet.nodes[1]
    # ping, or else the SSH banner from b's port 22: grep last in the pipe, so no banner fails the command
    assert on_node(a.name, f"ping -c1 -W2 {b.ip} >/dev/null 2>&1 || curl -s -m 3 telnet://{b.ip}:22 </dev/null | "
                      f"head -c 3 | grep -qx SSH", check=False).returncode == 0
    probe = "curl -sS -m 3 -o /dev/null http://{0}/ ; echo rc=$?"
    for target in ("192.0.2.1", "1.1.1.1", "10.0.0.1"):
        out = on_node(a.name, probe.format(target), check=False).stdout
        assert "rc=0" not in out, f"{a.name} reached {target}"
    # even with a route added by a compromised node, the host must not forward lab traffic
    out = on_node(a.name, f"ip route add default via {fleet.controller_ip}; " + probe.format("192.0.2.1")
             + f"; ip route del default via {fleet.controller_ip}", check=False).stdout
    assert "rc=0" not in out


def test_npu_smi_shows_the_nodes_npus(fleet) -> None:
    for spec in fleet.nodes[:2]:
        out = on_node(spec.name, "npu-smi info").stdout
        rows = [line for line in out.splitlines() if line.startswith("| ") and spec.npu.model in line]
        assert len(rows) == spec.npu.count
        assert f"/ {spec.npu.hbm_mb}" in out
        version = on_node(spec.name, "cat /usr/local/Ascend/driver/version.info").stdout
        assert f"Version={fleet.driver_version}" in version


def test_npu_fault_injection(fleet) -> None:
    spec = fleet.nodes[0]
    lab("npu", spec.name, "--device", "1", "--health", "Critical")
    assert "Critical" in on_node(spec.name, "npu-smi info -t health -i 1").stdout
    lab("npu", spec.name, "--driver", "unloaded")
    proc = on_node(spec.name, "npu-smi info", check=False)
    assert proc.returncode != 0 and "dcmi module initialize failed" in proc.stdout
    lab("npu", spec.name, "--driver", "loaded", "--health", "OK")
    assert on_node(spec.name, "npu-smi info").returncode == 0


def test_bundle_share_is_mounted_read_only(fleet) -> None:
    out = on_node(fleet.nodes[0].name, "touch /srv/atlas-bundle/x 2>&1; echo rc=$?", check=False).stdout
    assert "Read-only file system" in out


def test_power_off_and_on(fleet) -> None:
    spec = fleet.nodes[-1]
    lab("power", spec.name, "off")
    status = {n["name"]: n for n in json.loads(lab("status", "--json", check=False).stdout)["nodes"]}
    assert status[spec.name]["state"] == "stopped" and not status[spec.name]["ssh"]
    assert on_node(spec.name, "true", check=False).returncode != 0
    lab("power", spec.name, "on")
    assert on_node(spec.name, "hostname").stdout.strip() == spec.name


def test_down_removes_everything_but_keeps_the_blackhole(fleet) -> None:
    lab("down")
    assert not api.lab_is_up()
    assert net.netns_list() == [] and net.lab_links() == []
    assert not net.link_exists(fleet.bridge)
    assert str(paths.lab_dir()) + "/" not in Path("/proc/self/mountinfo").read_text()
    assert not fleet.inventory_path.exists()
    assert not any(node.cgroup_dirs(n.name)[0].exists() for n in fleet.nodes)
    assert net.blackhole_present(fleet.subnet)
    proc = lab("ssh", fleet.nodes[0].name, "true", check=False, cli=True)
    assert proc.returncode == 3 and "not up" in proc.stderr
    assert "already down" in lab("down").stdout

