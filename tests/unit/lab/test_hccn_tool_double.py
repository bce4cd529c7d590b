"""The lab's hccn_tool double, run as a subprocess with its state and fabric in tmp_path (no network is
touched): the real command syntax and output (docs/npu-network.md, section 2), state kept between calls,
the faults the lab injects, and reachability between nodes through the fabric directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl.errors import UsageError
from atlaslab import npu
from atlaslab.doubles import hccn_tool
from support.hccn_nodes import DOUBLE, FakeNodes


@pytest.fixture()
def lab(tmp_path: Path) -> FakeNodes:
    return FakeNodes(tmp_path)


def configure(lab: FakeNodes, node: str, base: int) -> None:
    for n in range(2):
        assert lab.run(node, "-i", str(n), "-ip", "-s", "address", f"10.20.0.{base + n}",
                       "netmask", "255.255.255.0").returncode == 0


def test_installed_at_the_driver_tools_path_with_a_fresh_state(lab: FakeNodes) -> None:
    root = lab.roots["n1"]
    assert (root / "usr/local/Ascend/driver/tools/hccn_tool").stat().st_mode & 0o111
    state = lab.state("n1")
    assert state["node"] == "n1" and [d["id"] for d in state["devices"]] == [0, 1]
    assert {d["link"] for d in state["devices"]} == {"UP"} and {d["tls"] for d in state["devices"]} == {1}


@pytest.mark.parametrize(("args", "stdout"), [
    (["-link", "-g"], "link status: UP\n"),
    (["-net_health", "-g"], "net health status: Init\n"),
    (["-ip", "-g"], ""),
    (["-gateway", "-g"], ""),
    (["-netdetect", "-g"], ""),
    (["-tls", "-g"], "dev_id:1, tls switch[1](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
                     "tls alarm time threshold[60]days\n"),
])
def test_gets_of_a_fresh_npu(lab: FakeNodes, args: list[str], stdout: str) -> None:
    proc = lab.run("n1", "-i", "1", *args)
    assert (proc.returncode, proc.stdout) == (0, stdout)


def test_sets_persist_and_print_as_the_real_tool(lab: FakeNodes) -> None:
    for args in (["-ip", "-s", "address", "10.20.0.11", "netmask", "255.255.255.0"],
                 ["-gateway", "-s", "gateway", "10.20.0.1"], ["-netdetect", "-s", "address", "10.20.0.1"]):
        assert lab.run("n1", "-i", "1", *args).returncode == 0
    tls = lab.run("n1", "-i", "1", "-tls", "-s", "enable", "0")
    assert (tls.returncode, tls.stdout) == (0, "Cmd executed successfully!\n")
    assert lab.run("n1", "-i", "1", "-ip", "-g").stdout == "ipaddr:10.20.0.11\nnetmask:255.255.255.0\n"
    assert lab.run("n1", "-i", "1", "-gateway", "-g").stdout == "default gateway:10.20.0.1, Iface:eth1\n"
    assert lab.run("n1", "-i", "1", "-netdetect", "-g").stdout == "netdetect address: 10.20.0.1\n"
    assert lab.run("n1", "-i", "1", "-net_health", "-g").stdout == "net health status: Success\n"
    assert "tls switch[0]" in lab.run("n1", "-i", "1", "-tls", "-g").stdout
    assert lab.run("n1", "-i", "0", "-ip", "-g").stdout == ""  # the other NPU is untouched
    published = json.loads((lab.fabric / "n1.json").read_text())
    assert published["devices"][1] == {"id": 1, "address": "10.20.0.11", "netmask": "255.255.255.0", "link": "UP"}


@pytest.mark.parametrize("args", [
    ["-i", "9", "-link", "-g"],
    ["-i", "0", "-ip", "-s", "address", "10.20.0.300", "netmask", "255.255.255.0"],
    ["-i", "0", "-ip", "-s", "address", "10.20.0.3", "netmask", "255.0.255.0"],
    ["-i", "0", "-tls", "-s", "enable", "2"],
    ["-i", "0", "-gateway", "-s", "10.20.0.1"],
    ["-i", "0", "-bogus", "-g"],
    ["-ip", "-g"],
])
def test_bad_commands_fail_and_change_nothing(lab: FakeNodes, args: list[str]) -> None:
    before = lab.state("n1")
    proc = lab.run("n1", *args)
    assert proc.returncode == hccn_tool.EXIT_FAILED and proc.stdout
    assert lab.state("n1") == before


def test_ping_across_nodes_through_the_fabric(lab: FakeNodes) -> None:
    configure(lab, "n1", 10)
    configure(lab, "n2", 20)
    ok = lab.run("n1", "-i", "0", "-ping", "-g", "address", "10.20.0.21")
    assert ok.returncode == 0
    lines = ok.stdout.splitlines()
    assert lines[0] == "device 0 PING 10.20.0.21" and len(lines) == 5
    assert all(line.startswith("recv seq=") and line.endswith("ms") for line in lines[1:4])
    assert lines[-1] == "3 packets transmitted, 3 received, 0.00% packet loss"
    nobody = lab.run("n1", "-i", "0", "-ping", "-g", "address", "10.20.0.99")
    assert nobody.returncode == hccn_tool.EXIT_FAILED
    assert nobody.stdout.splitlines()[-1] == "3 packets transmitted, 0 received, 100.00% packet loss"


@pytest.mark.parametrize(("node", "changes", "src", "dst", "reachable"), [
    ("n2", {"device": 1, "link": "DOWN"}, ("n1", "0"), "10.20.0.21", False),   # the peer's link down
    ("n2", {"device": 1, "link": "DOWN"}, ("n1", "0"), "10.20.0.20", True),    # its other NPU is fine
    ("n1", {"device": 0, "link": "DOWN"}, ("n1", "0"), "10.20.0.20", False),   # the local link down
    ("n1", {"unreachable": "10.20.0.20"}, ("n1", "1"), "10.20.0.20", False),   # one pair unreachable
    ("n1", {"unreachable": "10.20.0.20"}, ("n1", "1"), "10.20.0.21", True),
    ("n1", {"net_health": "Fault"}, ("n1", "1"), "10.20.0.21", True),          # health alone: still pings
])
def test_faults(lab: FakeNodes, node: str, changes: dict, src: tuple, dst: str, reachable: bool) -> None:
    configure(lab, "n1", 10)
    configure(lab, "n2", 20)
    lab.fault(node, **changes)
    proc = lab.run(src[0], "-i", src[1], "-ping", "-g", "address", dst)
    assert (proc.returncode == 0) is reachable, proc.stdout


def test_link_down_is_fault_health_and_up_again_heals(lab: FakeNodes) -> None:
    configure(lab, "n1", 10)
    lab.run("n1", "-i", "0", "-netdetect", "-s", "address", "10.20.0.1")
    lab.fault("n1", device=0, link="DOWN")
    assert lab.run("n1", "-i", "0", "-link", "-g").stdout == "link status: DOWN\n"
    assert lab.run("n1", "-i", "0", "-net_health", "-g").stdout == "net health status: Fault\n"
    lab.fault("n1", device=0, link="UP")
    assert lab.run("n1", "-i", "0", "-net_health", "-g").stdout == "net health status: Success\n"
    lab.fault("n1", device=0, net_health="Fault")
    assert lab.run("n1", "-i", "0", "-net_health", "-g").stdout == "net health status: Fault\n"
    lab.fault("n1", net_health="Success")
    assert lab.run("n1", "-i", "0", "-net_health", "-g").stdout == "net health status: Success\n"
    lab.fault("n1", unreachable="10.20.0.20")
    assert lab.fault("n1", reachable="10.20.0.20")["unreachable"] == []


@pytest.mark.parametrize(("changes", "message"), [
    ({"link": "sideways"}, "--link"),
    ({"net_health": "Init"}, "--net-health"),
    ({"unreachable": "10.20.0"}, "--unreachable"),
    ({"device": 7, "link": "DOWN"}, "--device 7"),
])
def test_fault_input_is_checked(lab: FakeNodes, changes: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        lab.fault("n1", **changes)


def test_install_keeps_the_ports_of_an_existing_node(lab: FakeNodes) -> None:
    configure(lab, "n1", 10)
    spec = lab.cfg.nodes[0]
    npu.install(lab.roots["n1"], lab.cfg, spec)
    assert lab.state("n1")["devices"][0]["address"] == "10.20.0.10"


def test_without_a_fabric_only_the_node_itself_is_known(lab: FakeNodes, tmp_path: Path) -> None:
    configure(lab, "n1", 10)
    env = dict(os.environ, HCCN_TOOL_STATE=str(lab.roots["n1"] / npu.HCCN_STATE_REL),
               HCCN_TOOL_FABRIC=str(tmp_path / "absent"))
    argv = [sys.executable, str(DOUBLE), "-i", "0", "-ping", "-g", "address"]
    assert subprocess.run([*argv, "10.20.0.11"], env=env, capture_output=True).returncode == 0
    assert subprocess.run([*argv, "10.20.0.20"], env=env, capture_output=True).returncode == hccn_tool.EXIT_FAILED
