"""The NPU network stage on the converged lab (the lab's hccn_tool double on each node, its fabric on the
host: no packet leaves the lab). A second inventory source gives atlas-n1 and atlas-n2 their NPU addresses
and one two-node instance; the lab's own inventory stays as it is (the stage does nothing there, which the
converged lab's site.yml runs prove). Converge, run again (changed=0), check mode (changed=0), then one
link down and one unreachable pair, each named, each restored."""

from __future__ import annotations

import contextlib

import pytest
import yaml
from labtools import lab, on_node, playbook, recap

pytestmark = pytest.mark.lab

HEAD, WORKER, OTHERS = "atlas-n1", "atlas-n2", ("atlas-n3", "atlas-n4", "atlas-n5")
MASK, GW = "255.255.255.0", "10.20.0.1"
ADDRESSES = {HEAD: [f"10.20.0.{10 + n}" for n in range(8)], WORKER: [f"10.20.0.{20 + n}" for n in range(8)]}


@pytest.fixture(scope="module")
def overlay(converged_lab, tmp_path_factory):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    path = tmp_path_factory.mktemp("npu-network") / "npu-network.yml"
    hosts = {h: {"npu_network_addresses": a, "npu_network_netmask": MASK, "npu_network_gateway": GW}
             for h, a in ADDRESSES.items()}
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts, "vars": {
        "serving_instances": {"lab-two-node": {"nodes": [HEAD, WORKER]}}}}}))
    return str(path)


def stage(overlay: str, *args: str):
    return playbook("-i", overlay, "playbooks/npu_network.yml", *args)


@contextlib.contextmanager
def fault(node: str, *flags: str, undo: tuple[str, ...]):
    lab("npu", node, *flags)
    try:
        yield
    finally:
        lab("npu", node, *undo)


def test_converges_then_changes_nothing(overlay: str) -> None:
    first = stage(overlay)
    assert first.returncode == 0, first.stdout[-6000:]
    stats = recap(first.stdout)
    assert stats[HEAD]["changed"] == 1 and stats[WORKER]["changed"] == 1
    for other in OTHERS:  # no addresses, in no multi-node instance: ended before any module
        assert stats[other]["changed"] == 0 and stats[other]["failed"] == 0
    second = stage(overlay)
    assert second.returncode == 0, second.stdout[-6000:]
    assert {h: s["changed"] for h, s in recap(second.stdout).items() if h.startswith("atlas-n")} == dict.fromkeys(
        (HEAD, WORKER, *OTHERS), 0)
    check = stage(overlay, "--check", "--diff")
    assert check.returncode == 0 and recap(check.stdout)[HEAD]["changed"] == 0, check.stdout[-4000:]


def test_the_node_reads_its_ports_back(overlay: str) -> None:
    assert on_node(WORKER, "/usr/local/Ascend/driver/tools/hccn_tool -i 3 -ip -g").stdout == (
        f"ipaddr:10.20.0.23\nnetmask:{MASK}\n")
    conf = on_node(WORKER, "cat /etc/hccn.conf").stdout
    assert "address_7=10.20.0.27\n" in conf and f"gateway_0={GW}\n" in conf and "send_arp_status_0=1\n" in conf
    ping = on_node(HEAD, "/usr/local/Ascend/driver/tools/hccn_tool -i 0 -ping -g address 10.20.0.27").stdout
    assert ping.splitlines()[-1] == "3 packets transmitted, 3 received, 0.00% packet loss"


def test_a_link_down_stops_the_stage_naming_it(overlay: str) -> None:
    with fault(WORKER, "--device", "3", "--link", "down", undo=("--device", "3", "--link", "up")):
        result = stage(overlay)
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert f"{WORKER} NPU 3: link DOWN, not UP" in out
    assert f"{WORKER} NPU 3: net health Fault, not Success" in out


def test_an_unreachable_pair_names_both_nodes_and_npus(overlay: str) -> None:
    with fault(HEAD, "--unreachable", "10.20.0.25", undo=("--reachable", "10.20.0.25")):
        result = stage(overlay)
    assert result.returncode != 0
    out = " ".join(result.stdout.split())
    assert "8 of 64 NPU pairs unreachable" in out
    assert (f"{HEAD} NPU 0 -> {WORKER} NPU 5 (10.20.0.25): 3 packets transmitted, 0 received, 100.00% packet loss"
            in out)
    assert recap(result.stdout)[WORKER]["failed"] == 0
    assert stage(overlay).returncode == 0  # restored: converged again
