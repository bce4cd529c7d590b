"""Fault drills on the engine and the rollout: an engine crash loop, a release with a bad engine flag, a node
powered off mid-wave or lost before its wave, a gateway restarted and a second rollout started during a rollout.
"""

from __future__ import annotations

import re
import time

from drill_common import (
    CANARY,
    LENIENT_SLO,
    SCRATCH,
    Expect,
    Outcome,
    Phases,
    _unit,
    http_status,
    load_text,
    node_url,
    one_line,
    report_of,
    rollout_in_background,
    sh,
    snapshots_kept,
    wait_node_healthy,
    wait_until,
)
from labtools import (
    GATEWAY_HOSTS,
    SERVING,
    Load,
    atlasctl,
    backend_states,
    doctor,
    lab,
    layout,
    model_service,
    playbook,
    releases,
    rollout,
)

# --- 4. engine crash loop --------------------------------------------------------------------------

def crash_loop() -> Outcome:
    """SIGKILL the engine each time it comes up until systemd's start limit ends the loop: the unit
    stays failed (doctor, health and the gateway see it); the serving stage brings it back."""
    expect, node = Expect(), SCRATCH
    before = _unit(node)
    killer = ("kills=0; for i in $(seq 1 600); do s=$(systemctl show -p ActiveState --value atlas-serving); "
              "[ \"$s\" = failed ] && break; p=$(systemctl show -p MainPID --value atlas-serving); "
              "if [ \"$p\" != 0 ]; then kill -9 \"$p\" 2>/dev/null && kills=$((kills+1)); fi; sleep 0.2; done; "
              "echo kills=$kills state=$s")
    with Load() as load:
        started = time.monotonic()
        loop_out = sh(node, killer, timeout=180)
        ended_after = time.monotonic() - started
        time.sleep(7)  # longer than RestartSec: nothing restarts it any more
        during = _unit(node)
        rc, doc, out = doctor("-l", node)
        health = playbook("playbooks/health.yml", "--limit", node)
        served = playbook("playbooks/serving.yml", "--limit", node)
        came_back = wait_node_healthy(node, 60)
        after = _unit(node)
    kills = re.search(r"kills=(\d+)", loop_out)
    restarts = int(during.get("NRestarts", 0)) - int(before.get("NRestarts", 0))
    findings = [f for f in doc["hosts"].get(node, {}).get("findings", []) if f["severity"] == "error"]
    service = [f for f in findings if f["check"] == "service"]
    # A SIGKILL loses the response the engine was sending at that instant: nginx cannot retry a
    # response whose first bytes already reached the client. Those are the crash's own cost.
    in_flight = [f for f in load.failed if "IncompleteRead" in f or "Connection reset" in f]
    expect("state=failed" in loop_out, "the loop ends: systemd stops restarting at the start limit")
    expect(during.get("ActiveState") == "failed" and during.get("MainPID") == "0",
           "the unit stays failed (no restart after RestartSec)")
    expect(rc == 1 and any("start limit" in f["message"] for f in service), "atlasctl doctor names the start limit")
    expect(health.returncode != 0, "the health stage fails on the node")
    expect(served.returncode == 0 and came_back and after.get("ActiveState") == "active",
           "the serving stage clears the limit and brings the engine back")
    expect(len(load.failed) == len(in_flight), "the gateway routes around it: only in-flight responses are lost")
    observed = (f"engine SIGKILLed {kills[1] if kills else '?'} times as soon as it came up; systemd restarted it "
                f"{restarts} times, then stopped after {ended_after:.0f} s: {during.get('ActiveState')}/"
                f"{during.get('SubState')} (Result={during.get('Result')}) 7 s later; doctor exit {rc}: "
                f"{one_line('; '.join(f['message'] for f in service) or 'no service finding', 160)}; health stage "
                f"exit {health.returncode}; serving stage exit {served.returncode}, back: {came_back}; "
                f"{load_text(load)}; in flight at a kill: {len(in_flight)}")
    return Outcome(observed, len(load.failed) - len(in_flight),
                   "none: a crash loses the response in flight only; files untouched", expect.unmet)


# --- 5. bad flag release ---------------------------------------------------------------------------

def bad_flag_release() -> Outcome:
    expect = Expect()
    before = releases()
    with Load() as load:
        rc, report = rollout("--release", "drill-bad-flag", "-e", 'serving_flags_extra={"--no-such-flag": true}',
                             "-e", "serving_lint_override=true", "-e", "rollout_health_timeout_s=30",
                             "-e", LENIENT_SLO)
    after = releases()
    failure = report.get("failure") or {}
    args = sh(CANARY, f"cat {layout(CANARY)['serving_args_file']}")
    expect(rc == 1, "the rollout exits 1")
    expect((failure.get("host"), failure.get("wave")) == (CANARY, "canary"), "it fails on the canary")
    expect(after == before, "the fleet stays on the old release")
    expect("--no-such-flag" not in args, "the canary runs the old configuration again")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}: failed on {failure.get('host')} (wave {failure.get('wave')}, gate "
                f"{failure.get('gate')}): {one_line(failure.get('why', ''), 160)}; rolled back to "
                f"{failure.get('previous')}; waves done {report.get('completed')}; releases now "
                f"{sorted(set(after.values()))}; {load_text(load)}")
    lost = ("none: every node on its previous release, its configuration restored from the snapshot"
            if after == before and "--no-such-flag" not in args else f"releases {before} -> {after}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 6. node power-off mid-wave --------------------------------------------------------------------

def power_off_mid_wave() -> Outcome:
    expect, victim, release = Expect(), "atlas-n2", "drill-power-off"
    before = releases()
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the power-off")
        job = rollout_in_background(release, "-e", LENIENT_SLO)
        drained = wait_until(lambda: backend_states()[victim] == "down" or not job.running(), 900)
        expect(drained and job.running(), f"the rollout reached {victim} (drained at its gateway)")
        lab("power", victim, "off", timeout=120)
        phases.mark("power-off to the rollout's stop")
        rc, out, _ = job.wait()
        phases.mark("node off, then powered on")
        report = report_of(out)
        failure = report.get("failure") or {}
        stopped = releases([h for h in SERVING if h != victim])
        expect(rc == 1, "the rollout stops (exit 1)")
        expect((failure.get("host"), failure.get("wave")) == (victim, "east"), f"it stops at {victim}, wave east")
        expect(report.get("completed") == ["canary"], "only the canary wave completed")
        expect(stopped["atlas-n4"] == before["atlas-n4"], "the later wave (atlas-n4) keeps the old release")
        notes.append(f"{victim} powered off once drained: rollout exit {rc}, failed at {failure.get('host')} "
                     f"(wave {failure.get('wave')}, gate {failure.get('gate')}), waves done {report.get('completed')}, "
                     f"releases {stopped}, gateway states {backend_states()}")
        lab("power", victim, "on", timeout=300)  # back on SSH; resumed at once, as an operator would
        notes.append(f"powered on (/health {http_status(node_url(victim, '/health'), timeout=5) or 'no answer yet'})")
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO)
        by_phase = phases.text()
    now = releases()
    expect(rc2 == 0, "--resume completes")
    expect(now == dict.fromkeys(SERVING, release), "the whole fleet on the new release")
    notes.append(f"--resume exit {rc2} (resumed from {resumed.get('resumed_from')}, nodes rolled "
                 f"{[n['host'] for n in resumed.get('nodes', [])]}, waves {resumed.get('completed')}): "
                 f"releases {sorted(set(now.values()))}")
    lost = snapshots_kept(expect, before, SERVING)
    expect(not load.failed, "0 client requests failed")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 6b. a node lost before its wave: its branch's last backend is not drained; --resume -------------

# the rollout's -e values, given again to its --resume (a resume with others is refused); the short wait for another
# backend applies to the first run, when atlas-n2 is off
NODE_LOST_ARGS = ("-e", LENIENT_SLO, "-e", "gateway_last_backend_wait_s=5")


def node_lost_before_wave() -> Outcome:
    """atlas-n2 is off when the east wave starts, so atlas-n1 is the branch's last healthy backend: its drain is
    refused (it is not touched and keeps serving) and the rollout stops there, west on the old release. With
    atlas-n2 back, --resume rolls the rest. (Was tests/lab/test_rollout.py's node-lost test: the drills hold
    the long rollouts, and `.ci/run` runs this row after `make test`.)"""
    expect, victim, release = Expect(), "atlas-n2", "drill-node-lost"
    before = releases()
    n1_pid = model_service("atlas-n1")[1]
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark(f"{victim} off, rollout to its stop")
        lab("power", victim, "off", timeout=120)
        try:
            rc, report = rollout("--release", release, *NODE_LOST_ARGS)
        finally:
            phases.mark(f"{victim} powered on")
            lab("power", victim, "on", timeout=300)
        failure = report.get("failure") or {}
        why = str(failure.get("why", ""))
        stopped = releases(["atlas-n1", "atlas-n3", "atlas-n4"])
        expect(rc == 1, "the rollout stops (exit 1)")
        expect((failure.get("host"), failure.get("wave"), failure.get("gate")) == ("atlas-n1", "east", "drain"),
               "it stops at atlas-n1's drain gate, wave east")
        expect("last healthy backend of branch east" in why and victim in why,
               f"the refusal names atlas-n1 the last healthy backend of branch east and {victim}")
        expect(report.get("completed") == ["canary"], "only the canary wave completed")
        expect(model_service("atlas-n1")[1] == n1_pid, "atlas-n1 not restarted (its drain was refused)")
        expect(stopped == {"atlas-n1": before["atlas-n1"], "atlas-n3": release, "atlas-n4": before["atlas-n4"]},
               "the canary on the release, atlas-n1 and the west wave on the old one")
        notes.append(f"{victim} off: rollout exit {rc}, stopped at {failure.get('host')} (wave {failure.get('wave')}, "
                     f"gate {failure.get('gate')}: {one_line(why, 160)}), waves done {report.get('completed')}, "
                     f"releases {stopped}")
        # an operator resumes once the node serves again: the resume's drain of atlas-n1 waits only the same 5 s
        expect(wait_node_healthy(victim, 300), f"{victim} healthy again after power-on, before --resume")
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", *NODE_LOST_ARGS)  # a resume: the same -e values
        expect(rc2 == 0, "--resume completes")
        expect(resumed.get("completed") == ["canary", "east", "west"], "--resume: canary, east and west done")
        now = releases()
        expect(now == dict.fromkeys(SERVING, release), "the whole fleet on the new release")
        notes.append(f"--resume exit {rc2} (waves {resumed.get('completed')}): releases {sorted(set(now.values()))}")
        by_phase = phases.text()
    expect(not load.failed, "0 client requests failed")
    expect(load.ok > 10, "the client load ran (more than 10 requests answered)")
    lost = snapshots_kept(expect, before, SERVING)
    return Outcome("; ".join(notes) + f"; {load_text(load)}; {by_phase}", len(load.failed), lost, expect.unmet)


# --- 7. gateway restart during a rollout -----------------------------------------------------------

def gateway_restart() -> Outcome:
    expect, release = Expect(), "drill-gateway-restart"
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the restart")
        job = rollout_in_background(release, "-e", LENIENT_SLO)
        drained = wait_until(lambda: backend_states()["atlas-n1"] == "down" or not job.running(), 900)
        expect(drained and job.running(), "the rollout reached the east wave")
        phases.mark("restart and 5 s after")
        restarted = lab("ssh", GATEWAY_HOSTS["east"], "systemctl restart nginx", check=False,
                             timeout=120)
        notes.append(f"`systemctl restart nginx` on atlas-gw-east while atlas-n1 was drained: exit "
                     f"{restarted.returncode}")
        time.sleep(5)
        phases.mark("rest of the rollout")
        rc, out, _ = job.wait()
        by_phase = phases.text()
    report = report_of(out)
    now = releases()
    expect(rc == 0, "the rollout completes")
    expect(now == dict.fromkeys(SERVING, release), "the whole fleet on the new release")
    failure = report.get("failure") or {}
    notes.append(f"rollout exit {rc}, waves {report.get('completed')}"
                 + (f", failed at {failure.get('host')} gate {failure.get('gate')}: {one_line(failure.get('why'), 120)}"
                    if failure else "")
                 + f"; releases {sorted(set(now.values()))}")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), "none: configuration on disk; a restart loses in-flight requests only",
                   expect.unmet)


# --- 9. two concurrent rollouts --------------------------------------------------------------------

def concurrent_rollouts() -> Outcome:
    expect = Expect()
    before = releases()
    with Load() as load:
        # the first one fails its SLO gate on the canary: long enough to collide with, short to wait for
        first = rollout_in_background("drill-concurrent", "-e", 'rollout_slo={"e2el_ms": 1}')
        time.sleep(3)
        second = atlasctl("rollout", "-i", "inventory/lab", "--release", "drill-concurrent-2", check=False,
                          timeout=60)
        rc1, out1, _ = first.wait()
    after = releases()
    report = report_of(out1)
    expect(second.returncode == 2, "the second rollout exits 2")
    expect("already running" in second.stderr, "it says a rollout is already running")
    expect(rc1 == 1 and (report.get("failure") or {}).get("gate") == "slo", "the first one runs its course")
    expect(after == before, "the fleet stays on the old release")
    expect(not load.failed, "0 client requests failed")
    observed = (f"second rollout exit {second.returncode}: {one_line(second.stderr, 200)}; first rollout exit {rc1} "
                f"(failed its SLO gate on {(report.get('failure') or {}).get('host')} and rolled back, as designed "
                f"for this drill); releases {sorted(set(after.values()))}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none: the second rollout touched nothing", expect.unmet)
