"""`make bench-stage`'s pure parts (atlaslab.benchmarks.stage): the generated fleet, a push's report as a row, the
table, the plan-only run (no lab), the synthetic bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atlasctl import bundle, exitcodes
from atlaslab.benchmarks import stage

REPORT = {"mode": "fan-out", "ok": True, "verified": True, "bundle_bytes": 256 << 20, "controller_bytes": 257 << 20,
          "controller_ratio": 1.004, "rounds": 3,
          "hosts": [{"host": "atlas-n1", "files_sent": 5, "via": "controller", "bytes_received": 0},
                    {"host": "atlas-n2", "files_sent": 0, "via": "atlas-n1", "bytes_received": 256 << 20},
                    {"host": "atlas-n3", "files_sent": 0, "via": "atlas-n1", "bytes_received": 256 << 20}]}


@pytest.mark.parametrize("nodes, branches, sizes", [(96, 12, {8}), (10, 3, {4, 2}), (1, 1, {1})])
def test_a_generated_fleet_has_its_nodes_in_whole_branches(nodes, branches, sizes):
    groups = stage.fleet_groups(stage.fleet_inventory(nodes, branches))
    assert len(groups["atlas_nodes"]) == nodes
    branch = [g for g in groups if g.startswith("branch_")]
    assert {len(groups[g]) for g in branch} == sizes and len(groups["gateway"]) == branches
    assert groups["canary"] == [groups["atlas_nodes"][0]]


def test_a_fleet_of_more_branches_than_nodes_is_refused():
    with pytest.raises(ValueError, match="branches <= nodes"):
        stage.fleet_inventory(4, 5)


def test_a_push_report_is_a_row_with_its_goal():
    row = stage.lab_row("fan-out push", REPORT, 42.04)
    assert (row["seconds"], row["ratio"], row["goal"], row["received"], row["files_sent"]) == (
        42.0, 1.004, True, 512 << 20, 5)
    direct = stage.lab_row("direct push", REPORT | {"mode": "direct", "controller_ratio": 3.01}, 30)
    assert direct["goal"] is None  # the direct push has no goal: it is what the fan-out is measured against
    missed = stage.lab_row("fan-out push", REPORT | {"controller_ratio": 1.5}, 30)
    text = stage.render({"code": "abc", "lab": [direct, row, missed],
                         "plan": stage.plan_figures(96, 12, 700 << 30, 10.0)})
    assert "MISSED" in text and " OK " in text
    assert "fan-out sources: atlas-n1 <- controller, atlas-n2 <- atlas-n1" in text
    assert "rounds 6 (nodes per round [1, 2, 6, 18, 48, 21])" in text
    assert "the controller sends 700 GiB (1.00 x the bundle; a direct push 67200 GiB, 96 x)" in text


def test_the_plan_only_run_needs_no_lab(tmp_path, capsys):
    out = tmp_path / "stage.json"
    assert stage.main(["--plan-only", "--plan-nodes", "24", "--plan-branches", "6", "--json", str(out)]) == \
        exitcodes.OK
    assert "24 nodes in 6 branches" in capsys.readouterr().out
    figures = json.loads(out.read_text())["plan"]
    assert figures["nodes"] == 24 and figures["origin_ratio"] == 1.0 and "lab" not in json.loads(out.read_text())


@pytest.mark.parametrize("argv", [["--plan-only", "--plan-branches", "0"], ["--size-mib", "0"],
                                  ["--plan-only", "--link-gbps", "-1"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        stage.main(argv)
    assert exited.value.code == exitcodes.USAGE and "Traceback" not in capsys.readouterr().err


def test_the_synthetic_bundle_is_a_bundle_of_that_size(tmp_path, monkeypatch):
    signed = []
    monkeypatch.setattr("atlaslab.signing.sign_bundle", signed.append)
    root = stage.make_bundle(tmp_path / "b", 3)
    manifest = bundle.load(root)
    assert sum(e["size"] for e in manifest.data["files"]) == 3 << 20 and signed == [root]
    assert bundle.verify_bundle(root, manifest=manifest) == []
    assert all(oct(Path(root, e["path"]).stat().st_mode & 0o777) == "0o644" for e in manifest.data["files"])
