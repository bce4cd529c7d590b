"""Fault drills on the lab's two-node instance (labtools.INSTANCE: atlas-n3 + atlas-n4), run last: the instance
rolled out and back as one unit, a rank frozen, an NPU link down, a rank powered off mid-rollout, the instance's
platform moved as one unit.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path

import yaml
from drill_common import (
    LENIENT_SLO,
    MULTI,
    Background,
    Expect,
    Outcome,
    Phases,
    _pack_gates,
    current_verifies,
    level,
    load_text,
    one_line,
    report_of,
    sh,
    snapshots_kept,
    wait_until,
)
from labtools import (
    ATLASCTL,
    BRANCH,
    INSTANCE_NODES,
    LEVEL_B,
    LEVEL_C,
    SERVING,
    Load,
    atlasctl,
    backend_states,
    instance_inventory,
    lab,
    layout,
    model_service,
    platform_of,
    playbook,
    releases,
    rollout,
)

# --- the instance inventory, converged by the first of these drills ---------------------------------

def platform_levels() -> dict[str, dict[str, str]]:
    """Each serving node's platform level where the platform drills moved it (LEVEL_B, LEVEL_C, told by the driver
    it runs), as host variables: site.yml then keeps it there (the inventory's own level is older, and a driver
    is never moved back by the driver stage)."""
    levels = {level["driver_version"]: level for level in (LEVEL_B, LEVEL_C)}
    drivers = {host: platform_of(host)["driver"] for host in SERVING}
    return {host: dict(levels[driver]) for host, driver in drivers.items() if driver in levels}


def instance_mode() -> Path:
    """The instance inventory, converged with site.yml the first time (the fleet stays so for later drills), each
    node on the platform level it runs."""
    if MULTI["inventory"] is None:
        inv = instance_inventory(Path(tempfile.mkdtemp(prefix="atlas-drill-instance-")))
        levels = platform_levels()
        if levels:
            (inv / "platform.yml").write_text(yaml.safe_dump({"all": {"hosts": levels}}))
        run = playbook("-i", str(inv), "site.yml")
        if run.returncode != 0:
            raise AssertionError("site.yml with the two-node instance failed:\n" + run.stdout[-4000:])
        MULTI["inventory"] = inv
    return MULTI["inventory"]


# --- multi-node instance: a rank frozen, an NPU link down, a rank node powered off mid-rollout -------

HEAD, RANK1 = INSTANCE_NODES
WEST_WAVE = 'rollout_waves=[{"name": "west", "hosts": "branch_west"}]'


def _unit_state() -> dict[str, tuple[str, str]]:
    """(release, engine main PID) of each rank."""
    out = {}
    for host in INSTANCE_NODES:
        record = json.loads(sh(host, f"cat {layout(host)['serving_record']}"))
        out[host] = (record["release_id"], model_service(host)[1])
    return out


def instance_out_and_back() -> Outcome:
    """Out: a new release over branch west, the instance first as one unit (both ranks in one batch, stopped
    together, NPUs free, head first), then atlas-n5. Back: the next release fails the entry's SLO gate, so both
    ranks go back to the release they ran and restart together; atlas-n5 is not touched. (A drill rather than a
    lab test: a multi-node scenario of minutes; the instance's convergence is a lab test.)"""
    expect, inv = Expect(), instance_mode()
    other = "atlas-n5"
    unit = [HEAD, RANK1]
    before = {h: model_service(h)[1] for h in (*unit, other)}
    previous = releases([*unit, other])
    notes = []
    with Load() as load:
        rc, report = rollout("--release", "drill-unit-out", "-e", LENIENT_SLO, "-e", WEST_WAVE, inventory=inv)
        plan = (report.get("plan") or [{}])[0]
        out = {h: model_service(h)[1] for h in (*unit, other)}
        starts = {h: sh(h, "systemctl show --timestamp=unix -p ExecMainStartTimestamp --value atlas-serving"
                        ).strip().lstrip("@") for h in unit}
        expect(rc == 0 and report.get("completed") == ["west"], "the rollout completes")
        expect(plan.get("units") == [unit, [other]] and plan.get("batches") == [2, 1],
               "the plan: the instance as one unit (a batch of its 2 ranks), then atlas-n5")
        expect(releases([*unit, other]) == dict.fromkeys([*unit, other], "drill-unit-out"), "west on the release")
        expect(all(out[h] != before[h] for h in (*unit, other)), "every node restarted")
        expect(starts[HEAD].isdigit() and starts[RANK1].isdigit() and int(starts[HEAD]) <= int(starts[RANK1]),
               "the head started first")
        notes.append(f"out: exit {rc}, plan units {plan.get('units')} batches {plan.get('batches')}, starts {starts}")
        rc, report = rollout("--release", "drill-unit-back", "-e", 'rollout_slo={"e2el_ms": 1}', "-e", WEST_WAVE,
                             inventory=inv)
        failure = report.get("failure") or {}
        followed = [f for f in report.get("rollbacks") or [] if f.get("host") == RANK1]
        back = {h: model_service(h)[1] for h in (*unit, other)}
        expect(rc == 1 and (failure.get("host"), failure.get("gate"), failure.get("via_unit")) == (HEAD, "slo", False),
               "the second rollout stops at the entry's SLO gate")
        expect(bool(followed) and followed[0].get("via_unit") and HEAD in followed[0].get("why", ""),
               "rank 1 is rolled back with its unit, naming the entry")
        expect(releases([*unit, other]) == dict.fromkeys([*unit, other], "drill-unit-out"), "back as one unit")
        expect(all(back[h] != out[h] for h in unit), "both ranks restarted on the release they ran")
        expect(back[other] == out[other], "the rollout stopped before atlas-n5")
        notes.append(f"back: exit {rc}, failure {failure.get('host')} gate {failure.get('gate')}, rank 1 rolled back "
                     f"via its unit: {bool(followed)}")
    expect(not load.failed, "0 client requests failed")
    lost = snapshots_kept(expect, previous, unit)
    return Outcome("; ".join(notes) + f"; {load_text(load)}", len(load.failed), lost, expect.unmet)


def rank_frozen() -> Outcome:
    """Every process of rank 1 SIGSTOPped: the head waits on a collective forever, its /health may still
    answer for a while (SGLang's 20 s health timeout; vLLM's stays 200). The hang check finds it, the
    recover playbook drains the entry, restarts both ranks together and enables the entry again."""
    expect, inv = Expect(), instance_mode()
    before = _unit_state()
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("freeze to the health check")
        sh(RANK1, "systemctl kill -s SIGSTOP atlas-serving")
        health = atlasctl("health", "-i", str(inv), check=False, timeout=300)
        expect(health.returncode == 1 and "hung" in health.stdout + health.stderr,
               "atlasctl health reports the instance hung")
        said = next((ln for ln in (health.stdout + health.stderr).splitlines() if "hung" in ln), "")
        notes.append(f"rank 1 ({RANK1}) SIGSTOPped; atlasctl health exit {health.returncode}: {one_line(said, 200)}")
        phases.mark("recover.yml")
        drained = {}
        watcher = threading.Thread(target=lambda: drained.update(
            seen=wait_until(lambda: backend_states()[HEAD] == "down", 300)), daemon=True)
        watcher.start()
        recover = playbook("-i", str(inv), "playbooks/recover.yml")
        watcher.join(5)
        by_phase = phases.text()
    after = _unit_state()
    expect(recover.returncode == 0, "playbooks/recover.yml succeeds")
    expect("hung" in recover.stdout, "recover.yml names the hang it found")
    expect(bool(drained.get("seen")), f"the entry {HEAD} was drained at its gateway")
    expect(backend_states()[HEAD] == "up", "the entry is enabled again")
    expect(all(after[h][1] != before[h][1] for h in INSTANCE_NODES), "both ranks restarted (new engine PIDs)")
    expect(all(after[h][0] == before[h][0] for h in INSTANCE_NODES), "the release is unchanged")
    expect(all(current_verifies(h) for h in INSTANCE_NODES), "the model verifies on both ranks")
    expect(not load.failed, "0 client requests failed (the one in flight on the frozen instance is retried)")
    notes.append(f"recover.yml exit {recover.returncode}, entry drained {bool(drained.get('seen'))}, "
                 f"PIDs {before[HEAD][1]}/{before[RANK1][1]} -> {after[HEAD][1]}/{after[RANK1][1]}, "
                 f"release {after[HEAD][0]}")
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    lost = ("none: release, configuration and model unchanged on both ranks"
            if all(after[h][0] == before[h][0] for h in INSTANCE_NODES) else f"releases {before} -> {after}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


def npu_link_down() -> Outcome:
    """NPU 2 of rank 1 loses its link (the hccn_tool double's fault): a rollout of the instance stops at
    its network gate, before anything is drained or restarted, naming the node, the NPU and the link."""
    expect, inv = Expect(), instance_mode()
    before = _unit_state()
    lab("npu", RANK1, "--device", "2", "--link", "down", timeout=60)
    try:
        with Load() as load:
            rc, report = rollout("--release", "drill-link-down", "-e", LENIENT_SLO, "-e", WEST_WAVE, inventory=inv)
    finally:
        lab("npu", RANK1, "--device", "2", "--link", "up", timeout=60)
    failure = report.get("failure") or {}
    after = _unit_state()
    expect(rc == 1, "the rollout stops (exit 1)")
    expect(failure.get("gate") == "network", f"it stops at the network gate (got {failure.get('gate')})")
    named = [r.get("why", "") for r in report.get("rollbacks") or []]
    expect(any(RANK1 in w and "NPU 2" in w and "link" in w.lower() for w in named),
           "the failure names the node, NPU 2 and its link")
    expect(after == before, "neither rank was touched (same release, same engine PIDs)")
    observed = (f"NPU 2 of {RANK1} link down; rollout exit {rc}, stopped at gate {failure.get('gate')}: "
                + " | ".join(one_line(w, 200) for w in named) + f"; ranks {after}; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none: nothing was touched", expect.unmet)


def rank_power_off() -> Outcome:
    """Rank 1's node powered off while the instance rolls: the unit rolls back (the head is stopped: an
    instance cannot run without a rank; the entry stays drained, atlas-n5 serves the branch); with the node
    back, --resume rolls the whole instance and the rest of the wave."""
    expect, inv, release = Expect(), instance_mode(), "drill-rank-off"
    before = releases()
    notes = []
    with Load() as load:
        phases = Phases(load)
        phases.mark("rollout to the power-off")
        job = Background([*ATLASCTL, "rollout", "-i", str(inv), "--json", "--release", release, "-e", LENIENT_SLO,
                          "-e", WEST_WAVE])
        drained = wait_until(lambda: backend_states()[HEAD] == "down" or not job.running(), 900)
        expect(drained and job.running(), f"the rollout reached the instance (its entry {HEAD} drained)")
        lab("power", RANK1, "off", timeout=120)
        phases.mark("power-off to the rollout's stop")
        rc, out, _ = job.wait()
        report = report_of(out)
        failure = report.get("failure") or {}
        head_state = model_service(HEAD)[0]
        expect(rc == 1, "the rollout stops (exit 1)")
        expect(RANK1 in str(failure.get("why", "")) + str(failure.get("host", "")) + str(failure.get("lost", "")),
               f"the failure names the lost rank {RANK1}")
        expect(head_state != "active", f"the head {HEAD} is stopped (it cannot run without its rank)")
        expect(backend_states()[HEAD] == "down", "the entry stays drained")
        notes.append(f"{RANK1} powered off after the entry was drained: rollout exit {rc}, failure at "
                     f"{failure.get('host')} gate {failure.get('gate')} (lost {failure.get('lost')}): "
                     f"{one_line(failure.get('why'), 160)}; head {head_state}; gateway states {backend_states()}")
        phases.mark("node off, then powered on")
        lab("power", RANK1, "on", timeout=300)
        phases.mark("--resume")
        rc2, resumed = rollout("--release", release, "--resume", "-e", LENIENT_SLO, "-e", WEST_WAVE, inventory=inv)
        per_phase = phases.failures()
        by_phase = phases.text()
    now = releases()
    west = [h for h in SERVING if BRANCH[h] == "west"]
    expect(rc2 == 0, "--resume completes")
    expect(all(now[h] == release for h in west), "branch west (the instance and atlas-n5) on the new release")
    # A completion in flight on the instance when its rank loses power cannot finish (half of its model ran
    # there): the drain had marked the entry down and was waiting for it. One client per gateway, so at most one
    # such request; none may fail in any other phase.
    # A completion in flight on the instance when its rank loses power has sent nothing yet: the gateway gives the
    # silent backend up after gateway_read_timeout_s and sends it to atlas-n5 (proxy_next_upstream timeout
    # non_idempotent), before the client's own timeout.
    expect(sum(per_phase.values()) == 0, "0 client requests failed, the one in flight at the power-off included")
    notes.append(f"--resume exit {rc2}, nodes rolled {[n['host'] for n in resumed.get('nodes', [])]}: west on "
                 f"{sorted({now[h] for h in west})}")
    lost = snapshots_kept(expect, before, west)
    observed = "; ".join(notes) + f"; {load_text(load)}; {by_phase}"
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- the instance's platform moved as one unit (docs/platform-upgrades.md) ----------------------------

def platform_unit() -> Outcome:
    """The two-node instance moves together: level C over branch west, both ranks stopped, driver, reboot, the NPU
    network verified again, the release, as one unit; then atlas-n5."""
    expect, inv, release = Expect(), instance_mode(), "drill-platform-unit"
    with Load() as load:
        rc, report = rollout("--release", release, "--vars", str(level("c")), "-e", LENIENT_SLO, "-e", WEST_WAVE,
                             inventory=inv)
    west = [*INSTANCE_NODES, "atlas-n5"]
    after = {h: platform_of(h) for h in west}
    gates = _pack_gates(report)
    expect(rc == 0, "the rollout completes")
    expect(all(after[h]["driver"] == "25.5.2" for h in west), "every west node on driver 25.5.2")
    moved = ("stop", "driver", "network-after")
    expect(all(gates.get(h, {}).get(g) == "passed" for h in INSTANCE_NODES for g in moved),
           "both ranks passed stop, driver and the NPU network again together")
    expect(not load.failed, "0 client requests failed")
    observed = (f"rollout exit {rc}; drivers { {h: after[h]['driver'] for h in west} }; ranks' gates "
                f"{ {h: gates.get(h) for h in INSTANCE_NODES} }; {load_text(load)}")
    return Outcome(observed, len(load.failed), "none", expect.unmet)
