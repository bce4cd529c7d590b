"""rollout_plan: waves from data, canary first, a host in its first wave only, resume."""

from __future__ import annotations

import importlib

import pytest
from ansible.errors import AnsibleFilterError

from atlasctl.collection import ensure_on_path

ensure_on_path()
rollout = importlib.import_module("ansible_collections.atlas.serving.plugins.filter.rollout")

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
