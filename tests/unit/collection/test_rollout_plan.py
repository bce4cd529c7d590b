"""rollout_plan: waves from data, canary first, a host in its first wave only, resume."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.filter import rollout

GROUPS = {"atlas_nodes": ["n1", "n2", "n3", "n4"], "canary": ["n1"], "branch_east": ["n1", "n2"],
          "branch_west": ["n3", "n4"], "gateway": ["gw-east", "gw-west"]}


def test_default_plan_is_canary_then_branches_without_repeats():
    plan = rollout.rollout_plan(None, GROUPS)
    assert [(w["name"], w["hosts"], w["index"]) for w in plan] == [
        ("canary", ["n1"], 1), ("east", ["n2"], 2), ("west", ["n3", "n4"], 3)]
    assert not any(w["skipped"] for w in plan)


def test_branch_order_batch_and_gateways_left_out():
    plan = rollout.rollout_plan([], GROUPS, branch_order=["west", "east"], batch=2)
    assert [w["name"] for w in plan] == ["canary", "west", "east"]
    assert plan[1]["serial"] == 2
    waves = [{"name": "all", "hosts": "all_of_it"}]
    with pytest.raises(AnsibleFilterError, match="all_of_it"):
        rollout.rollout_plan(waves, GROUPS)
    plan = rollout.rollout_plan([{"name": "gw", "hosts": ["gw-east", "n3"]}], GROUPS)
    assert plan[0]["hosts"] == ["n3"]


def test_resume_skips_earlier_waves_and_names_unknown_ones():
    plan = rollout.rollout_plan(None, GROUPS, resume_from="west")
    assert [w["skipped"] for w in plan] == [True, True, False]
    with pytest.raises(AnsibleFilterError, match="north"):
        rollout.rollout_plan(None, GROUPS, resume_from="north")


def test_too_many_waves_is_refused():
    groups = {"atlas_nodes": [f"n{i}" for i in range(20)], **{f"branch_b{i:02d}": [f"n{i}"] for i in range(20)}}
    with pytest.raises(AnsibleFilterError, match="at most 16"):
        rollout.rollout_plan(None, groups)


INSTANCES = {"west-pair": {"nodes": ["n3", "n4"], "tp": 4}}


def test_an_instance_is_one_unit_in_the_wave_of_its_first_rank():
    groups = {**GROUPS, "canary": ["n3"], "atlas_nodes": ["n1", "n2", "n3", "n4", "n5"],
              "branch_west": ["n3", "n4", "n5"]}
    plan = rollout.rollout_plan(None, groups, serving_instances=INSTANCES)
    assert [(w["name"], w["hosts"], w["units"], w["batches"]) for w in plan] == [
        ("canary", ["n3", "n4"], [["n3", "n4"]], [2]),
        ("east", ["n1", "n2"], [["n1"], ["n2"]], [1, 1]),
        ("west", ["n5"], [["n5"]], [1])]


@pytest.mark.parametrize(("serial", "batches"), [
    (1, [2, 1, 1]), (2, [3, 1]), ("2", [3, 1]), ("50%", [2, 1, 1]), ("67%", [3, 1]), ("100%", [4]), ("10%", [2, 1, 1]),
    ([1, "100%"], [2, 2]), ([2, 1], [3, 1])])
def test_serial_counts_units_and_never_splits_one(serial, batches):
    groups = {"atlas_nodes": ["a", "b", "c", "d"], "branch_x": ["b", "a", "c", "d"]}
    instances = {"ab": {"nodes": ["a", "b"], "tp": 1}}
    plan = rollout.rollout_plan([{"name": "x", "hosts": "branch_x", "serial": serial}], groups,
                                serving_instances=instances)
    assert plan[0]["hosts"] == ["a", "b", "c", "d"], "ranks in rank order, the unit first where a rank came first"
    assert plan[0]["batches"] == batches
    assert sum(plan[0]["batches"]) == 4


@pytest.mark.parametrize("serial", [0, "0", "x", "0%", True, "-1", [1, "none"]])
def test_a_bad_serial_names_the_wave(serial):
    with pytest.raises(AnsibleFilterError, match=r"rollout_waves\[0\] \(x\): serial"):
        rollout.rollout_plan([{"name": "x", "hosts": ["n1"], "serial": serial}], GROUPS)


def test_an_instance_with_a_rank_outside_the_fleet_is_refused():
    with pytest.raises(AnsibleFilterError, match="names n9, not in the fleet"):
        rollout.rollout_plan(None, GROUPS, serving_instances={"p": {"nodes": ["n3", "n9"], "tp": 1}})
