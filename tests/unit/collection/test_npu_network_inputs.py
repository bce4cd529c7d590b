"""The NPU network stage's inputs (module_utils/npu_network.py) and the HCCL / Gloo / TP host variables
(module_utils/comm_env.py): tables of inventories and facts -> problems and values."""

from __future__ import annotations

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import comm_env, npu_network

MASK, GW = "255.255.255.0", "10.20.0.1"


def host(base: int, **extra) -> dict:
    return {"npu_network_addresses": [f"10.20.0.{base + n}" for n in range(8)], "npu_network_netmask": MASK,
            "npu_network_gateway": GW, **extra}


HOSTVARS = {"n1": host(10), "n2": host(20), "n3": {}, "gw": {}}
INSTANCES = {"ds-v3": {"nodes": ["n1", "n2"], "profile": "p"}, "solo": {"nodes": ["n3"]}}


def with_host(name: str, **changes) -> dict:
    return {**HOSTVARS, name: {**HOSTVARS[name], **changes}}


@pytest.mark.parametrize(("hostvars", "instances", "name", "expected"), [
    (HOSTVARS, INSTANCES, "n1", []),
    (HOSTVARS, INSTANCES, "n3", []),
    (HOSTVARS, None, "n1", []),
    (with_host("n1", npu_network_addresses=["10.20.0.10", "10.20.0.300"]), None, "n1",
     ["n1: npu_network_addresses has entries that are not IPv4 addresses (1: '10.20.0.300')"]),
    (with_host("n1", npu_network_addresses=["10.20.0.10", "10.20.0.10"]), None, "n1",
     ["n1: npu_network_addresses gives 10.20.0.10 to NPU 0 and NPU 1"]),
    (with_host("n1", npu_network_addresses="10.20.0.10"), None, "n1",
     ["n1: npu_network_addresses must be a list of IPv4 addresses (index = NPU id), got '10.20.0.10'"]),
    (with_host("n1", npu_network_netmask="255.0.255.0"), None, "n1",
     ["n1: npu_network_netmask '255.0.255.0' is not an IPv4 netmask (e.g. 255.255.255.0)"]),
    (with_host("n1", npu_network_gateway=None), None, "n1",
     ["n1: npu_network_gateway None is not an IPv4 address (the NPU subnet's gateway)"]),
    (with_host("n1", npu_network_gateway="10.30.0.1"), None, "n1",
     ["n1: npu_network_gateway 10.30.0.1 is outside the NPU subnet 10.20.0.0/24"]),
    (with_host("n1", npu_network_netdetect="x"), None, "n1",
     ["n1: npu_network_netdetect 'x' is not an IPv4 address (default: the gateway)"]),
    (with_host("n1", npu_network_tls_enable=2), None, "n1", ["n1: npu_network_tls_enable 2 must be 0 or 1"]),
    (with_host("n1", npu_network_addresses=["10.20.0.10", "10.20.1.10"]), None, "n1",
     ["n1: npu_network_addresses span 2 subnets (10.20.0.0/24, 10.20.1.0/24) with netmask 255.255.255.0: "
      "the 8 NPU ports of an Atlas 800T A2 use one subnet"]),
    (with_host("n2", npu_network_tls_enable=1), INSTANCES, "n1",
     ["instance ds-v3: npu_network_tls_enable differs between its nodes (n1=0, n2=1): "
      "set the same value on every node of the instance"]),
    (with_host("n2", npu_network_addresses=[]), INSTANCES, "n1",
     ["instance ds-v3 spans 2 nodes but n2 has no npu_network_addresses: give every node's NPUs an address"]),
    (HOSTVARS, {"big": {"nodes": ["n1", "n9"]}}, "n1", ["instance big: n9 not in the inventory"]),
    (with_host("n2", npu_network_addresses=[f"10.20.0.{n}" for n in (10, 21, 22, 23, 24, 25, 26, 27)]),
     INSTANCES, "n2", ["instance ds-v3: 10.20.0.10 is both n1 NPU 0 and n2 NPU 0"]),
    (HOSTVARS, {"bad": {"nodes": "n1"}}, "n1",
     ["serving_instances.bad.nodes must be a non-empty list of inventory host names (rank = position, "
      "first = head), got 'n1'"]),
    (HOSTVARS, {"twice": {"nodes": ["n1", "n1"]}}, "n1", ["serving_instances.twice.nodes names n1 more than once"]),
    (HOSTVARS, ["n1"], "n1", ["serving_instances must be a mapping of instance name -> {nodes: [...]}, got list"]),
])
def test_problems(hostvars: dict, instances, name: str, expected: list) -> None:
    assert npu_network.problems(name, hostvars, instances) == expected


def test_npu_count_must_match() -> None:
    assert npu_network.problems("n1", HOSTVARS, None, npu_count=8) == []
    assert npu_network.problems("n1", HOSTVARS, None, npu_count=4) == [
        "n1: npu_network_addresses has 8 entries but the node has 4 NPUs: give one address per NPU (index = NPU id)"]


@pytest.mark.parametrize(("name", "work", "instances"), [
    ("n1", True, ["ds-v3"]),
    ("n3", False, []),      # in a one-node instance, no addresses: nothing to do
    ("gw", False, []),
])
def test_which_hosts_have_work(name: str, work: bool, instances: list) -> None:
    assert npu_network.has_work(name, HOSTVARS, INSTANCES) is work
    assert [i["name"] for i in npu_network.multi_node_instances(name, INSTANCES)] == instances


def test_instances_give_rank_and_head() -> None:
    assert npu_network.instances_of("n2", INSTANCES) == [
        {"name": "ds-v3", "nodes": ["n1", "n2"], "rank": 1, "head": "n1"}]


def test_targets_are_every_address_of_the_other_nodes() -> None:
    instance = npu_network.instances_of("n1", INSTANCES)[0]
    targets = npu_network.ping_targets("n1", instance, HOSTVARS)
    assert len(targets) == 8 and targets[0] == {"node": "n2", "device": 0, "address": "10.20.0.20"}
    assert {t["node"] for t in targets} == {"n2"}


# ------------------------------------------------------------------- HCCL / Gloo / TP variables

FACTS = {
    "default_ipv4": {"interface": "eth0", "address": "10.77.0.11"},
    "interfaces": ["lo", "eth0", "enp-data"],
    "lo": {"ipv4": {"address": "127.0.0.1"}},
    "eth0": {"ipv4": {"address": "10.77.0.11"}},
    "enp_data": {"ipv4": {"address": "192.168.9.11"}, "ipv4_secondaries": [{"address": "192.168.9.12"}]},
}
NIC4 = ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({}, {"HCCL_IF_IP": "10.77.0.11", **dict.fromkeys(NIC4, "eth0")}),
    ({"interface": "enp-data"}, {"HCCL_IF_IP": "192.168.9.11", **dict.fromkeys(NIC4, "enp-data")}),
    ({"interface": "enp-data", "address": "192.168.9.12"},
     {"HCCL_IF_IP": "192.168.9.12", **dict.fromkeys(NIC4, "enp-data")}),
    ({"overrides": {"HCCL_SOCKET_IFNAME": "=eth0"}},
     {"HCCL_IF_IP": "10.77.0.11", **dict.fromkeys(NIC4, "eth0"), "HCCL_SOCKET_IFNAME": "=eth0"}),
])
def test_render_from_the_facts_and_overrides(kwargs: dict, expected: dict) -> None:
    env = comm_env.render(FACTS, **kwargs)
    assert env == expected
    assert comm_env.problems("n1", env, FACTS) == []


@pytest.mark.parametrize(("facts", "kwargs", "message"), [
    ({"interfaces": ["lo"]}, {}, "no default IPv4 route"),
    (FACTS, {"interface": "eth9"}, "interface eth9 has no IPv4 address"),
])
def test_render_refuses_what_it_cannot_know(facts: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(comm_env.CommEnvError, match=message):
        comm_env.render(facts, **kwargs)


HAVE = "(it has: enp-data 192.168.9.11, 192.168.9.12; eth0 10.77.0.11; lo 127.0.0.1)"


@pytest.mark.parametrize(("env", "expected"), [
    ({"HCCL_IF_IP": "10.77.0.99"}, [f"n1: HCCL_IF_IP=10.77.0.99 is not an address of this node {HAVE}"]),
    ({"GLOO_SOCKET_IFNAME": "eth1"}, [f"n1: GLOO_SOCKET_IFNAME=eth1 names eth1, which the node does not have {HAVE}"]),
    ({"TP_SOCKET_IFNAME": "eth0,bond0"}, [f"n1: TP_SOCKET_IFNAME=eth0,bond0 names bond0, which the node does not "
                                          f"have {HAVE}"]),
    ({"HCCL_SOCKET_IFNAME": "=eth1"},
     [f"n1: HCCL_SOCKET_IFNAME==eth1 names eth1, which the node does not have {HAVE}"]),
    ({"HCCL_SOCKET_IFNAME": "bond,ib"}, [f"n1: HCCL_SOCKET_IFNAME=bond,ib matches no interface of the node (its values "
                                         f"are interface name prefixes) {HAVE}"]),
    ({"HCCL_SOCKET_IFNAME": "^=lo,eth0,enp-data"}, [f"n1: HCCL_SOCKET_IFNAME=^=lo,eth0,enp-data excludes every "
                                                    f"interface of the node {HAVE}"]),
    ({"HCCL_SOCKET_IFNAME": "en"}, []),
    ({"HCCL_SOCKET_IFNAME": "^lo"}, []),
    ({"HCCL_IF_IP": "192.168.9.12", "GLOO_SOCKET_IFNAME": "enp-data"}, []),
    ({"VLLM_HOST_IP": "1.2.3.4"}, []),
])
def test_lint_names_the_host_variable_and_what_the_node_has(env: dict, expected: list) -> None:
    assert comm_env.problems("n1", env, FACTS) == expected
