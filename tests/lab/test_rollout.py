"""Staged rollout on the lab: canary then branch by branch behind real nginx gateways, under
continuous client load through both gateways; SLO-gate failure rolled back on the canary while
a second rollout on the same inventory is refused; an engine that fails to start rolled back; a
rollout of the running release restarts nothing. A node lost before its wave, then --resume, is
the drill table's `node-lost` row (tests/drills/drill_table.py), which `.ci/run` runs after
`make test`: a full rollout with two vLLM restarts costs the lab minutes."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from labtools import ATLASCTL, ENV, ROOT, SERVING, Load, atlasctl, lab, layout, model_service
from labtools import releases as _releases
from labtools import rollout as _rollout

pytestmark = pytest.mark.lab

CANARY = "atlas-n3"
LENIENT_SLO = 'rollout_slo={"e2el_ms": 60000}'


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


def test_rollout_of_the_running_release_restarts_nothing(converged):
    """Every node already serves the release (what a --resume finds on the nodes its wave finished):
    no drain, no stage, no restart; the gates run and the rollout completes."""
    release = _releases()["atlas-n1"]
    assert _releases() == dict.fromkeys(SERVING, release)
    pids = _pids()
    with Load() as load:
        rc, report = _rollout("--release", release, "-e", LENIENT_SLO)
    assert rc == 0, report
    assert report["completed"] == ["canary", "east", "west"]
    assert _pids() == pids, "a converged node was restarted"
    assert load.failed == [], load.failed[:5]
