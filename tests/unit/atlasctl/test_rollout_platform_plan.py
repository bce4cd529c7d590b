"""The rollout's plan (plugin_utils/platform_plan.py, `atlasctl rollout --plan`): per wave and unit the steps, the
levels before and after, the branch capacity left, the point of no return (the compatibility table's driver
windows, the 8.5 layout) and what is refused; a 96-node inventory planned from data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.plugin_utils import platform_plan as platform
from ansible_collections.atlas.serving.plugins.plugin_utils import rollout_waves as waves_mu

from atlasctl import cli, exitcodes, rollout
from atlasctl.site_data import load_compat

TABLE = load_compat()
LEVEL_A = {"driver_version": "25.5.0", "driver_firmware_version": "7.8.0.2.212", "cann_version": "8.5.0",
           "atlas_release_id": "r1", "engines_name": "vllm-ascend", "engines_version": "0.13.0"}
LEVEL_B = {"driver_version": "25.5.1", "driver_firmware_version": "7.8.0.3.100", "cann_version": "9.1.0"}
ALL = list(platform.STEPS)


def fleet(branches: int, per_branch: int, canary: bool = True) -> tuple[dict, dict]:
    """groups and {host: groups} of a fleet of branches of serving nodes (the first node the canary)."""
    groups: dict[str, list[str]] = {"atlas_nodes": []}
    for b in range(branches):
        hosts = [f"b{b:02d}-n{i}" for i in range(per_branch)]
        groups[f"branch_b{b:02d}"] = hosts
        groups["atlas_nodes"] += hosts
    if canary:
        groups["canary"] = [groups["atlas_nodes"][0]]
    groups_of: dict[str, list[str]] = {}
    for group, hosts in groups.items():
        for host in hosts:
            groups_of.setdefault(host, []).append(group)
    return groups, groups_of


def make_plan(groups: dict, groups_of: dict, release_vars: dict, before: dict | None = None, **kwargs) -> dict:
    hosts = groups["atlas_nodes"]
    before_vars = {h: dict(before or LEVEL_A) for h in hosts}
    after_vars = {h: {**before_vars[h], **release_vars, "atlas_release_id": "r2"} for h in hosts}
    instances = kwargs.pop("serving_instances", {})
    waves = waves_mu.plan(None, groups, serving_instances=instances, batch=kwargs.pop("batch", 1))
    return platform.plan("r2", waves, before_vars, after_vars, groups_of, TABLE, serving_instances=instances,
                         **kwargs)


def test_a_96_node_inventory_is_planned_per_wave_and_unit() -> None:
    groups, groups_of = fleet(12, 8)
    plan = make_plan(groups, groups_of, LEVEL_B)
    assert plan["ok"] and plan["refused"] == [] and len(plan["waves"]) == 13
    assert [w["name"] for w in plan["waves"]][:2] == ["canary", "b00"]
    units = [u for w in plan["waves"] for u in w["units"]]
    assert len(units) == 96 and all(len(u["hosts"]) == 1 for u in units)
    assert all(u["steps"] == ALL for u in units)
    first = units[0]
    assert first["before"] == {"release": "r1", "driver": "25.5.0", "firmware": "7.8.0.2.212", "cann": "8.5.0"}
    assert first["after"] == {"release": "r2", "driver": "25.5.1", "firmware": "7.8.0.3.100", "cann": "9.1.0"}
    assert any("installs beside 8.5.0" in n for n in first["notes"])
    assert plan["waves"][0]["capacity"] == {"b00": {"backends": 8, "drained_at_once": 1, "left": 7,
                                                    "last_backend_ok": False}}
    # driver 25.5.1 is in CANN 8.5.0's window (25.0.X to 25.5.X): a rollback runs there
    assert plan["point_of_no_return"] == {"units": [], "why": [], "accepted": False}
    assert sorted(plan["assumed"]) == sorted(groups["atlas_nodes"])
    json.dumps(plan)  # --json prints it as it is


def test_steps_follow_what_moves() -> None:
    groups, groups_of = fleet(1, 3, canary=False)
    engine_only = make_plan(groups, groups_of, {"engines_version": "0.13.1"})
    assert engine_only["waves"][0]["units"][0]["steps"] == ["drain", "engines", "models", "serving", "health", "slo",
                                                           "enable"]
    driver_only = make_plan(groups, groups_of, {"driver_version": "25.5.1"})
    unit = driver_only["waves"][0]["units"][0]
    assert unit["steps"] == ["drain", "stop", "driver", "engines", "models", "serving", "health", "slo", "enable"]
    assert any("hot reset" in n for n in unit["notes"])
    cann_only = make_plan(groups, groups_of, {"cann_version": "9.1.0"})
    assert cann_only["waves"][0]["units"][0]["steps"] == ["drain", "cann", "engines", "models", "serving", "health",
                                                         "slo", "enable"]


def test_a_unit_at_the_release_levels_runs_the_gates_only() -> None:
    groups, groups_of = fleet(1, 2, canary=False)
    done = {"driver": "25.5.1", "firmware": "7.8.0.3.100", "cann": "9.1.0", "release": "r2"}
    plan = make_plan(groups, groups_of, LEVEL_B, observed={"b00-n0": done})
    first, second = plan["waves"][0]["units"]
    assert first["steps"] == ["health", "slo", "enable"] and first["before"]["release"] == "r2"
    assert second["steps"] == ALL and plan["assumed"] == ["b00-n1"]


def test_a_driver_outside_the_previous_cann_window_is_a_point_of_no_return() -> None:
    groups, groups_of = fleet(2, 2)
    release = {**LEVEL_B, "driver_version": "26.0.RC1"}  # CANN 8.5.0 runs on 25.0.X to 25.5.X
    plan = make_plan(groups, groups_of, release)
    pnr = plan["point_of_no_return"]
    assert not plan["ok"] and len(pnr["units"]) == 4 and not pnr["accepted"]
    assert "driver 26.0.RC1 is outside the drivers CANN 8.5.0 runs on (25.0.X to 25.5.X" in pnr["why"][0]
    refusal = plan["refused"][0]
    assert refusal["what"] == "the point of no return" and "--accept-no-rollback" in refusal["fix"]
    accepted = make_plan(groups, groups_of, release, accept_no_rollback=True)
    assert accepted["ok"] and accepted["point_of_no_return"]["accepted"]


def test_a_move_that_cannot_keep_the_old_cann_is_refused_without_acceptance() -> None:
    """From CANN 8.3.RC2 (ascend-toolkit/<v>) to 8.5.0 (cann-<v>) Huawei's installers remove the old one; and no
    source gives 8.3.RC2 a driver window."""
    groups, groups_of = fleet(1, 2, canary=False)
    before = {**LEVEL_A, "cann_version": "8.3.RC2", "driver_version": "25.3.0"}
    plan = make_plan(groups, groups_of, {"cann_version": "8.5.0", "driver_version": "25.5.0"}, before=before)
    why = " ".join(plan["point_of_no_return"]["why"])
    assert not plan["ok"] and "cannot be installed beside 8.3.RC2" in why
    assert "no source in the compatibility table says driver 25.5.0 runs CANN 8.3.RC2" in why
    assert any("replaces 8.3.RC2" in n for n in plan["waves"][0]["units"][0]["notes"])
    assert make_plan(groups, groups_of, {"cann_version": "8.5.0", "driver_version": "25.5.0"}, before=before,
                     accept_no_rollback=True)["ok"]


def test_a_batch_that_drains_a_whole_branch_is_refused() -> None:
    groups, groups_of = fleet(2, 1, canary=False)
    plan = make_plan(groups, groups_of, LEVEL_B)
    assert not plan["ok"] and "drains all 1 backend(s)" in plan["refused"][0]["why"]
    wide = make_plan(*fleet(1, 4, canary=False), LEVEL_B, batch=2)
    assert wide["ok"] and wide["waves"][0]["capacity"]["b00"]["left"] == 2


def test_a_multi_node_instance_moves_as_one_unit() -> None:
    groups, groups_of = fleet(1, 3, canary=False)
    instances = {"big": {"nodes": ["b00-n0", "b00-n1"], "tp": 16}}
    plan = make_plan(groups, groups_of, LEVEL_B, serving_instances=instances)
    units = plan["waves"][0]["units"]
    assert [u["hosts"] for u in units] == [["b00-n0", "b00-n1"], ["b00-n2"]]
    assert units[0]["steps"] == ALL
    # the instance serves at its head only: the branch has two backends, one drained at a time
    assert plan["waves"][0]["capacity"]["b00"] == {"backends": 2, "drained_at_once": 1, "left": 1,
                                                   "last_backend_ok": False}


# --- the command ------------------------------------------------------------------------------------------------


@pytest.fixture
def inv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATLAS_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    path = tmp_path / "inv"
    (path / "group_vars").mkdir(parents=True)
    (path / "hosts.yml").write_text(json.dumps({"all": {"children": {
        "atlas_nodes": {"children": {"branch_east": {"hosts": {"n1": {}, "n2": {}}},
                                     "branch_west": {"hosts": {"n3": {}, "n4": {}}}}},
        "canary": {"hosts": {"n3": {}}}}}}))
    (path / "group_vars/all.yml").write_text(json.dumps(LEVEL_A))
    return path


def test_the_command_prints_the_plan_and_changes_nothing(inv: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(rollout, "run", lambda *a, **k: pytest.fail("--plan ran the rollout"))
    release = tmp_path / "b.yml"
    release.write_text(json.dumps(LEVEL_B))
    assert cli.main(["rollout", "-i", str(inv), "--release", "r2", "--vars", str(release), "--plan"]) == exitcodes.OK
    text = capsys.readouterr().out
    assert "PLAN (nothing changes)" in text and "wave 1 canary: branch west keeps 1 of 2 backend(s)" in text
    assert "n3 [west]: drain stop firmware driver reboot cann engines models serving health slo enable" in text
    assert "driver 25.5.0 -> 25.5.1" in text and "point of no return: none" in text
    assert cli.main(["rollout", "-i", str(inv), "--release", "r2", "--vars", str(release), "--plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [[u["hosts"] for u in w["units"]] for w in data["waves"]] == [[["n3"]], [["n1"], ["n2"]], [["n4"]]]
    assert all(set(u) >= {"hosts", "steps"} for w in data["waves"] for u in w["units"])


def test_a_point_of_no_return_refuses_the_rollout_until_accepted(inv: Path, capsys, monkeypatch) -> None:
    ran: list = []
    monkeypatch.setattr(rollout, "run", lambda inventory, release, **kw: ran.append(kw["extravars"]) or {
        "status": "ok", "release": release, "inventory": str(inventory), "seconds": 0, "completed": [],
        "report": "r.json"})
    args = ["rollout", "-i", str(inv), "--release", "r2", "-e", "driver_version=26.0.RC1"]
    assert cli.main([*args, "--plan"]) == exitcodes.FAILED
    assert "REFUSED the point of no return" in capsys.readouterr().out
    assert cli.main(args) == exitcodes.USAGE and ran == []
    err = capsys.readouterr().err.strip().splitlines()  # the error and its fix, as every refusal of atlasctl
    assert len(err) == 2 and "has a point of no return: n3: driver 26.0.RC1" in err[0]
    assert err[1].startswith("  fix:") and "--accept-no-rollback" in err[1]
    assert cli.main([*args, "--accept-no-rollback"]) == exitcodes.OK
    assert ran[0]["rollout_accept_no_rollback"] is True


def test_the_plan_of_the_lab_inventory_runs_without_its_nodes() -> None:
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-m", "atlasctl", "rollout", "-i", str(repo / "inventory/lab"),
                           "--release", "r2", "--plan", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["release"] == "r2"
