"""Platform upgrades on the converged lab, the parts that leave the lab as they found it (the moves themselves are
the platform drills, tests/drills): the rollout's plan of platform level B read from the inventory, site.yml with
level B refused on the live lab naming every node and the rollout (nothing changed), and full_fleet's site.yml runs
with no refusal and changed=0 while `atlasctl drain` holds a node out (it stays drained through site.yml), then
`atlasctl enable`."""

from __future__ import annotations

import json
import re

import pytest
from labtools import (
    CONTROLLER,
    LEVEL_B,
    MAINTENANCE_NODE,
    SERVING,
    atlasctl,
    backend_states,
    level_file,
    platform_of,
    playbook,
    releases,
)

pytestmark = pytest.mark.lab
ALL_STEPS = ["drain", "stop", "firmware", "driver", "reboot", "cann", "engines", "models", "serving", "health", "slo",
             "enable"]


def test_the_plan_of_level_b(converged_lab, tmp_path):
    vars_file = level_file(tmp_path, "level-b", LEVEL_B)
    proc = atlasctl("rollout", "-i", "inventory/lab", "--release", "lab-level-b", "--vars", str(vars_file), "--plan",
                    "--json", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)
    units = [u for w in plan["waves"] for u in w["units"]]
    assert sorted(h for u in units for h in u["hosts"]) == sorted(SERVING)
    assert all(u["steps"] == ALL_STEPS for u in units), units
    assert all(u["after"]["cann"] == "9.1.0" and u["after"]["driver"] == "25.5.1" for u in units)
    assert plan["point_of_no_return"]["units"] == [] and plan["refused"] == []


def test_site_yml_with_level_b_is_refused_on_the_live_lab(converged_lab, tmp_path):
    before = {h: platform_of(h) for h in SERVING}
    releases_before = releases()
    vars_file = level_file(tmp_path, "level-b", LEVEL_B)
    run = playbook("site.yml", "-e", f"@{vars_file}", allow_outage=False)
    out = " ".join(run.stdout.split())
    assert run.returncode != 0
    assert "Refused: this run would take serving nodes down." in out, run.stdout[-4000:]
    for host in SERVING:
        assert re.search(rf"{host} would install (firmware and driver|driver and firmware)", out), host
    assert "atlasctl rollout -i" in out and "Nothing was changed" in out
    assert {h: platform_of(h) for h in SERVING} == before
    assert releases() == releases_before


def test_drain_for_maintenance_stays_through_site_yml_until_enabled(full_fleet):
    """full_fleet's two site.yml runs find MAINTENANCE_NODE drained (`atlasctl drain`): the second, from the
    controller as a site runs it (no opt-out), is refused nowhere and changes nothing, neither run sends traffic
    back to the drained node, and `atlasctl enable` does."""
    assert full_fleet.drained.returncode == 0, full_fleet.drained.stdout + full_fleet.drained.stderr
    assert json.loads(full_fleet.drained.stdout)["nodes"][0]["result"] == "drained"
    full_fleet.assert_converged()
    assert full_fleet.second_from == CONTROLLER, "the second run did not run from the controller (test_controller)"
    assert "Refused" not in full_fleet.second.stdout, full_fleet.second.stdout[-4000:]
    assert full_fleet.drained_states == ["down", "down", "down"], (
        "after the drain, the first and the second run: site.yml sent traffic back to a node drained for maintenance")
    assert full_fleet.enabled.returncode == 0, full_fleet.enabled.stdout + full_fleet.enabled.stderr
    assert backend_states()[MAINTENANCE_NODE] == "up"
