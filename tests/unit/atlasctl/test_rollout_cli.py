"""atlasctl rollout: lock per inventory, resume state, failure folded from the rescue's message."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from atlasctl import cli, rollout
from atlasctl.errors import UsageError
from atlasctl.runner import RunResult

PLAN = [{"name": "canary", "hosts": ["n1"], "serial": 1, "index": 1, "skipped": False},
        {"name": "east", "hosts": ["n2"], "serial": 1, "index": 2, "skipped": False}]
FAILURE = {"host": "n2", "wave": "east", "gate": "slo", "why": "p95 e2el 900 ms > 300 ms", "measured": {},
           "previous": "r1", "release": "r2", "task": "x"}


def _events(fail: bool) -> list[dict]:
    ev = [{"event": "runner_on_ok", "event_data": {"task": "Rollout | plan | the waves", "host": "localhost",
                                                   "res": {"ansible_facts": {"rollout_plan": PLAN}}}},
          {"event": "playbook_on_play_start", "event_data": {"play": "Rollout | wave 1"}},
          {"event": "runner_on_ok", "event_data": {"task": "Rollout | node | report", "host": "n1", "res": {
              "ansible_facts": {"rollout_node_report": {"host": "n1", "wave": "canary", "previous": "r1",
                                                        "release": "r2", "result": "ok"}}}}},
          {"event": "playbook_on_play_start", "event_data": {"play": "Rollout | wave 2"}}]
    if not fail:
        ev.append({"event": "playbook_on_play_start", "event_data": {"play": "Rollout | wave 3"}})
    if fail:
        ev.append({"event": "runner_on_failed", "event_data": {
            "task": "Rollout | rollback | stop the rollout", "host": "n2",
            "res": {"msg": rollout.FAILED_PREFIX + json.dumps(FAILURE)}}})
    return ev


def _fake(fail: bool, seen: list[dict]):
    def run_fn(playbook, inv, *, extravars, limit, on_event, vars_files=None):
        seen.append(extravars)
        for event in _events(fail):
            on_event(event)
        return RunResult("failed" if fail else "successful", 2 if fail else 0, {}, Path("/tmp"), 1.0)
    return run_fn


@pytest.fixture
def inv(tmp_path, monkeypatch):
    monkeypatch.setenv("ATLAS_ROLLOUT_DIR", str(tmp_path / "rollouts"))
    path = tmp_path / "inv"
    path.mkdir()
    return path


def test_failure_then_resume_from_the_failed_wave(inv):
    seen: list[dict] = []
    report = rollout.run(inv, "r2", run_fn=_fake(True, seen))
    assert report["status"] == "failed" and report["completed"] == ["canary"]
    assert report["failure"]["gate"] == "slo" and report["failure"]["host"] == "n2"
    assert Path(report["report"]).is_file()
    report = rollout.run(inv, "r2", resume=True, run_fn=_fake(False, seen))
    assert seen[1]["rollout_resume_from"] == "east" and seen[1]["atlas_release_id"] == "r2"
    assert report["status"] == "ok" and report["completed"] == ["canary", "east"]
    with pytest.raises(UsageError, match="nothing to resume"):
        rollout.run(inv, "r2", resume=True, run_fn=_fake(False, seen))


def test_resume_of_another_release_is_refused(inv):
    rollout.run(inv, "r2", run_fn=_fake(True, []))
    with pytest.raises(UsageError, match="'r2', not 'r3'"):
        rollout.run(inv, "r3", resume=True, run_fn=_fake(False, []))


def test_second_rollout_on_the_same_inventory_is_refused(inv):
    holding, release = threading.Event(), threading.Event()

    def slow(playbook, inv_, *, extravars, limit, on_event):
        holding.set()
        release.wait(10)
        return RunResult("successful", 0, {}, Path("/tmp"), 1.0)

    t = threading.Thread(target=rollout.run, args=(inv, "r2"), kwargs={"run_fn": slow})
    t.start()
    assert holding.wait(10)
    try:
        proc = subprocess.run([sys.executable, "-m", "atlasctl", "rollout", "-i", str(inv), "--release", "r9"],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ))
    finally:
        release.set()
        t.join()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "already running" in proc.stderr and "release r2" in proc.stderr


def test_limit_keeps_the_plan_play_and_vars_files_go_by_path(inv, tmp_path):
    seen: dict = {}

    def run_fn(playbook, inv_, *, extravars, limit, on_event, vars_files=()):
        seen.update(limit=limit, vars_files=list(vars_files))
        for event in _events(False):
            on_event(event)
        return RunResult("successful", 0, {}, Path("/tmp"), 1.0)

    key_file = tmp_path / "key.yml"
    rollout.run(inv, "r2", limit="branch_west", run_fn=run_fn, vars_files=[key_file])
    assert seen == {"limit": "branch_west,localhost", "vars_files": [key_file]}


def test_runner_keeps_no_variables_between_runs_and_passes_files_by_path(tmp_path, monkeypatch):
    import ansible_runner

    from atlasctl import runner

    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "p.yml").write_text("---\n")
    stale = tmp_path / "artifacts" / "runs" / "env"
    stale.mkdir(parents=True)
    (stale / "extravars").write_text('{"rollout_slo": {"e2el_ms": 60000}}')
    calls: list[dict] = []

    class Done:
        status, rc, stats = "successful", 0, {}
        config = type("C", (), {"artifact_dir": str(tmp_path)})()

    monkeypatch.setattr(runner, "suite_root", lambda: tmp_path)
    monkeypatch.setattr(runner, "state_dir", lambda: tmp_path / "artifacts")
    monkeypatch.setattr(runner, "resolve_inventory", lambda inv: Path(inv))
    monkeypatch.setattr(ansible_runner, "run", lambda **kw: calls.append(kw) or Done())
    secret = tmp_path / "my key.yml"
    runner.run_playbook("playbooks/p.yml", tmp_path, extravars={"a": 1}, vars_files=[secret])
    assert not stale.exists(), "a previous run's env/extravars would be applied again"
    assert calls[0]["suppress_env_files"] is True
    assert calls[0]["cmdline"] == f"-e '@{secret}'"
    assert calls[0]["envvars"]["ANSIBLE_HOST_KEY_CHECKING"] == "True", "runner's default is False"
    assert calls[0]["envvars"]["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def test_a_host_unreachable_before_the_waves_does_not_undo_a_finished_wave():
    """The bundle-trust play runs before the waves: an unreachable east node there fails the
    rollout at east, but the canary wave, which it is not part of, stays completed."""
    progress = rollout.Progress(None)
    events = _events(fail=True)
    events.insert(1, {"event": "runner_on_unreachable", "event_data": {
        "task": "Bundle trust | verify", "host": "n2", "res": {"msg": "No route to host"}}})
    for event in events:
        progress(event)
    assert progress.completed == ["canary"]
    assert progress.failure == FAILURE, "the rollback's own report names the failing node and gate"


def test_a_wave_with_an_unreachable_host_is_not_completed():
    progress = rollout.Progress(None)
    events = _events(fail=False)
    events.insert(3, {"event": "runner_on_unreachable", "event_data": {"task": "t", "host": "n1", "res": {}}})
    for event in events:
        progress(event)
    assert "canary" not in progress.completed
    assert progress.failure["host"] == "n1" and progress.failure["gate"] == "unreachable"


def test_the_rank_that_failed_is_reported_not_the_ranks_that_followed_it():
    """A multi-node instance rolls back as one unit: every rank ends its rollback with a report; the
    report that counts is the rank that failed on its own, whatever the order the reports come in."""
    own = {**FAILURE, "host": "n3", "via_unit": False}
    followed = {**FAILURE, "host": "n4", "via_unit": True, "why": "n3 did not pass the slo gate"}
    for order in ([followed, own], [own, followed]):
        progress = rollout.Progress(None)
        for record in order:
            progress({"event": "runner_on_failed", "event_data": {
                "task": "Rollout | rollback | stop the rollout", "host": record["host"],
                "res": {"msg": rollout.FAILED_PREFIX + json.dumps(record)}}})
        assert progress.failure == own
        assert progress.failures == order


def test_a_fresh_rollout_keeps_an_unreadable_state_aside(inv, caplog):
    """Without --resume the old state is not needed: an unreadable one is renamed beside it (never deleted nor
    overwritten), a warning names both, and the rollout runs and writes its own state."""
    folder = rollout.rollouts_dir() / rollout.inventory_key(inv.resolve())
    folder.mkdir(parents=True)
    (folder / "state.json").write_bytes(b'{"release": "r1", "sta')
    report = rollout.run(inv, "r2", run_fn=_fake(False, []))
    assert report["status"] == "ok" and rollout.load_state(folder)["release"] == "r2"
    kept = [p for p in folder.iterdir() if p.name.startswith("state.json.unreadable-")]
    assert len(kept) == 1 and kept[0].read_bytes() == b'{"release": "r1", "sta'
    assert str(kept[0]) in caplog.text and "unreadable" in caplog.text
    with pytest.raises(UsageError, match="rollout state .*state.json: not valid JSON"):
        (folder / "state.json").write_text("{")
        rollout.run(inv, "r2", resume=True, run_fn=_fake(False, []))
    assert (folder / "state.json").read_text() == "{"


EXTRA = {"rollout_slo": {"e2el_ms": 60000}, "gateway_last_backend_wait_s": 5}


def _interrupted(inv: Path, tmp_path: Path) -> Path:
    """A release rolled with a --vars file (a platform level), -e values and a --limit, failed at its second wave."""
    level = tmp_path / "level-c.yml"
    level.write_text("driver_version: 25.5.2\nserving_api_key: atlas-secret-key\n")
    rollout.run(inv, "r2", extravars=EXTRA, limit="branch_east", vars_files=[level], run_fn=_fake(True, []),
                inputs=rollout.run_inputs([level], EXTRA, "branch_east"))
    return level


def test_resume_runs_with_the_interrupted_rollouts_vars_files(inv, tmp_path):
    level = _interrupted(inv, tmp_path)
    state = rollout.last_state(inv)
    assert state["inputs"]["vars_files"] == [{"path": str(level.resolve()),
                                              "sha256": hashlib.sha256(level.read_bytes()).hexdigest()}]
    assert state["inputs"]["limit"] == "branch_east"
    assert "atlas-secret-key" not in json.dumps(state)  # the files by path and digest only
    assert "60000" not in json.dumps(state)  # the -e values by digest only
    assert rollout.resume_vars(state, [], EXTRA, "branch_east") == [level.resolve()]
    assert rollout.resume_vars(state, [level], dict(reversed(EXTRA.items())), "branch_east") == [level]


@pytest.mark.parametrize(("change", "said"), [
    ("other-vars", "the interrupted rollout ran with --vars"),
    ("edited", "changed since the interrupted rollout read it"),
    ("gone", "cannot be read"),
    ("extravars", "-e values other than the interrupted rollout's"),
    ("fewer-extravars", "-e values other than the interrupted rollout's"),
    ("limit", "--limit branch_west: the interrupted rollout ran with --limit branch_east"),
    ("no-limit", "--limit (none): the interrupted rollout ran with --limit branch_east"),
])
def test_resume_with_other_inputs_is_refused(inv, tmp_path, change, said):
    level = _interrupted(inv, tmp_path)
    files, extra, limit = [], EXTRA, "branch_east"
    if change == "other-vars":
        files = [tmp_path / "level-b.yml"]
        files[0].write_text("driver_version: 25.5.1\n")
    elif change == "edited":
        level.write_text("driver_version: 25.5.0\n")
    elif change == "gone":
        level.unlink()
    elif change == "extravars":
        extra = {**EXTRA, "rollout_slo": {"e2el_ms": 1}}
    elif change == "fewer-extravars":
        extra = {"rollout_slo": EXTRA["rollout_slo"]}
    else:
        limit = "branch_west" if change == "limit" else None
    with pytest.raises(UsageError, match=re.escape(said)) as refused:
        rollout.resume_vars(rollout.last_state(inv), files, extra, limit)
    assert "without --resume" in refused.value.fix


def test_the_cli_refuses_a_resume_with_other_inputs_before_anything_runs(inv, tmp_path, monkeypatch, capsys):
    """`atlasctl rollout --resume` with another -e value: exit 2 naming the change, no playbook started."""
    _interrupted(inv, tmp_path)
    started = []
    monkeypatch.setattr(rollout, "run", lambda *a, **kw: started.append(a) or {})
    code = cli.main(["rollout", "-i", str(inv), "--release", "r2", "--resume", "--vars", str(tmp_path / "level-c.yml"),
                     "-e", 'rollout_slo={"e2el_ms": 1}', "-e", "gateway_last_backend_wait_s=5", "-l", "branch_east"])
    assert code == 2 and started == []
    assert "-e values other than the interrupted rollout's" in capsys.readouterr().err


def test_a_state_that_kept_no_inputs_resumes_with_what_is_given(inv, tmp_path):
    rollout.run(inv, "r2", run_fn=_fake(True, []))
    given = [tmp_path / "x.yml"]
    assert rollout.resume_vars(rollout.last_state(inv), given) == given


def test_a_resumed_run_keeps_the_inputs_for_the_next_resume(inv, tmp_path):
    level = _interrupted(inv, tmp_path)
    rollout.run(inv, "r2", extravars=EXTRA, resume=True, limit="branch_east", run_fn=_fake(True, []))
    assert rollout.last_state(inv)["inputs"]["vars_files"][0]["path"] == str(level.resolve())


def test_state_with_malformed_inputs_is_refused_naming_the_file(inv, tmp_path):
    rollout.run(inv, "r2", run_fn=_fake(True, []))
    path = rollout.rollouts_dir() / rollout.inventory_key(inv) / rollout.STATE_FILE
    state = json.loads(path.read_text())
    path.write_text(json.dumps({**state, "inputs": {"vars_files": "level-c.yml"}}))
    with pytest.raises(UsageError, match="inputs is not an object"):
        rollout.last_state(inv)
