"""Benchmark: staging a bundle on every node, fan-out against a direct push (``python -m atlaslab.benchmarks.stage``).

    python -m atlaslab.benchmarks.stage [--size-mib 256] [--json FILE]
                                        [--plan-only] [--plan-nodes 96] [--plan-branches 12]
                                        [--plan-bundle-gib 700] [--link-gbps 10] [--per-source 2]

Over the lab (holding the machine's lab lock, /var/lib/atlas-lab/lock; a lab that is not up is brought up
for the run and down after it; one that is up stays up):
  1. a synthetic signed bundle of ``--size-mib`` (model shards of random bytes, signed with the lab's key,
     dated as the lab's bundle so no node's downgrade record moves);
  2. ``atlasctl bundle push --no-fan-out`` to every serving node of inventory/lab (the controller sends the
     bundle to each node), then the same destination removed on every node;
  3. ``atlasctl bundle push --fan-out`` (the controller sends to the plan's roots, the nodes pass it on, each
     verifying every file), then again on the converged fleet (nothing may move);
  4. the destination removed on every node.
Without a lab (``--plan-only``), and after it in any case, the plan of a generated inventory of
``--plan-nodes`` nodes in ``--plan-branches`` branches (plugin_utils/fanout.py): rounds, what the controller
sends, the most pulls one node serves at once, and the wall time a ``--link-gbps`` link per node would give
for a ``--plan-bundle-gib`` bundle against the direct push (each round's busiest source's pulls over its link;
verification not counted).

Definitions: controller bytes = rsync's "Total bytes sent" of every transfer from the controller (protocol
included); ratio = controller bytes / the bundle's bytes (its files and its manifest). Goal: ratio <= 1.2 for
the fan-out (the direct push's is the number of nodes). Wall = the push command's, start to end.
A missed goal is a figure (printed MISSED), not an error. Exit status: 0 figures printed, 2 bad arguments,
3 the lab or a push failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from atlasctl import exitcodes
from atlasctl.errors import AtlasError
from atlasctl.paths import repo_root
from atlaslab.benchmarks.rollout import BenchError, code_version
from atlaslab.benchmarks.rollout import _run as run_logged
from atlaslab.lock import hold_lab

GOAL_RATIO = 1.2
LAB_INVENTORY = Path("inventory/lab")
DEST = "/var/lib/atlas/bench-stage-bundle"
SHARD_MIB = 64
GIB = 1 << 30
MIB = 1 << 20


def log(msg: str) -> None:
    print(f"[stage-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ a fleet of any size (pure)


def fleet_inventory(nodes: int = 96, branches: int = 12) -> dict[str, Any]:
    """An inventory of ``nodes`` serving nodes in ``branches`` branches (as inventory/example-bank: groups
    branch_b<N> under atlas_nodes, the first node the canary, one gateway per branch), addresses 10.<20+b>.0.<n>:
    what the plan-only paths are measured and tested on at fleet size."""
    if nodes < 1 or not 1 <= branches <= nodes or branches > 200:
        raise ValueError(f"{nodes} nodes in {branches} branches: need 1 <= branches <= nodes, branches <= 200")
    per = -(-nodes // branches)
    members: dict[str, dict[str, Any]] = {}
    gateways: dict[str, Any] = {}
    for b in range(1, branches + 1):
        names = [f"atlas-b{b:02d}-{i:02d}" for i in range(1, per + 1) if (b - 1) * per + i <= nodes]
        members[f"branch_b{b:02d}"] = {"hosts": {n: {"ansible_host": f"10.{20 + b}.0.{10 + i}"}
                                                 for i, n in enumerate(names, 1)}}
        gateways[f"gw-b{b:02d}"] = {"ansible_host": f"10.{20 + b}.0.1", "gateway_branch": f"b{b:02d}"}
    first = next(iter(members["branch_b01"]["hosts"]))
    return {"all": {"vars": {"ansible_user": "atlas-deploy", "ansible_become": True}, "children": {
        "atlas_nodes": {"children": {g: v for g, v in members.items() if v["hosts"]}},
        "gateway": {"hosts": gateways}, "canary": {"hosts": {first: {}}}}}}


def fleet_groups(inventory: dict[str, Any]) -> dict[str, list[str]]:
    """{group: hosts} of :func:`fleet_inventory`'s document (what Ansible's ``groups`` holds)."""
    groups: dict[str, list[str]] = {}

    def walk(name: str, node: dict[str, Any]) -> list[str]:
        hosts = list((node or {}).get("hosts") or {})
        for child, sub in ((node or {}).get("children") or {}).items():
            hosts += walk(child, sub)
        groups[name] = sorted(dict.fromkeys(hosts))
        return groups[name]

    walk("all", inventory["all"])
    return groups


def plan_figures(nodes: int, branches: int, bundle_bytes: int, link_gbps: float, per_source: int = 2,
                 roots: int = 1) -> dict[str, Any]:
    """The fan-out plan of a generated fleet and its figures (plugin_utils/fanout.py ``summary``)."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import fanout as fan

    groups = fleet_groups(fleet_inventory(nodes, branches))
    plan = fan.inventory_plan(groups["atlas_nodes"], groups, fanout=per_source, roots=roots)
    figures = fan.summary(plan, bundle_bytes, link_gbps * 1e9 / 8)
    return {**figures, "branches": branches, "per_source": per_source, "bundle_bytes": bundle_bytes,
            "link_gbps": link_gbps, "per_round": [len(r) for r in plan["order"]]}


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("OK" if ok else "MISSED")


def lab_row(case: str, report: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A push's --json report -> one row of the table."""
    ratio = float(report.get("controller_ratio") or 0.0)
    return {"case": case, "mode": report.get("mode"), "nodes": len(report.get("hosts") or []),
            "seconds": round(seconds, 1), "bundle_bytes": report.get("bundle_bytes", 0),
            "controller_bytes": report.get("controller_bytes", 0), "ratio": ratio,
            "rounds": report.get("rounds"), "verified": report.get("verified"),
            "files_sent": sum(int(h.get("files_sent") or 0) for h in report.get("hosts") or []),
            "received": sum(int(h.get("bytes_received") or 0) for h in report.get("hosts") or []),
            "sources": {h["host"]: h.get("via") for h in report.get("hosts") or []},
            "goal": ratio <= GOAL_RATIO if report.get("mode") == "fan-out" else None}


def render(result: dict[str, Any]) -> str:
    lines = [f"Stage benchmark: code {result.get('code', '?')}, {os.cpu_count()} cores"]
    rows = result.get("lab") or []
    if rows:
        size = rows[0]["bundle_bytes"]
        lines += ["", f"lab: {rows[0]['nodes']} serving nodes, a bundle of {size / MIB:.1f} MiB "
                      f"(controller bytes / bundle: goal <= {GOAL_RATIO} for the fan-out)",
                  f"{'CASE':<26}{'MODE':<9}{'WALL s':>8}{'CTRL MiB':>10}{'x BUNDLE':>10}  {'GOAL':<7}{'ROUNDS':>7}"
                  f"{'PEER MiB':>10}{'FILES':>7}  VERIFIED"]
        for r in rows:
            lines.append(f"{r['case']:<26}{r['mode'] or '?':<9}{r['seconds']:>8.1f}{r['controller_bytes'] / MIB:>10.1f}"
                         f"{r['ratio']:>10.2f}  {verdict(r['goal']):<7}{r['rounds'] if r['rounds'] else '-':>7}"
                         f"{r['received'] / MIB:>10.1f}{r['files_sent']:>7}  {r['verified']}")
        fan = next((r for r in rows if r["mode"] == "fan-out"), None)
        if fan:
            lines.append("fan-out sources: " + ", ".join(f"{h} <- {s}" for h, s in fan["sources"].items()))
    plan = result.get("plan")
    if plan:
        lines += ["", f"plan of a generated fleet: {plan['nodes']} nodes in {plan['branches']} branches, "
                      f"{plan['per_source']} pulls per source at once, "
                      f"a bundle of {plan['bundle_bytes'] / GIB:.0f} GiB, {plan['link_gbps']:g} Gb/s per node",
                  f"  rounds {plan['rounds']} (nodes per round {plan['per_round']}); the controller sends "
                  f"{plan['origin_bytes'] / GIB:.0f} GiB ({plan['origin_ratio']:.2f} x the bundle; a direct push "
                  f"{plan['direct_origin_bytes'] / GIB:.0f} GiB, {plan['nodes']} x); cross-branch transfers "
                  f"{plan['cross_branch']}; at most {plan['max_pulls_per_source']} pulls per source at once",
                  f"  wall at line rate: fan-out {plan['estimated_seconds'] / 3600:.1f} h against "
                  f"{plan['direct_seconds'] / 3600:.1f} h through the controller's link (verification not counted)"]
    return "\n".join(lines)


# ------------------------------------------------------------------ the lab (impure)


def make_bundle(root: Path, size_mib: int) -> Path:
    """A signed bundle of ``size_mib`` MiB of model shards (random bytes: nothing compresses or dedups)."""
    from atlasctl.bundle import write_manifest
    from atlaslab.signing import sign_bundle

    model = root / "models" / "bench-stage"
    model.mkdir(parents=True)
    shards = max(1, -(-size_mib // SHARD_MIB))
    left = size_mib * MIB
    for i in range(1, shards + 1):
        size = min(SHARD_MIB * MIB, left)
        left -= size
        with open(model / f"model-{i:05d}-of-{shards:05d}.safetensors", "wb") as handle:
            for _ in range(size // MIB):
                handle.write(os.urandom(MIB))
        (model / f"model-{i:05d}-of-{shards:05d}.safetensors").chmod(0o644)
    write_manifest(root, "bench-stage")
    sign_bundle(root)
    return root


def push(src: Path, mode: str, logdir: Path, name: str) -> tuple[dict[str, Any], float]:
    argv = [str(Path(sys.executable).parent / "atlasctl"), "bundle", "push", "-i", str(LAB_INVENTORY), "--src",
            str(src), "--dest", DEST, mode, "--json"]
    proc, seconds = run_logged(argv, logdir / f"{name}.log", timeout=7200)
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {}
    if proc.returncode != 0 or not report.get("ok"):
        raise BenchError(f"bundle push {mode} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]} "
                         f"(log: {logdir / f'{name}.log'})")
    return report, seconds


def clear_dest(logdir: Path, name: str) -> None:
    argv = [str(Path(sys.executable).parent / "ansible"), "-i", str(LAB_INVENTORY), "atlas_nodes", "-b", "-m",
            "ansible.builtin.file", "-a", f"path={DEST} state=absent"]
    proc, _seconds = run_logged(argv, logdir / f"{name}.log", timeout=600)
    if proc.returncode != 0:
        raise BenchError(f"removing {DEST} on the nodes failed: {proc.stdout[-1500:]} (log: {logdir / f'{name}.log'})")


def lab_up(logdir: Path) -> bool:
    """Whether this run brought the lab up (an up lab writes inventory/lab/hosts.yml)."""
    if (repo_root() / LAB_INVENTORY / "hosts.yml").exists():
        return False
    log("no lab up: atlas-lab up (brought down again at the end)")
    proc, _seconds = run_logged([sys.executable, "-m", "atlaslab", "up"], logdir / "lab-up.log", timeout=1800)
    if proc.returncode != 0:
        raise BenchError(f"atlas-lab up exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return True


def bench_lab(size_mib: int, logdir: Path) -> list[dict[str, Any]]:
    rows = []
    with hold_lab("make bench-stage"):
        brought = lab_up(logdir)
        scratch = Path(tempfile.mkdtemp(prefix="atlas-stage-bench-"))
        try:
            log(f"a signed bundle of {size_mib} MiB")
            src = make_bundle(scratch / "bundle", size_mib)
            clear_dest(logdir, "clear-before")
            log("direct push to every serving node")
            report, seconds = push(src, "--no-fan-out", logdir, "push-direct")
            rows.append(lab_row("direct push", report, seconds))
            clear_dest(logdir, "clear-direct")
            log("fan-out push")
            report, seconds = push(src, "--fan-out", logdir, "push-fanout")
            rows.append(lab_row("fan-out push", report, seconds))
            log("fan-out push again, on the converged fleet")
            report, seconds = push(src, "--fan-out", logdir, "push-fanout-again")
            rows.append(lab_row("fan-out, converged", report, seconds))
        finally:
            with contextlib.suppress(BenchError, subprocess.TimeoutExpired):
                clear_dest(logdir, "clear-after")
            shutil.rmtree(scratch, ignore_errors=True)
            if brought:
                log("bringing the lab down")
                run_logged([sys.executable, "-m", "atlaslab", "down"], logdir / "lab-down.log", timeout=600)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlaslab.benchmarks.stage", description=__doc__.split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=256, help="the lab bundle's size (default 256)")
    parser.add_argument("--plan-only", action="store_true", help="only the plan of the generated fleet (no lab)")
    parser.add_argument("--plan-nodes", type=int, default=96, help="nodes of the generated fleet (default 96)")
    parser.add_argument("--plan-branches", type=int, default=12, help="its branches (default 12)")
    parser.add_argument("--plan-bundle-gib", type=float, default=700.0, help="its bundle (default 700 GiB)")
    parser.add_argument("--link-gbps", type=float, default=10.0, help="each node's link (default 10 Gb/s)")
    parser.add_argument("--per-source", type=int, default=2, help="pulls a node serves at once (default 2)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.size_mib < 1 or args.plan_nodes < 1 or not 1 <= args.plan_branches <= args.plan_nodes \
            or args.plan_bundle_gib <= 0 or args.link_gbps <= 0 or args.per_source < 1:
        parser.error("--size-mib, --plan-nodes, --per-source >= 1; 1 <= --plan-branches <= --plan-nodes; "
                     "--plan-bundle-gib and --link-gbps > 0")
    result: dict[str, Any] = {"code": code_version(repo_root())}
    if not args.plan_only:
        if os.geteuid() != 0:
            print("stage_bench: the lab needs root (or --plan-only)", file=sys.stderr)
            return exitcodes.ENVIRONMENT
        logdir = repo_root() / "artifacts" / "bench" / "stage" / time.strftime("%Y%m%dT%H%M%S")
        logdir.mkdir(parents=True, exist_ok=True)
        result["logs"] = str(logdir)
        try:
            result["lab"] = bench_lab(args.size_mib, logdir)
        except (BenchError, subprocess.TimeoutExpired) as exc:
            print(f"stage_bench: {exc}", file=sys.stderr)
            return exitcodes.ENVIRONMENT
        except AtlasError as exc:
            print(f"stage_bench: {exc.render()}", file=sys.stderr)
            return exitcodes.ENVIRONMENT
    result["plan"] = plan_figures(args.plan_nodes, args.plan_branches, int(args.plan_bundle_gib * GIB),
                                  args.link_gbps, args.per_source)
    text = render(result)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
