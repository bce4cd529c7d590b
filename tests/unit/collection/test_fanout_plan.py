"""The fan-out tree (plugin_utils/fanout.py, filter fanout_plan): the origin sends to the roots only, every other
node pulls from a node that held the tree a round before, inside its branch unless it is the branch's head, at
most ``fanout`` pulls per source and round, the same tree whatever order the inventory lists the hosts in."""

from __future__ import annotations

import random

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter import fanout as fanout_filter
from ansible_collections.atlas.serving.plugins.plugin_utils import fanout


def fleet(branches: int, per_branch: int) -> dict[str, list[str]]:
    """Inventory groups of ``branches`` x ``per_branch`` nodes (b1-n1 ...), a canary and gateways."""
    groups = {f"branch_b{b}": [f"b{b}-n{i}" for i in range(1, per_branch + 1)] for b in range(1, branches + 1)}
    nodes = [h for members in groups.values() for h in members]
    gateways = [f"gw-b{b}" for b in range(1, branches + 1)]
    return groups | {"atlas_nodes": nodes, "canary": [nodes[0]], "gateway": gateways}


def check_shape(plan: dict, groups: dict[str, list[str]], fanout_per_source: int) -> None:
    """What every plan must be: each host once; roots from the origin in round 1; every other node's source held
    the tree a round before, is in its branch unless the node is its branch's head (the only cross-branch
    receiver); at most ``fanout`` pulls per source and round; fallbacks held it before too."""
    nodes = plan["nodes"]
    branch = fanout.branches_of(list(nodes), groups)
    assert sorted(h for r in plan["order"] for h in r) == sorted(nodes)
    assert plan["rounds"] == len(plan["order"]) == len(plan["transfers"])
    assert plan["order"][0] == plan["roots"] and all(nodes[h]["source"] == fanout.ORIGIN for h in plan["roots"])
    heads = {b: min((h for h in nodes if branch[h] == b), key=fanout.natural_key) for b in set(branch.values())}
    for number, pairs in enumerate(plan["transfers"], 1):
        assert sorted(r for _, r in pairs) == sorted(plan["order"][number - 1])
        for source in {s for s, _ in pairs} - {fanout.ORIGIN}:
            assert sum(1 for s, _ in pairs if s == source) <= fanout_per_source
        for source, receiver in pairs:
            assert nodes[receiver]["round"] == number
            if source == fanout.ORIGIN:
                continue
            assert nodes[source]["round"] < number
            assert branch[source] == branch[receiver] or heads[branch[receiver]] == receiver, (source, receiver)
    for host, entry in nodes.items():
        assert entry["sources"][:1] == ([] if entry["source"] == fanout.ORIGIN else [entry["source"]])
        assert len(set(entry["sources"])) == len(entry["sources"])
        assert all(nodes[s]["round"] < entry["round"] for s in entry["sources"])
        assert entry["receivers"] == sorted((h for h in nodes if host in nodes[h]["sources"]),
                                            key=fanout.natural_key)


def test_96_nodes_in_12_branches_the_controller_sends_once_in_a_few_rounds():
    groups = fleet(12, 8)
    plan = fanout_filter.fanout_plan(groups["atlas_nodes"], groups, 2)
    check_shape(plan, groups, 2)
    assert len(plan["nodes"]) == 96
    assert plan["roots"] == ["b1-n1"] and plan["origin_sends"] == 1  # the controller sends each byte once
    assert plan["rounds"] <= 7  # 1 + 2 + 6 + 18 + ...: the holders triple each round
    assert plan["cross_branch"] == 11  # each other branch receives the tree across branches once, at its head
    assert all(len(e["sources"]) == 3 for h, e in plan["nodes"].items() if e["round"] > 3)  # parent + 2 fallbacks
    figures = fanout.summary(plan, 700 * 10**9, 10 * 10**9 / 8)
    assert figures["origin_bytes"] == 700 * 10**9 and figures["direct_origin_bytes"] == 96 * 700 * 10**9
    assert figures["max_pulls_per_source"] == 2
    assert figures["estimated_seconds"] < figures["direct_seconds"] / 5


@pytest.mark.parametrize("branches, per_branch, per_source, roots", [
    (1, 1, 2, 1), (1, 5, 1, 1), (2, 2, 2, 1), (3, 7, 3, 2), (12, 8, 1, 1), (12, 8, 4, 3), (5, 1, 2, 1), (4, 3, 2, 12)])
def test_every_shape_holds_for_small_and_odd_fleets(branches, per_branch, per_source, roots):
    groups = fleet(branches, per_branch)
    plan = fanout.inventory_plan(groups["atlas_nodes"], groups, fanout=per_source, roots=roots)
    check_shape(plan, groups, per_source)
    assert plan["origin_sends"] == min(roots, branches * per_branch)
    # roots spread over branches before a branch gets a second one
    assert len({fanout.branches_of(plan["roots"], groups)[h] for h in plan["roots"]}) == min(roots, branches)


def test_the_plan_is_the_same_whatever_order_the_inventory_lists_hosts_in():
    groups = fleet(12, 8)
    first = fanout.inventory_plan(groups["atlas_nodes"], groups)
    shuffled = dict(groups)
    rng = random.Random(7)
    for name in list(shuffled):
        shuffled[name] = rng.sample(shuffled[name], len(shuffled[name]))
    hosts = rng.sample(groups["atlas_nodes"], 96)
    assert fanout.inventory_plan(hosts, dict(rng.sample(list(shuffled.items()), len(shuffled)))) == first


def test_a_host_in_no_branch_is_a_branch_of_its_own_and_only_the_named_hosts_are_planned():
    groups = fleet(2, 3)
    plan = fanout.inventory_plan(["b1-n1", "b1-n2", "b2-n3", "lone"], groups)
    assert set(plan["nodes"]) == {"b1-n1", "b1-n2", "b2-n3", "lone"}
    assert plan["nodes"]["lone"]["branch"] == "lone"
    assert fanout.inventory_plan([], groups)["rounds"] == 0


@pytest.mark.parametrize("option, value", [("fanout_per_source", 0), ("roots", "two"), ("fallbacks", -1),
                                           ("fanout_per_source", True)])
def test_a_bad_option_names_itself(option, value):
    groups = fleet(1, 2)
    with pytest.raises(AnsibleFilterError, match=option.split("_")[0]):
        fanout_filter.fanout_plan(groups["atlas_nodes"], groups, **{option: value})
