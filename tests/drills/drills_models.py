"""Fault drills on what a node holds and installs: a corrupted model shard, a tampered CANN package, a full
models disk while staging, a CANN install killed midway, a peer's copy corrupted during a fan-out push.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import yaml
from drill_common import (
    CANARY,
    SCRATCH,
    Background,
    Expect,
    Outcome,
    _unit,
    current_verifies,
    http_status,
    load_text,
    model_home,
    node_url,
    one_line,
    report_of,
    sh,
    wait_node_healthy,
    wait_until,
)
from labtools import (
    ATLASCTL,
    ENV,
    ROOT,
    Load,
    cann_versions,
    lab,
    lab_hosts,
    model_service,
    new_model_version,
    node_path,
    playbook,
)

DRILL_BUNDLE = "/var/lib/atlas/drill-bundle"
SHARD = "model-00001-of-00002.safetensors"
OTHER_CANN = "8.3.RC2"


# --- helpers: a failed task's message, the drill's bundle on a node, a flipped byte -----------------

def failure_message(stdout: str, host: str) -> str:
    """stderr and msg of the first failed task on host in an ansible-playbook output (YAML results)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if not (line.startswith(f"fatal: [{host}]") or line.startswith(f"fatal: [{host} ->")):
            continue
        block = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and not nxt.startswith(" "):
                break
            block.append(nxt)
        try:
            data = yaml.safe_load(textwrap.dedent("\n".join(block))) or {}
        except yaml.YAMLError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        parts = [str(data[k]) for k in ("stderr", "msg") if data.get(k) and data[k] != "non-zero return code"]
        return one_line(" / ".join(parts) or line.split("=>", 1)[-1] + " " + " ".join(block), 600)
    return ""


def drill_bundle_removed(host: str) -> None:
    shutil.rmtree(node_path(host, DRILL_BUNDLE), ignore_errors=True)


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


# --- 1. corrupted model shard ----------------------------------------------------------------------

def corrupted_shard() -> Outcome:
    expect, node = Expect(), CANARY
    before = model_service(node)
    bundle = new_model_version(node, corrupt=True, on_node=DRILL_BUNDLE)
    try:
        with Load() as load:
            run = playbook("playbooks/models.yml", "playbooks/serving.yml", "--limit", node,
                           "-e", f"atlas_bundle_dir={bundle}")
    finally:
        drill_bundle_removed(node)
    after = model_service(node)
    msg = failure_message(run.stdout, node)
    expect(run.returncode != 0, "the models stage fails")
    expect(SHARD in msg, f"the refusal names {SHARD}")
    expect(after == before, "same engine PID, current link unchanged")
    expect(not load.failed, "0 client requests failed")
    intact = current_verifies(node)
    expect(intact, "the current version still verifies")
    observed = (f"models stage exit {run.returncode} on {node}: {one_line(msg, 260)}; engine {after[0]}, "
                f"PID {before[1]} -> {after[1]}; current {before[2]} -> {after[2]}; {load_text(load)}")
    lost = (f"none: current still {after[2]} and it verifies; the corrupt copy never became current"
            if after[2] == before[2] and intact else f"current {before[2]} -> {after[2]}, verifies={intact}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 2. tampered CANN package ----------------------------------------------------------------------

def tampered_cann() -> Outcome:
    from atlasctl.bundle import write_manifest
    from atlaslab.paths import bundle_dir
    from atlaslab.signing import sign_bundle

    expect, node = Expect(), SCRATCH
    before = cann_versions(node)
    root = node_path(node, DRILL_BUNDLE)
    shutil.rmtree(root, ignore_errors=True)
    (root / "cann").mkdir(parents=True)
    for path in (bundle_dir() / "cann").glob(f"*_{OTHER_CANN}_*"):
        shutil.copy2(path, root / "cann" / path.name)
    write_manifest(root, "drill")
    sign_bundle(root)  # a signed manifest: the tampered file itself is what the role must catch
    toolkit = next(root.glob(f"cann/Ascend-cann-toolkit_{OTHER_CANN}_*"))
    flip_byte(toolkit)
    try:
        with Load() as load:
            run = playbook("playbooks/cann.yml", "--limit", node, "-e", f"atlas_bundle_dir={DRILL_BUNDLE}",
                           "-e", f"cann_version={OTHER_CANN}")
    finally:
        drill_bundle_removed(node)
    after = cann_versions(node)
    trace = sh(node, f"ls -d /usr/local/Ascend/*{OTHER_CANN}* /usr/local/Ascend/*/{OTHER_CANN} 2>/dev/null",
               check=False).split()
    msg = failure_message(run.stdout, node)
    expect(run.returncode != 0, "the cann stage fails")
    expect("before any installer ran" in msg, "refused before any installer ran")
    expect(toolkit.name in msg, f"the refusal names {toolkit.name}")
    expect(after == before, "installed CANN versions unchanged")
    expect(not trace, f"nothing of CANN {OTHER_CANN} on disk")
    expect(not load.failed, "0 client requests failed")
    observed = (f"cann stage (cann_version={OTHER_CANN}, toolkit .run with one flipped byte) exit {run.returncode}: "
                f"{one_line(msg, 260)}; installed toolkit/kernels/nnal {after['toolkit']}/{after['kernels']}/"
                f"{after['nnal']}; {OTHER_CANN} files on the node: {trace or 'none'}; {load_text(load)}")
    lost = (f"none: CANN {before['toolkit']} stays installed, no installer ran" if after == before and not trace
            else f"CANN {before} -> {after}, leftovers {trace}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 3. install killed midway ----------------------------------------------------------------------

def install_killed() -> Outcome:
    expect, node = Expect(), SCRATCH
    before = cann_versions(node)
    sh(node, "mkdir -p /etc/atlas-lab && echo 60 > /etc/atlas-lab/cann-install-delay")
    marker = f"ls -d /usr/local/Ascend/cann-{OTHER_CANN} /usr/local/Ascend/ascend-toolkit/{OTHER_CANN} 2>/dev/null"
    notes = []
    with Load() as load:
        # the drill takes the node down on purpose: its outage is accepted (the gateway sends its branch's
        # requests to the other backends)
        job = Background([str(Path(ENV["PATH"].split(":")[0]) / "ansible-playbook"), "-i", "inventory/lab",
                          "playbooks/cann.yml", "--limit", node, "-e", f"cann_version={OTHER_CANN}",
                          "-e", "atlas_allow_outage=true"])
        started = wait_until(lambda: bool(sh(node, marker, check=False).strip()), 180, poll=1)
        expect(started, f"the {OTHER_CANN} toolkit installer started")
        lab("power", node, "off", timeout=120)
        rc_killed, out_killed, _ = job.wait(600)
        expect(rc_killed != 0, "the interrupted run fails")
        notes.append(f"powered off during the toolkit installer: run exit {rc_killed} "
                     f"({one_line(failure_message(out_killed, node), 120) or 'unreachable'})")
        lab("power", node, "on", timeout=300)
        sh(node, "rm -f /etc/atlas-lab/cann-install-delay")
        mid = cann_versions(node)
        time.sleep(8)  # the engine starts at boot: give it a start or two
        engine = _unit(node)
        notes.append(f"after power-on toolkit/kernels/nnal {mid['toolkit']}/{mid['kernels']}/{mid['nnal']}, engine "
                     f"{engine.get('ActiveState')}/{engine.get('SubState')} (restarts {engine.get('NRestarts')}), "
                     f"/health {http_status(node_url(node, '/health'), timeout=5) or 'no answer'}")
        again = playbook("playbooks/cann.yml", "--limit", node, "-e", f"cann_version={OTHER_CANN}")
        recovered = cann_versions(node)
        expect(again.returncode == 0, "the next run succeeds")
        expect(recovered == dict.fromkeys(recovered, OTHER_CANN), f"the next run installs {OTHER_CANN} completely")
        notes.append(f"next run exit {again.returncode}: {recovered['toolkit']}/{recovered['kernels']}/"
                     f"{recovered['nnal']}")
        back = playbook("playbooks/cann.yml", "--limit", node)
        restored = cann_versions(node)
        expect(back.returncode == 0 and restored == before, "back to the inventory's CANN")
        # the engine crash-looped at boot on the half-installed CANN and ended at its start limit:
        # doctor's fix clears the limit before the restart
        sh(node, "systemctl reset-failed atlas-serving; systemctl restart atlas-serving")
        healthy = wait_node_healthy(node)
        expect(healthy, f"{node} serves again")
    notes.append(f"restored to {restored['toolkit']} (exit {back.returncode}), engine restarted, healthy={healthy}")
    observed = "; ".join(notes) + f"; {load_text(load)}"
    lost = ("none: the half-installed toolkit was replaced by the next run; model and release untouched"
            if recovered == dict.fromkeys(recovered, OTHER_CANN) else f"CANN left at {recovered}")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 8. disk full while staging a model ------------------------------------------------------------

@contextlib.contextmanager
def small_models_filesystem(host: str, headroom_kib: int) -> Iterator[str]:
    """A tmpfs over the node's model versions directory, holding a copy of what was there, and a
    filler file that leaves headroom_kib free. Yields the filler's path; unmounted at the end."""
    versions = f"{model_home(host)}/versions"
    copy = "/var/lib/atlas/drill-versions-copy"
    filler = f"{versions}/.drill-filler"
    sh(host, f"rm -rf {copy} && cp -a {versions} {copy} && mount -t tmpfs -o size=32m,mode=0755 drill-models "
             f"{versions} && cp -a {copy}/. {versions}/ && rm -rf {copy}")
    try:
        avail = int(sh(host, f"df -B1K --output=avail {versions} | tail -1").strip())
        sh(host, f"fallocate -l {max(avail - headroom_kib, 0)}K {filler}")
        yield filler
    finally:
        sh(host, f"umount {versions} 2>/dev/null || umount -l {versions}", check=False)


def disk_full() -> Outcome:
    expect, node = Expect(), SCRATCH
    before = model_service(node)
    notes = []
    # a new version with new weights in a shard: staging has a whole shard to copy, not only hard links
    bundle = new_model_version(node, corrupt=False, on_node=DRILL_BUNDLE, new_weights=True)
    stages = ("playbooks/preflight.yml", "playbooks/models.yml", "playbooks/serving.yml")
    try:
        with Load() as load:
            with small_models_filesystem(node, headroom_kib=128) as filler:
                df = sh(node, f"df -h --output=size,used,avail,target {model_home(node)}/versions | tail -1")
                run = playbook(*stages, "--limit", node, "-e", f"atlas_bundle_dir={bundle}",
                               "-e", "models_free_headroom_mib=0")
                during = model_service(node)
                msg = failure_message(run.stdout, node)
                preflight_passed = "Preflight | platform | assert free disk space" in run.stdout and \
                    "free disk space" not in msg
                expect(run.returncode != 0, "refused before staging")
                expect("no room to stage model" in msg and "it needs" in msg and " free" in msg,
                       "the error says there is no room: the need and the space free")
                expect(f"{model_home(node)}/versions" in msg, "the error names the path")
                expect(during == before, "same engine PID, current link unchanged")
                intact = current_verifies(node)
                expect(intact, "the current version still verifies")
                notes.append(f"models filesystem {' '.join(df.split())} (size used avail): preflight passed="
                             f"{preflight_passed}; stage exit {run.returncode}: {one_line(msg, 220)}; engine "
                             f"{during[0]} PID {before[1]} -> {during[1]}; current {before[2]} -> {during[2]}")
                sh(node, f"rm -f {filler}")
                again = playbook(*stages, "--limit", node, "-e", f"atlas_bundle_dir={bundle}",
                                 "-e", "models_free_headroom_mib=0")
                moved = model_service(node)
                expect(again.returncode == 0 and moved[2] != before[2], "after freeing space the next run converges")
                notes.append(f"filler removed: next run exit {again.returncode}, current -> {moved[2]}")
                # still on the drill's 32 MiB filesystem: no room for the default 1 GiB headroom
                back = playbook("playbooks/models.yml", "playbooks/serving.yml", "--limit", node,
                                "-e", "models_free_headroom_mib=0")
                expect(back.returncode == 0 and model_service(node)[2] == before[2], "back to the bundle's version")
            # off the drill's filesystem: the bundle's version re-verified where it always was, engine restarted
            reverify = playbook("playbooks/models.yml", "--limit", node)
            sh(node, "systemctl restart atlas-serving")
            healthy = wait_node_healthy(node)
    finally:
        drill_bundle_removed(node)
    final = model_service(node)
    expect(reverify.returncode == 0 and healthy and final[2] == before[2] and current_verifies(node),
           "restored on the original disk")
    notes.append(f"restored: tmpfs unmounted, re-verified (exit {reverify.returncode}), current {final[2]}, "
                 f"healthy={healthy}")
    expect(not load.failed, "0 client requests failed")
    observed = "; ".join(notes) + f"; {load_text(load)}"
    lost = ("none: current never moved while the disk was full and still verifies; the partial copy was only in "
            "the new version's directory" if intact else "the current version no longer verifies")
    return Outcome(observed, len(load.failed), lost, expect.unmet)


# --- 9b. a peer's copy corrupted during a fan-out push --------------------------------------------------

FANOUT_DEST = "/var/lib/atlas/drill-fanout"
FANOUT_PEER = "atlas-n3"  # the head of branch west: atlas-n4 and atlas-n5 pull from it in the plan's last round
FANOUT_SHARD = "models/bench-stage/model-00001-of-00002.safetensors"


def _fanout_push(src: Path, *extra: str) -> list[str]:
    return [*ATLASCTL, "bundle", "push", "-i", "inventory/lab", "--src", str(src), "--dest", FANOUT_DEST,
            "--json", *extra]


def _fanout_served(host: str) -> bool:
    """The node's staging server runs (its configuration is written when the fan-out play starts serving)."""
    return "served" in sh(host, "test -e /run/atlas-fanout/rsyncd.conf && echo served", check=False, timeout=30)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"


def corrupted_fanout_peer() -> Outcome:
    """atlas-n3 holds the bundle already (pushed to it alone first), so the fan-out's check finds it complete and
    it serves from the start; the drill flips a byte of its copy as soon as its server runs, before the plan's last
    round, where atlas-n4 and atlas-n5 pull from it."""
    from atlaslab.benchmarks.stage import make_bundle

    expect = Expect()
    scratch = Path(tempfile.mkdtemp(prefix="drill-fanout-"))
    try:
        src = make_bundle(scratch / "bundle", 128)  # two 64 MiB shards, signed with the lab's key
        good = _digest(src / FANOUT_SHARD)
        seeded = subprocess.run(_fanout_push(src, "--no-fan-out", "--limit", FANOUT_PEER), cwd=ROOT, env=ENV,
                                text=True, capture_output=True, timeout=600)
        expect(seeded.returncode == 0, f"{FANOUT_PEER} holds the bundle before the fan-out")
        with Load() as load:
            run = Background(_fanout_push(src, "--fan-out"))
            served = wait_until(lambda: _fanout_served(FANOUT_PEER) or not run.running(), 600, poll=0.3)
            corrupted = served and run.running()
            if corrupted:
                flip_byte(node_path(FANOUT_PEER, f"{FANOUT_DEST}/{FANOUT_SHARD}"))
            rc, out, err = run.wait(timeout=1500)
        report = report_of(out)
        hosts = {h["host"]: h for h in report.get("hosts", [])}
        refusers = sorted(h for h, r in hosts.items() if FANOUT_SHARD in (r.get("refused") or {}).get(FANOUT_PEER, []))
        digests = {h: _digest(node_path(h, f"{FANOUT_DEST}/{FANOUT_SHARD}")) for h in sorted(hosts)}
        wrong = sorted(h for h, d in digests.items() if d != good)
        expect(corrupted, f"{FANOUT_PEER}'s copy corrupted while the fan-out ran")
        expect(rc == 0 and report.get("verified") is True, "the push ends with every node verified (exit 0)")
        expect(bool(refusers), f"a receiver of {FANOUT_PEER} refused its corrupted copy, naming the shard")
        expect(all(hosts[h].get("via") not in ("", FANOUT_PEER) for h in refusers),
               f"each refuser pulled it from a verified source, not {FANOUT_PEER}")
        expect(not wrong, "every node's copy matches the signed manifest, the corrupted peer's too")
        expect(report.get("controller_ratio", 99) <= 1.2 + 0.2 * len(report.get("fallback") or []),
               "the controller sent the bundle about once")
        expect(not load.failed, "0 client requests failed")
        observed = (f"fan-out exit {rc}, verified={report.get('verified')}, rounds {report.get('rounds')}, "
                    f"controller x{report.get('controller_ratio')}; byte flipped in {FANOUT_PEER}'s {FANOUT_SHARD} "
                    f"while it served: {corrupted}; refused by {', '.join(refusers) or 'nobody'}; sources "
                    + ", ".join(f"{h} <- {r.get('via')}" for h, r in sorted(hosts.items()))
                    + f"; copies that differ from the manifest at the end: {', '.join(wrong) or 'none'}; "
                    f"{load_text(load)}" + (f"; stderr {one_line(err, 200)}" if rc else ""))
        lost = ("none: every node's copy verifies against the signed manifest, the corrupted one was refused and "
                "repaired" if not wrong and rc == 0 else f"copies not verified: {', '.join(wrong) or '?'}")
        return Outcome(observed, len(load.failed), lost, expect.unmet)
    finally:
        for host in lab_hosts():
            shutil.rmtree(node_path(host, FANOUT_DEST), ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
