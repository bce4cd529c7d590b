"""lab.yml gateway and monitoring nodes: no NPU, not in atlas_nodes, host vars carried into the inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from atlasctl.errors import UsageError
from atlaslab import config, inventory

ROOT = Path(__file__).resolve().parents[3]


def _cfg(nodes: list[dict]) -> config.LabConfig:
    data = {"lab_name": "t", "bridge": "atlasbr0", "subnet": "10.77.0.0/24", "driver_version": "24.1.rc1",
            "firmware_version": "7.1.0.6.220", "nodes": nodes}
    return config.parse(data, Path("/x/lab.yml"))


def test_gateway_is_not_a_serving_node_and_keeps_its_vars():
    cfg = _cfg([{"name": "n1", "groups": ["branch_east"], "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}},
                {"name": "gw-east", "kind": "gateway", "groups": ["gateway"], "vars": {"gateway_branch": "east"}}])
    assert [n.name for n in cfg.serving_nodes] == ["n1"]
    inv = inventory.build(cfg, Path("/k"), Path("/kh"))["all"]["children"]
    assert list(inv["atlas_nodes"]["hosts"]) == ["n1"]
    gw = inv["gateway"]["hosts"]["gw-east"]
    assert gw["gateway_branch"] == "east" and gw["ansible_host"] == "10.77.0.12"
    assert "atlas_hardware" not in gw


def test_unknown_kind_and_bad_vars_are_named():
    with pytest.raises(UsageError, match=r"nodes\[0\]\.kind"):
        _cfg([{"name": "gw", "kind": "router", "groups": []}])
    with pytest.raises(UsageError, match=r"nodes\[0\]\.vars"):
        _cfg([{"name": "gw", "kind": "gateway", "groups": [], "vars": ["x"]}])


def test_committed_lab_has_a_gateway_per_branch():
    cfg = config.load(ROOT / "inventory/lab/lab.yml")
    branches = {g.removeprefix("branch_") for n in cfg.serving_nodes for g in n.groups if g.startswith("branch_")}
    gateways = {dict(n.host_vars)["gateway_branch"] for n in cfg.nodes if n.kind == "gateway"}
    assert branches == gateways and len(branches) >= 2


def test_monitoring_node_lands_in_group_monitoring_not_in_atlas_nodes():
    cfg = _cfg([{"name": "n1", "groups": ["branch_east"], "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}},
                {"name": "mon", "kind": "monitoring", "groups": ["monitoring"]}])
    assert [n.name for n in cfg.serving_nodes] == ["n1"] and cfg.nodes[1].npu is None
    inv = inventory.build(cfg, Path("/k"), Path("/kh"))["all"]["children"]
    assert list(inv["atlas_nodes"]["hosts"]) == ["n1"]
    mon = inv["monitoring"]["hosts"]["mon"]
    assert mon["ansible_host"] == "10.77.0.12" and "atlas_hardware" not in mon


def test_committed_lab_adds_nodes_after_the_others_so_addresses_stay():
    cfg = config.load(ROOT / "inventory/lab/lab.yml")
    mon, jump = cfg.node("atlas-mon"), cfg.nodes[-1]
    assert (mon.ip, mon.kind, mon.groups) == ("10.77.0.19", "monitoring", ("monitoring",))
    assert [n.name for n in cfg.nodes if n.kind == "monitoring"] == ["atlas-mon"]
    assert (jump.name, jump.kind, jump.ip) == ("atlas-jump", "jump", "10.77.0.20")
    assert {n.name for n in cfg.behind_jump} == {"atlas-n3", "atlas-n4", "atlas-n5", "atlas-gw-west"}


def test_a_node_behind_a_jump_host_is_reached_through_it():
    cfg = _cfg([{"name": "n1", "groups": ["branch_east"], "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536},
                 "via": "jump"},
                {"name": "jump", "kind": "jump", "groups": ["lab_jump"]}])
    hosts = inventory.build(cfg, Path("/k"), Path("/kh"))["all"]["children"]
    common = hosts["atlas_nodes"]["hosts"]["n1"]["ansible_ssh_common_args"]
    assert common.startswith("-o UserKnownHostsFile=/kh -o StrictHostKeyChecking=yes -o ProxyCommand=")
    assert "-W %h:%p root@10.77.0.12" in common and "-i /k" in common
    assert "ProxyCommand" not in hosts["lab_jump"]["hosts"]["jump"]["ansible_ssh_common_args"]
    with pytest.raises(config.UsageError, match=r"nodes\[0\]\.via: 'mon' is not a node of kind jump"):
        _cfg([{"name": "n1", "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}, "via": "mon"},
              {"name": "mon", "kind": "monitoring", "groups": ["monitoring"]}])
