"""Staged rollout on the lab: canary then branch by branch behind real nginx gateways, under
continuous client load through both gateways; SLO-gate failure rolled back on the canary while
a second rollout on the same inventory is refused; an engine that fails to start rolled back; a
rollout of the running release restarts nothing; each of those rollouts left a signed evidence pack
without the API key it ran with. A node lost before its wave, then --resume, is
the drill table's `node-lost` row (tests/drills/drill_table.py; the drill itself is in
tests/drills/drills_rollout.py), which `.ci/run` runs after `make test`: a full rollout with two vLLM
restarts costs the lab minutes."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from labtools import ATLASCTL, ENV, ROOT, SERVING, Load, atlasctl, grep_tree, lab, lab_api_key, layout, model_service
from labtools import releases as _releases
from labtools import rollout as _rollout

from atlaslab import signing

pytestmark = pytest.mark.lab

CANARY = "atlas-n3"
LENIENT_SLO = 'rollout_slo={"e2el_ms": 60000}'
# An API key in the usual place (a --vars file, as serving_api_key), given to the rollout of the running release:
# in its hostvars, its health probe and its SLO load, never in its evidence pack.
REPORTS: list[dict] = []  # this module's rollouts, whose evidence packs the last test checks


@pytest.fixture(scope="module")
def converged(converged_lab):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    return converged_lab.hosts


def test_slo_failure_rolls_the_canary_back_and_stops_and_a_second_rollout_is_refused(converged):
    """The canary fails its SLO gate and goes back; the fleet stays on the old release. While that
    rollout runs, a second one on the same inventory is refused (exit 2, "already running")."""
    before = _releases()
    with Load() as load:
        first = subprocess.Popen([*ATLASCTL, "rollout", "-i", "inventory/lab", "--json", "--release", "lab-2026.11.3",
                                  "-e", 'rollout_slo={"e2el_ms": 1}'], cwd=ROOT, env=ENV, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _wait_for_lock(first)
            second = atlasctl("rollout", "-i", "inventory/lab", "--release", "lab-2026.11.3", check=False, timeout=60)
        finally:
            out, err = first.communicate(timeout=1200)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "already running" in second.stderr
    assert first.returncode == 1, out[-3000:] + err[-3000:]
    report = json.loads(out)
    REPORTS.append(report)
    failure = report["failure"]
    assert (failure["host"], failure["wave"], failure["gate"]) == (CANARY, "canary", "slo")
    assert "e2el" in failure["why"].lower() or "e2e" in failure["why"].lower(), failure
    assert failure["measured"]["metrics"], "the report carries what the gate measured"
    assert report["completed"] == []
    assert _releases() == before, "the fleet stays on the old release"
    assert load.failed == [], load.failed[:5]


def _wait_for_lock(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the running rollout holds the inventory's rollout lock (it writes its pid into it)."""
    from atlasctl.rollout import inventory_key, rollouts_dir

    lock = rollouts_dir() / inventory_key((ROOT / "inventory/lab").resolve()) / "rollout.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if lock.is_file() and lock.read_text().startswith(f"pid {proc.pid},"):
            return
        time.sleep(0.2)
    raise AssertionError(f"the first rollout never took the rollout lock {lock}")


def test_engine_that_fails_to_start_is_rolled_back(converged):
    """A release with a flag the engine does not have, forced past the lint with the expert
    override: the canary's engine exits at start, the canary goes back to the old release."""
    before = _releases()
    with Load() as load:
        rc, report = _rollout("--release", "lab-2026.11.4", "-e", 'serving_flags_extra={"--no-such-flag": true}',
                              "-e", "serving_lint_override=true", "-e", "rollout_health_timeout_s=30",
                              "-e", LENIENT_SLO)
    REPORTS.append(report)
    assert rc == 1, report
    failure = report["failure"]
    assert (failure["host"], failure["wave"]) == (CANARY, "canary"), failure
    assert failure["gate"] in ("restart", "health"), failure
    assert _releases() == before, "the fleet stays on the old release"
    where = layout(CANARY)  # branch west's own layout (inventory/lab/group_vars/branch_west.yml)
    args = lab("ssh", CANARY, "cat", where["serving_args_file"], timeout=60).stdout
    assert "--no-such-flag" not in args, "the canary runs the old configuration again"
    links = lab("ssh", CANARY, f"readlink {where['serving_config_dir']}/current; ls {where['serving_release_dir']}",
                timeout=60).stdout.split()
    assert links[0] == f"releases/{before[CANARY]}", "current switched back to the previous release"
    assert "lab-2026.11.4" in links[1:], "the failed release stays side by side (for the post-mortem)"
    assert load.failed == [], load.failed[:5]


def _pids() -> dict[str, str]:
    return {host: model_service(host)[1] for host in SERVING}


def test_rollout_of_the_running_release_restarts_nothing(converged, tmp_path):
    """Every node already serves the release (what a --resume finds on the nodes its wave finished):
    no drain, no stage, no restart; the gates run and the rollout completes."""
    release = _releases()["atlas-n1"]
    assert _releases() == dict.fromkeys(SERVING, release)
    pids = _pids()
    keyed = tmp_path / "release.yml"
    keyed.write_text(f"serving_api_key: {lab_api_key()}\n")  # the lab's own key, from a vars file (0600): the
    keyed.chmod(0o600)                                         # evidence test looks for it in every pack
    with Load() as load:
        rc, report = _rollout("--release", release, "-e", LENIENT_SLO, "--vars", str(keyed))
    REPORTS.append(report)
    assert rc == 0, report
    assert report["completed"] == ["canary", "east", "west"]
    assert _pids() == pids, "a converged node was restarted"
    assert load.failed == [], load.failed[:5]


def test_each_rollout_left_a_signed_evidence_pack_without_the_api_key(converged, tmp_path):
    """No rollout of its own: the packs of this module's rollouts verify against the lab controller's evidence
    key (the inventory names it), record the canary's SLO rollback and what every node runs, hold no API key,
    and a copy with one byte changed is refused."""
    if not REPORTS:
        pytest.skip("no rollout of this module ran in this session (run the whole file)")
    for report in REPORTS:
        summary = report.get("evidence") or {}
        assert summary.get("dir") and summary.get("signed"), summary
        pack = Path(summary["dir"])
        assert pack.parent == Path(report["report"]).parent, "the pack lies beside its report"
        proc = atlasctl("evidence", "verify", str(pack), "-i", "inventory/lab", check=False, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert grep_tree(pack, lab_api_key().encode()) == [], "the API key is in an evidence pack"
        record = json.loads((pack / "evidence.json").read_text())
        assert record["release"] == report["release"] and record["complete"], record["status"]
        assert record["signature"]["key"] == signing.ensure_key(signing.EVIDENCE) != signing.ensure_key()
        assert record["bundle"]["signed_by"] == signing.ensure_key(), "the bundle's signer is the lab bundle key"
    failed = json.loads((Path(REPORTS[0]["evidence"]["dir"]) / "evidence.json").read_text())
    assert failed["status"] == "failed"
    assert [(r["host"], r["gate"]) for r in failed["rollbacks"]] == [(CANARY, "slo")], failed["rollbacks"]
    last = json.loads((Path(REPORTS[-1]["evidence"]["dir"]) / "evidence.json").read_text())
    assert last["status"] == "ok" and sorted(n["host"] for n in last["nodes"]) == sorted(SERVING)
    for node in last["nodes"]:
        versions = node["versions"]
        assert versions["release_id"] == last["release"] and versions.get("model_version"), node
        assert versions.get("driver") and versions.get("firmware") and versions.get("cann"), node
        assert {"atlas-serving.args", "atlas-serving.env"} <= set(node["files_sha256"]), node
        assert [g["result"] for g in node["gates"] if g["gate"] in ("health", "slo")] == ["passed", "passed"], node
    copy = tmp_path / "copy.evidence"
    shutil.copytree(REPORTS[-1]["evidence"]["dir"], copy)
    data = bytearray((copy / "evidence.json").read_bytes())
    data[10] ^= 0x01
    (copy / "evidence.json").write_bytes(bytes(data))
    proc = atlasctl("evidence", "verify", str(copy), "-i", "inventory/lab", check=False, timeout=120)
    assert proc.returncode == 1 and "evidence.json: changed" in proc.stderr, proc.stdout + proc.stderr
