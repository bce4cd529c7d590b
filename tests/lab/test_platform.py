"""Platform upgrades on the converged lab, the parts that leave the lab as they found it (the moves themselves are
the platform drills, tests/drills): the rollout's plan of platform level B read from the inventory, site.yml with
level B refused on the live lab naming every node and the rollout (nothing changed), a converged live lab running
site.yml with no refusal and changed=0 while `atlasctl drain` holds a node out (it stays drained through
site.yml), then `atlasctl enable`."""

from __future__ import annotations

import json
import re

import pytest
from labtools import (
    LEVEL_B,
    SERVING,
    atlasctl,
    changed_tasks,
    level_file,
    node_path,
    platform_of,
    playbook,
    recap,
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


def _state(host: str) -> str:
    branch = "east" if host in ("atlas-n1", "atlas-n2") else "west"
    text = node_path(f"atlas-gw-{branch}", f"/etc/nginx/atlas-backends/{branch}/{host}.conf").read_text()
    return "down" if re.search(r"\sdown;", text) else "up"


def test_drain_for_maintenance_stays_through_site_yml_until_enabled(converged_lab):
    drained = atlasctl("drain", "-i", "inventory/lab", "atlas-n1", "--json", check=False)
    try:
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert json.loads(drained.stdout)["nodes"][0]["result"] == "drained"
        assert _state("atlas-n1") == "down"
        # site.yml as a site runs it on the converged live lab (no opt-out): no refusal, nothing changed, and the
        # drained node stays drained (full_fleet's second run, from the controller, is the other such run)
        site = playbook("site.yml", allow_outage=False)
        assert site.returncode == 0 and "Refused" not in site.stdout, site.stdout[-4000:]
        stats = recap(site.stdout)
        assert {h: s["changed"] for h, s in stats.items()} == dict.fromkeys(stats, 0), changed_tasks(site.stdout)
        assert _state("atlas-n1") == "down", "site.yml sent traffic back to a node drained for maintenance"
    finally:
        enabled = atlasctl("enable", "-i", "inventory/lab", "atlas-n1", "--json", check=False)
    assert enabled.returncode == 0, enabled.stdout + enabled.stderr
    assert _state("atlas-n1") == "up"
