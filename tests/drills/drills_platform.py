"""Fault drills on platform upgrades (driver, firmware and CANN under client load; docs/platform-upgrades.md):
site.yml refused on the live lab, a canary failing after its platform moved, the whole lab upgraded, a node
powered off during its driver install, a downgrade refused without --allow-downgrade and done with it.
"""

from __future__ import annotations

import json
import re

from drill_common import (
    CANARY,
    LENIENT_SLO,
    Expect,
    Outcome,
    Phases,
    _pack_gates,
    level,
    load_text,
    one_line,
    report_of,
    rollout_in_background,
    sh,
    wait_node_healthy,
    wait_until,
)
from labtools import (
    BRANCH,
    SERVING,
    Load,
    atlasctl,
    backend_states,
    lab,
    platform_of,
    playbook,
    releases,
    rollout,
)

# --- platform upgrades: driver, firmware and CANN under client load (docs/platform-upgrades.md) -------

def site_yml_live() -> Outcome:
    """site.yml with platform level B (another driver, firmware and CANN) on the live lab, as a site would run it
    (no atlas_allow_outage): refused at preflight, naming every serving node and the rollout command."""
    expect = Expect()
    before = {h: platform_of(h) for h in SERVING}
    releases_before = releases()
    with Load() as load:
        run = playbook("site.yml", "-e", f"@{level('b')}", allow_outage=False)
    out = " ".join(run.stdout.split())
    after = {h: platform_of(h) for h in SERVING}
    named = [h for h in SERVING if f"{h} would" in out]
    expect(run.returncode != 0 and "Refused: this run would take serving nodes down." in out,
           "site.yml is refused at preflight")
    expect(named == SERVING, "the refusal names every serving node")
    expect("atlasctl rollout -i" in out, "the refusal names the rollout command")
    # preflight reads the driver's state (the driver role's state tasks); no stage's own play starts
    expect("PLAY [Driver |" not in run.stdout and "PLAY [CANN |" not in run.stdout, "no stage after preflight ran")
    expect(after == before and releases() == releases_before, "nothing changed on any node")
    expect(not load.failed, "0 client requests failed")
    said = re.search(r"Refused: [^.]*\.[^.]*\.", out)
    observed = (f"site.yml exit {run.returncode}: {one_line(said.group(0) if said else out[-300:], 300)}; nodes named "
                f"{named}; platform and releases {'unchanged' if after == before else 'CHANGED'}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none" if after == before else f"{before} -> {after}", expect.unmet)


def platform_canary_fails() -> Outcome:
    """Level B's SLO gate fails on the canary after its platform moved: the canary goes back to its release on that
    release's CANN (8.5.0, kept beside 9.1.0), the driver stays new (inside 8.5.0's window, as the plan said), the
    rollout stops, nothing else changed."""
    expect, release = Expect(), "drill-platform-b-fails"
    before = {h: platform_of(h) for h in SERVING}
    releases_before = releases()
    with Load() as load:
        rc, report = rollout("--release", release, "--vars", str(level('b')), "-e", 'rollout_slo={"e2el_ms": 1}')
    after = {h: platform_of(h) for h in SERVING}
    now = releases()
    failure = report.get("failure") or {}
    canary = after[CANARY]
    expect(rc == 1 and (failure.get("host"), failure.get("gate")) == (CANARY, "slo"),
           f"the rollout stops at the canary {CANARY}'s SLO gate")
    expect((canary["driver"], canary["firmware"]) == ("25.5.1", "7.8.1.0.100"), "the canary keeps the new driver")
    expect(now[CANARY] == releases_before[CANARY], "the canary back on its previous release")
    expect(canary["pins"].get(now[CANARY]) == "8.5.0" and {"8.5.0", "9.1.0"} <= set(canary["cann_installed"]),
           "its release pinned to CANN 8.5.0, 9.1.0 installed beside it")
    expect(wait_node_healthy(CANARY, 60), "the canary serves")
    others = [h for h in SERVING if h != CANARY]
    expect(all(after[h] == before[h] and now[h] == releases_before[h] for h in others), "no other node changed")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}, failed at {failure.get('host')} gate {failure.get('gate')}; canary driver "
                f"{canary['driver']}/{canary['firmware']}, release {now[CANARY]} pinned to "
                f"{canary['pins'].get(now[CANARY])}, CANN installed {canary['cann_installed']}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none" if now[CANARY] == releases_before[CANARY] else
                   f"canary on {now[CANARY]}", expect.unmet)


def platform_upgrade() -> Outcome:
    """The whole lab from level A to level B through `atlasctl rollout` under load: each unit drained, its engine
    stopped, firmware then driver, the reboot, CANN 9.1.0 beside 8.5.0, the release, the gates, enabled (the canary,
    at level B since platform-canary-fails, skips the platform steps)."""
    expect, release = Expect(), "drill-platform-b"
    releases_before = releases()
    plan = atlasctl("rollout", "-i", "inventory/lab", "--release", release, "--vars", str(level("b")), "--plan",
                    "--json", check=False)
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to level B")
        rc, report = rollout("--release", release, "--vars", str(level("b")), "-e", LENIENT_SLO)
        by_phase = phases.text()
    after = {h: platform_of(h) for h in SERVING}
    gates = _pack_gates(report)
    expect(plan.returncode == 0 and json.loads(plan.stdout or "{}").get("point_of_no_return", {}).get("units") == [],
           "the plan has no point of no return")
    expect(rc == 0, "the rollout completes")
    expect(all((after[h]["driver"], after[h]["firmware"]) == ("25.5.1", "7.8.1.0.100") for h in SERVING),
           "every node runs driver 25.5.1 / firmware 7.8.1.0.100")
    expect(all(after[h]["pins"].get(release) == "9.1.0" for h in SERVING), "every node's release pins CANN 9.1.0")
    expect(all(after[h]["pins"].get(releases_before[h]) == "8.5.0" and "8.5.0" in after[h]["cann_installed"]
               for h in SERVING), "the previous CANN 8.5.0 still installed and pinned by the previous release")
    expect(all(gates.get(h, {}).get("driver") == "passed" for h in SERVING if h != CANARY),
           "the evidence pack records the driver gate of every moved node")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}, waves {report.get('completed')}; drivers "
                f"{sorted({after[h]['driver'] for h in SERVING})}; CANN installed "
                f"{sorted({v for h in SERVING for v in after[h]['cann_installed']})}; {load_text(load)}; {by_phase}")
    return Outcome(observed, len(load.failed), "none", expect.unmet)


def platform_power_off() -> Outcome:
    """Level C (driver 25.5.2) over branch east; atlas-n2 powered off once its engine stopped for the driver (during
    the install or the reboot): the rollout stops with it drained and named; after power-on --resume completes."""
    expect, victim, release = Expect(), "atlas-n2", "drill-platform-power-off"
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the power-off")
        job = rollout_in_background(release, "--vars", str(level("c")), "-e", LENIENT_SLO, "-l", "branch_east")
        stopped = wait_until(lambda: not job.running() or (
            backend_states()[victim] == "down"
            and sh(victim, "systemctl is-active atlas-serving", check=False).strip() != "active"), 900)
        expect(stopped and job.running(), f"the rollout stopped {victim}'s engine for its driver")
        lab("power", victim, "off", timeout=120)
        phases.mark("power-off to the rollout's stop")
        rc, out, _ = job.wait()
        report = report_of(out)
        failure = report.get("failure") or {}
        expect(rc == 1 and failure.get("host") == victim, f"the rollout stops naming {victim}")
        expect(backend_states()[victim] == "down", f"{victim} stays drained")
        notes.append(f"{victim} powered off with its engine stopped: rollout exit {rc}, failed at "
                     f"{failure.get('host')} gate {failure.get('gate')}; gateway states {backend_states()}")
        phases.mark("node off, then powered on")
        lab("power", victim, "on", timeout=300)
        expect(sh(victim, "systemctl is-active atlas-serving", check=False).strip() != "active",
               "after power-on the old release does not start (the unit stays off until the rollout)")
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO, "-l", "branch_east")
        by_phase = phases.text()
    east = [h for h in SERVING if BRANCH[h] == "east"]
    after = {h: platform_of(h) for h in east}
    expect(rc2 == 0, "--resume completes")
    expect(all(after[h]["driver"] == "25.5.2" and releases([h])[h] == release for h in east),
           "branch east on driver 25.5.2 and the release")
    expect(not load.failed, "0 client requests failed")
    notes.append(f"--resume exit {rc2}, nodes rolled {[n['host'] for n in resumed.get('nodes', [])]}; east drivers "
                 f"{ {h: after[h]['driver'] for h in east} }")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), "none", expect.unmet)


def platform_downgrade() -> Outcome:
    """Branch east from level C (driver 25.5.2) back to level B (25.5.1) through `atlasctl rollout`, under load:
    without --allow-downgrade the plan refuses it before any unit is touched; with it each unit is drained, its
    engine stopped, the installers' --upgrade takes firmware then driver back (Huawei's installers go back with
    --upgrade), the reboot, the release, the gates, enabled."""
    expect, release = Expect(), "drill-platform-downgrade"
    east = [h for h in SERVING if BRANCH[h] == "east"]
    before = {h: platform_of(h) for h in east}
    releases_before = releases()
    args = ("--release", release, "--vars", str(level("b")), "-e", LENIENT_SLO, "-l", "branch_east")
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout without --allow-downgrade")
        rc1, refused = rollout(*args)
        between = {h: platform_of(h) for h in east}
        releases_between = releases()
        phases.mark("rollout with --allow-downgrade")
        rc2, report = rollout(*args, "--allow-downgrade")
        by_phase = phases.text()
    after = {h: platform_of(h) for h in east}
    said = json.dumps(refused.get("failure") or {}) if "raw" not in refused else str(refused["raw"].stdout)
    expect(all(before[h]["driver"] == "25.5.2" for h in east), "branch east starts on driver 25.5.2 (level C)")
    expect(rc1 != 0 and "downgrade" in said, "without --allow-downgrade the rollout is refused, naming the downgrade")
    expect(between == before and releases_between == releases_before, "the refusal touched no node")
    expect(rc2 == 0, "with --allow-downgrade the rollout completes")
    expect(all((after[h]["driver"], after[h]["firmware"]) == ("25.5.1", "7.8.1.0.100") for h in east),
           "branch east runs driver 25.5.1 / firmware 7.8.1.0.100 again")
    expect(all(releases([h])[h] == release for h in east), "branch east on the release")
    expect(not load.failed, "0 client requests failed")
    observed = (f"without --allow-downgrade: exit {rc1}, {one_line(said, 200)}; with it: exit {rc2}; east drivers "
                f"{ {h: before[h]['driver'] for h in east} } -> { {h: after[h]['driver'] for h in east} }, firmware "
                f"{sorted({after[h]['firmware'] for h in east})}; {load_text(load)}; {by_phase}")
    return Outcome(observed, len(load.failed), "none", expect.unmet)
