"""`atlasctl drain` / `atlasctl enable` (atlasctl/maintenance.py): a node stands for its whole serving unit, units
one after the other through playbooks/maintenance.yml, a report per node; bad names refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlasctl import cli, exitcodes, maintenance
from atlasctl.runner import HostResult, RunResult


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inv"
    (path / "group_vars").mkdir(parents=True)
    (path / "hosts.yml").write_text(json.dumps({"all": {"children": {"atlas_nodes": {"children": {
        "branch_east": {"hosts": {"n1": {}, "n2": {}, "n3": {}}}}}}}}))
    (path / "group_vars/all.yml").write_text(json.dumps({"serving_instances": {"big": {"nodes": ["n2", "n3"]}}}))
    return path


def fake(outcomes: dict[str, HostResult], seen: list):
    def run_fn(playbook, inv, *, extravars, limit):
        seen.append((playbook, extravars, limit))
        return RunResult("successful", 0, outcomes, Path("/tmp"), 1.0)
    return run_fn


def test_a_node_stands_for_its_unit_and_each_gets_its_result(inv: Path) -> None:
    seen: list = []
    outcomes = {"n1": HostResult("n1", facts={"maintenance_result": "drained"}),
                "n2": HostResult("n2", failed=True, failed_task="Gateway | backend | another backend of the branch "
                                 "serves before this node is drained", message="branch east: no other healthy backend")}
    report = maintenance.run(inv, ["n1", "n3"], "down", run_fn=fake(outcomes, seen))
    assert seen == [("playbooks/maintenance.yml", {"maintenance_state": "down"}, "n1,n2,n3")]
    assert [(n["host"], n["unit"], n["result"]) for n in report["nodes"]] == [
        ("n1", ["n1"], "drained"), ("n2", ["n2", "n3"], "refused"), ("n3", ["n2", "n3"], "not reached")]
    assert report["status"] == "failed" and "no other healthy backend" in report["nodes"][1]["why"]
    text = maintenance.render(report)
    assert "n2 (unit n2 + n3): refused" in text and text.startswith("drain on ")


def test_the_commands(inv: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(maintenance, "run_playbook", fake({h: HostResult(h, facts={"maintenance_result": "enabled"})
                                                           for h in ("n2", "n3")}, []))
    assert cli.main(["enable", "-i", str(inv), "n3", "--json"]) == exitcodes.OK
    report = json.loads(capsys.readouterr().out)
    assert report["state"] == "enabled" and [n["host"] for n in report["nodes"]] == ["n2", "n3"]
    assert cli.main(["drain", "-i", str(inv), "n9"]) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert "n9: not a serving node of the inventory" in err and "n1, n2, n3" in err
