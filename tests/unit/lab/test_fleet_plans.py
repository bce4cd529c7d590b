"""The plan-only paths at fleet size: a generated 96-node, 12-branch inventory (atlaslab.benchmarks.stage, with the
example bank's release) read as Ansible reads it and checked as the product checks it before it touches a node: the
inventory's SSH settings, the rollout's waves, the compatibility gate of every host's plan, the fan-out tree.
Nothing here is timed: the shapes are what must hold at that size; `make bench-stage` prints the plan's figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from ansible_collections.atlas.serving.plugins.filter import compat, rollout
from ansible_collections.atlas.serving.plugins.plugin_utils import fanout

from atlasctl import bundle_push
from atlasctl import inventory as shared
from atlaslab.benchmarks import stage

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The generated inventory on disk beside the example bank's group_vars, as ansible-inventory lists it."""
    root = tmp_path_factory.mktemp("fleet96")
    (root / "hosts.yml").write_text(yaml.safe_dump(stage.fleet_inventory(96, 12), sort_keys=False))
    shutil.copytree(ROOT / "inventory/example-bank/group_vars", root / "group_vars")
    document = shared.listing(root)
    targets, groups = bundle_push.inventory_fleet(root)
    return {"root": root, "document": document, "targets": targets, "groups": groups,
            "hostvars": shared.hostvars(document)}


def test_the_inventory_reads_as_96_nodes_in_12_branches_with_their_ssh_settings(fleet):
    targets = fleet["targets"]
    assert len(targets) == 96 and len({t.address for t in targets}) == 96
    assert {t.user for t in targets} == {"atlas-deploy"} and all(t.become for t in targets)
    branches = {g: h for g, h in fleet["groups"].items() if g.startswith("branch_")}
    assert len(branches) == 12 and {len(h) for h in branches.values()} == {8}
    assert fleet["groups"]["canary"] == ["atlas-b01-01"] and len(fleet["groups"]["gateway"]) == 12


def test_the_rollout_plans_the_canary_then_each_branch_every_node_once(fleet):
    plan = rollout.rollout_plan(None, fleet["groups"])
    assert [w["name"] for w in plan] == ["canary"] + [f"b{b:02d}" for b in range(1, 13)]
    assert len(plan) <= rollout.MAX_WAVES
    hosts = [h for w in plan for h in w["hosts"]]
    assert sorted(hosts) == sorted(fleet["groups"]["atlas_nodes"]) and len(set(hosts)) == 96
    assert plan[1]["hosts"] == [f"atlas-b01-{i:02d}" for i in range(2, 9)]  # the canary rolled already
    assert all(w["batches"] == [1] * len(w["hosts"]) for w in plan)  # one node at a time: the default batch


def test_the_compatibility_gate_judges_every_host_in_one_group(fleet):
    keys = yaml.safe_load((ROOT / "roles/preflight/defaults/main.yml").read_text())["preflight_compat_keys"]
    plans = compat.compat_plans(fleet["groups"]["atlas_nodes"], fleet["hostvars"], keys)
    assert len(plans) == 96 and plans["atlas-b12-08"]["cann"] == "8.3.RC2"
    verdict = compat.compat_fleet(plans)
    assert [len(g["hosts"]) for g in verdict["groups"]] == [96]  # identical plans share one verdict
    assert verdict["ok"] is True, json.dumps(verdict["report"])


def test_the_fanout_tree_sends_each_byte_once_from_the_controller(fleet):
    plan = fanout.inventory_plan(fleet["groups"]["atlas_nodes"], fleet["groups"])
    assert plan["roots"] == ["atlas-b01-01"] and plan["origin_sends"] == 1
    assert plan["rounds"] == 6 and [len(r) for r in plan["order"]] == [1, 2, 6, 18, 48, 21]
    assert plan["cross_branch"] == 11
    for pairs in plan["transfers"][1:]:
        sources = [s for s, _ in pairs]
        assert max(sources.count(s) for s in sources) <= fanout.DEFAULT_FANOUT
    figures = stage.plan_figures(96, 12, 700 << 30, 10.0)
    assert figures["origin_ratio"] == 1.0 and figures["direct_origin_bytes"] == 96 * (700 << 30)
    assert figures["estimated_seconds"] < figures["direct_seconds"] / 5
