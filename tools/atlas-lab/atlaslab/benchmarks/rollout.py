"""Benchmark: rollout wall time over the lab at scale (``python -m atlaslab.benchmarks.rollout``).

    python -m atlaslab.benchmarks.rollout [--sizes 4,8,16,24] [--json FILE] [--per-branch 4] [--overhead-waves 4]
                                          [--noop-only]   (steps 1, 2 and 4 only: the no-op figure)

One run, holding the lab lock (atlaslab.lock: its `atlas-lab` commands run under that hold) from start to end:
  1. brings any lab down, writes inventory/scale/lab.yml (generated here: SGLang stand-in serving
     nodes, ``--per-branch`` per branch, one nginx gateway per branch) and brings that lab up; its
     inventory is inventory/scale/hosts.yml (``lab up`` writes hosts.yml next to the fleet file),
     so inventory/lab/hosts.yml never points at it;
  2. builds the offline bundle (inventory/lab/bundle.yml; cached), runs site.yml over the whole
     fleet (converge), then site.yml again limited to 8 serving nodes (two whole branches) and
     their gateways: the no-op re-run, against the 60 s target, with changed=0;
  3. rolls releases out through atlasctl.rollout (the code behind ``atlasctl rollout``), each with a
     new release id (the service record carries it, so every node of the wave really restarts):
     one node in one wave; k nodes as k waves of one; for each size N, N nodes in ONE wave;
  4. prints the figures (``--json FILE`` keeps them) and brings the scale lab down, always.

Definitions (every time from the runner events' own timestamps):
  wave s     a wave's play start to the next play start: what the wave costs.
  T1         the median wave s of one-node waves (the one-node rollout and each wave of the k x 1 one).
  ratio      wave s / T1. Target: a wave of N nodes costs at most 1.5 x T1.
  overhead   per wave: wave s minus the wave's node work span (first task start to last task result):
             what Ansible charges to start and to end a wave (play and batch setup, handler flush).
  fixed      per rollout: rollout wall minus the sum of its waves (runner start, the plan play, the empty
             wave plays, the fleet health play over the rolled nodes, runner end).
  growth     (wave s of the largest N - wave s of the smallest N) / (difference in N): seconds per node.
  tasks      per task name, from its start to the next task start, summed: where a wave's time goes.

A missed target is a figure (printed MISSED), not an error. Exit status: 0 figures printed,
2 bad arguments, 3 the lab, the bundle, site.yml or a rollout failed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from atlasctl import exitcodes
from atlasctl.errors import AtlasError
from atlasctl.paths import repo_root
from atlaslab.lock import hold_lab

SCALE_DIR = Path("inventory/scale")
FLEET_FILE = SCALE_DIR / "lab.yml"
BUNDLE_SPEC = Path("inventory/lab/bundle.yml")
DEFAULT_SIZES = (4, 8, 16, 24)
NOOP_NODES = 8
WAVE_TARGET = 1.5
NOOP_TARGET_S = 60.0
# Our own SSH multiplexing sockets, in a fresh private directory per run (tempfile.mkdtemp: 0700, a name
# nobody can predict, so no other user can plant a socket there): the scale nodes reuse the lab's
# addresses (10.77.0.11...), and a master left by an earlier lab (ControlPersist) at the same address
# would be a dead connection.
CONTROL_PATH_PREFIX = "atlas-bench-cp-"
# Each node's systemd takes ~11 inotify instances, all owned by root on the host; the kernel's default
# limit of 128 per user stops a lab at ~11 nodes ("Failed to create control group inotify object: Too many
# open files" in the node's console).
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
INOTIFY_PER_NODE = 16
NODE_NPU = {"model": "910B4", "count": 4, "hbm_mb": 32768}  # as atlas-n3/atlas-n4 of the lab
MAX_SERVING_NODES = 24 * 4  # the lab's /24 leaves 243 addresses; 2 cores and 24 GiB are the real limit
WAVE_PLAY_RE = re.compile(r"^Rollout \| wave (\d+)$")
HOST_RESULTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable")
TASK_STARTS = ("playbook_on_task_start", "playbook_on_handler_task_start")
BOUNDARIES = ("playbook_on_play_start", "playbook_on_stats")
RECAP_RE = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$")


class BenchError(Exception):
    """A step of the benchmark failed (not a missed target)."""


# ------------------------------------------------------------------ the fleet (pure)


def parse_sizes(text: str) -> list[int]:
    """'4,8,16,24' -> [4, 8, 16, 24] (sorted, unique, each 1..MAX_SERVING_NODES)."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: use comma-separated node counts, e.g. 4,8,16,24") \
            from None
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_SERVING_NODES:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: each size must be 1..{MAX_SERVING_NODES}")
    return sizes


def node_name(i: int) -> str:
    return f"scale-n{i:02d}"


def branch_of(i: int, per_branch: int) -> str:
    """Serving node i (1-based) -> its branch name: b1 holds nodes 1..per_branch, and so on."""
    return f"b{(i - 1) // per_branch + 1}"


def gateway_name(branch: str) -> str:
    return f"scale-gw-{branch}"


def fleet_size(sizes: Sequence[int], per_branch: int, overhead_waves: int) -> int:
    """Serving nodes to boot: enough for every size, the no-op subset and the k x 1 rollout, in whole branches."""
    wanted = max([*sizes, NOOP_NODES, overhead_waves + 1])
    return -(-wanted // per_branch) * per_branch


def fleet(serving: int, per_branch: int, lab: dict[str, Any] | None = None) -> dict[str, Any]:
    """The lab fleet file (inventory/lab/lab.yml's format): serving nodes first, then one gateway per branch.

    Lab name, bridge, subnet, driver and firmware versions come from ``lab`` (inventory/lab/lab.yml's data):
    the same blackhole route and nft table guard the scale lab, and nothing new is left in the kernel."""
    lab = lab or {}
    nodes: list[dict[str, Any]] = [
        {"name": node_name(i), "groups": [f"branch_{branch_of(i, per_branch)}"], "npu": dict(NODE_NPU)}
        for i in range(1, serving + 1)]
    branches = sorted({branch_of(i, per_branch) for i in range(1, serving + 1)}, key=lambda b: int(b[1:]))
    nodes += [{"name": gateway_name(b), "kind": "gateway", "groups": ["gateway"], "vars": {"gateway_branch": b}}
              for b in branches]
    base = {"lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24", "driver_version": "24.1.rc1",
            "firmware_version": "7.1.0.6.220"}
    return {**{k: lab.get(k, v) for k, v in base.items()}, "nodes": nodes}


def lab_settings(root: Path) -> dict[str, Any]:
    """inventory/lab/lab.yml's top-level settings (everything but its nodes)."""
    data = yaml.safe_load((root / "inventory/lab/lab.yml").read_text()) or {}
    return {k: v for k, v in data.items() if k != "nodes"}


def render_fleet(data: dict[str, Any]) -> str:
    return ("---\n# Generated by `python -m atlaslab.benchmarks.rollout` (the scale lab); removed when it ends.\n"
            "# `atlas-lab up --config inventory/scale/lab.yml` writes inventory/scale/hosts.yml from it.\n"
            + yaml.safe_dump(data, sort_keys=False, width=200))


def gateways_for(hosts: Sequence[str], per_branch: int) -> list[str]:
    branches: list[str] = []
    for host in hosts:
        branch = branch_of(int(host.removeprefix("scale-n")), per_branch)
        if branch not in branches:
            branches.append(branch)
    return [gateway_name(b) for b in branches]


def one_wave(hosts: Sequence[str], name: str = "all") -> list[dict[str, Any]]:
    """rollout_waves for N nodes in ONE wave (batch N)."""
    return [{"name": name, "hosts": list(hosts), "serial": len(hosts)}]


def waves_of_one(hosts: Sequence[str]) -> list[dict[str, Any]]:
    """rollout_waves for k nodes as k waves of one node."""
    return [{"name": f"w{i}", "hosts": [h], "serial": 1} for i, h in enumerate(hosts, 1)]


def rollout_limit(hosts: Sequence[str]) -> str:
    """The rolled nodes and localhost (the plan play): the fleet health play then checks these nodes only.

    Gateways need not be in the limit: drain/enable delegate to them and hostvars hold every host."""
    return ",".join([*hosts, "localhost"])


# ------------------------------------------------------------------ events (pure)


def _t(event: dict) -> float:
    return dt.datetime.fromisoformat(event["created"]).timestamp()


def slim(event: dict) -> dict:
    """Keep what the analysis reads (a 24-node rollout has ~10 000 events)."""
    data = event.get("event_data") or {}
    keep = {k: data[k] for k in ("play", "task", "host", "duration") if k in data}
    return {"event": event.get("event"), "counter": event.get("counter", 0), "created": event.get("created"),
            "event_data": keep}


def waves(events: Sequence[dict]) -> list[dict[str, Any]]:
    """Each wave play that ran hosts: {index, seconds, span, overhead, hosts, task_mean}.

    A wave ends at the next play start (or the stats); its node work span runs from its first host
    start to its last host result."""
    evs = sorted((e for e in events if e.get("created")), key=lambda e: e.get("counter", 0))
    bounds = [i for i, e in enumerate(evs) if e["event"] in BOUNDARIES]
    out: list[dict[str, Any]] = []
    for n, i in enumerate(bounds):
        match = WAVE_PLAY_RE.match((evs[i].get("event_data") or {}).get("play", ""))
        if evs[i]["event"] != "playbook_on_play_start" or not match:
            continue
        end = bounds[n + 1] if n + 1 < len(bounds) else len(evs) - 1
        inside = evs[i + 1:end]
        starts = [e for e in inside if e["event"] == "runner_on_start"]
        results = [e for e in inside if e["event"] in HOST_RESULTS]
        if not results:
            continue  # no hosts matched: the plan has fewer waves than the playbook imports
        seconds = _t(evs[end]) - _t(evs[i])
        span = _t(results[-1]) - _t(starts[0] if starts else results[0])
        durations = [float(e["event_data"]["duration"]) for e in results if "duration" in e["event_data"]]
        out.append({"index": int(match.group(1)), "seconds": round(seconds, 2), "span": round(span, 2),
                    "overhead": round(seconds - span, 2), "host_tasks": len(results),
                    "hosts": sorted({e["event_data"]["host"] for e in results if e["event_data"].get("host")}),
                    "task_mean": round(statistics.fmean(durations), 3) if durations else 0.0})
    # one play per serial batch: a wave of several batches is several plays with the same index
    merged: dict[int, dict[str, Any]] = {}
    for w in out:
        if w["index"] in merged:
            m = merged[w["index"]]
            for key in ("seconds", "span", "overhead", "host_tasks"):
                m[key] = round(m[key] + w[key], 2)
            m["hosts"] = sorted({*m["hosts"], *w["hosts"]})
        else:
            merged[w["index"]] = w
    return list(merged.values())


def task_profile(events: Sequence[dict], top: int = 8, play_re: re.Pattern[str] = WAVE_PLAY_RE) -> list[list]:
    """[[task name, seconds, times]] summed over the wave plays, largest first."""
    evs = sorted((e for e in events if e.get("created")), key=lambda e: e.get("counter", 0))
    marks = [e for e in evs if e["event"] in TASK_STARTS + BOUNDARIES]
    totals: dict[str, list] = {}
    for cur, nxt in zip(marks, marks[1:], strict=False):
        data = cur.get("event_data") or {}
        if cur["event"] not in TASK_STARTS or not play_re.match(data.get("play", "")):
            continue
        entry = totals.setdefault(data.get("task", "?"), [0.0, 0])
        entry[0] += _t(nxt) - _t(cur)
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [[name, round(s, 2), n] for name, (s, n) in ranked]


def play_times(events: Sequence[dict]) -> list[list]:
    """[[play name, seconds]] in order (a play's start to the next play start or the stats); plays with the
    same name (serial batches, the two health plays) are summed in the first one's place."""
    evs = sorted((e for e in events if e.get("created")), key=lambda e: e.get("counter", 0))
    marks = [e for e in evs if e["event"] in BOUNDARIES]
    totals: dict[str, float] = {}
    for cur, nxt in zip(marks, marks[1:], strict=False):
        if cur["event"] == "playbook_on_play_start":
            name = (cur.get("event_data") or {}).get("play", "?")
            totals[name] = totals.get(name, 0.0) + _t(nxt) - _t(cur)
    return [[name, round(s, 2)] for name, s in totals.items()]


# A stdout-neutral callback for plain ansible-playbook runs (site.yml): it records play and task starts
# in the runner's event shape, so the same profile code reads both. Written into the run's log folder.
TIMER_CALLBACK = '''\
"""atlas_task_timer: play and task start times of an ansible-playbook run, as JSON (rollout_bench)."""
import datetime
import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "atlas_task_timer"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._events = []
        self._play = ""

    def _add(self, kind, **data):
        now = datetime.datetime.now(datetime.timezone.utc).isoformat()
        self._events.append({"event": kind, "counter": len(self._events) + 1, "created": now, "event_data": data})

    def v2_playbook_on_play_start(self, play):
        self._play = play.get_name().strip()
        self._add("playbook_on_play_start", play=self._play)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._add("playbook_on_task_start", play=self._play, task=task.get_name().strip())

    def v2_playbook_on_handler_task_start(self, task):
        self._add("playbook_on_handler_task_start", play=self._play, task=task.get_name().strip())

    def v2_playbook_on_stats(self, stats):
        self._add("playbook_on_stats")
        with open(os.environ["ATLAS_TASK_TIMER_OUT"], "w") as handle:
            json.dump(self._events, handle)
'''


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines of ansible-playbook's output: host -> {ok, changed, failed, ...}."""
    stats: dict[str, dict[str, int]] = {}
    seen = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            seen = True
        elif seen and (m := RECAP_RE.match(line.strip())):
            stats[m.group(1)] = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
    return stats


# ------------------------------------------------------------------ figures (pure)


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("OK" if ok else "MISSED")


def summarise(one: dict, multi: dict, sized: dict[int, dict], noop: dict, k: int) -> dict[str, Any]:
    """Rollout results ({wall, waves: [...]}) -> the figures: T1, ratios, overheads, growth."""
    singles = [w["seconds"] for w in one["waves"]] + [w["seconds"] for w in multi["waves"]]
    t1 = statistics.median(singles)
    rows = [{"case": "one node", "nodes": 1, "waves": 1, "wall_s": one["wall"], "wave_s": one["waves"][0]["seconds"],
             "ratio": round(one["waves"][0]["seconds"] / t1, 2), "target": None,
             "overhead_s": one["waves"][0]["overhead"], "fixed_s": _fixed(one)}]
    multi_sum = sum(w["seconds"] for w in multi["waves"])
    rows.append({"case": f"{k} waves of 1", "nodes": k, "waves": len(multi["waves"]), "wall_s": multi["wall"],
                 "wave_s": round(multi_sum, 2), "ratio": round(multi_sum / (k * t1), 2), "target": None,
                 "overhead_s": round(statistics.fmean(w["overhead"] for w in multi["waves"]), 2),
                 "fixed_s": _fixed(multi)})
    for n, res in sorted(sized.items()):
        wave = res["waves"][0]
        ratio = wave["seconds"] / t1
        rows.append({"case": f"1 wave of {n}", "nodes": n, "waves": len(res["waves"]), "wall_s": res["wall"],
                     "wave_s": wave["seconds"], "ratio": round(ratio, 2), "target": ratio <= WAVE_TARGET,
                     "overhead_s": wave["overhead"], "fixed_s": _fixed(res)})
    growth = None
    if len(sized) >= 2:
        lo, hi = min(sized), max(sized)
        growth = round((sized[hi]["waves"][0]["seconds"] - sized[lo]["waves"][0]["seconds"]) / (hi - lo), 2)
    for row, res in zip(rows, [one, multi, *[sized[n] for n in sorted(sized)]], strict=True):
        means = [w["task_mean"] for w in res["waves"]]
        row["task_mean"] = round(statistics.fmean(means), 3) if means else 0.0
        row["busy_pct"] = res.get("busy_pct", 0.0)
        row["ctrl_cpu_per_node"] = round(res.get("ctrl_cpu_s", 0.0) / row["nodes"], 2)
        row["cpu_per_node"] = round(res.get("cpu_s", 0.0) / row["nodes"], 2)
        row["other_cpu_s"] = res.get("other_cpu_s", 0.0)
    return {"t1_s": round(t1, 2), "t1_samples": singles, "rows": rows, "growth_s_per_node": growth,
            "growth_range": [min(sized), max(sized)] if sized else [],
            "projection": projection(t1, rows[-1]) if sized else None,
            "noop": noop_figures(noop)}


def noop_figures(noop: dict) -> dict[str, Any]:
    return {**noop, "target": noop.get("seconds", 1e9) <= NOOP_TARGET_S and noop.get("changed") == 0}


def projection(t1: float, row: dict, cores: int | None = None) -> dict[str, Any]:
    """How large a wave can stay within WAVE_TARGET x T1 when CPU is the limit.

    A wave of N needs N x c CPU seconds on `cores` cores, so T_wave >= N x c / cores; within the target
    while N <= WAVE_TARGET x T1 x cores / c. c: CPU seconds per rolled node, measured on the largest wave,
    for the whole machine here (controller, nodes and engines share its cores) and for the controller
    alone (what limits a real fleet, whose nodes have their own CPUs)."""
    cores = cores or os.cpu_count() or 1
    budget = WAVE_TARGET * t1 * cores
    lab, ctrl = row.get("cpu_per_node", 0.0), row.get("ctrl_cpu_per_node", 0.0)
    return {"cores": cores, "cpu_s_per_node": lab, "ctrl_cpu_s_per_node": ctrl,
            "max_nodes_lab": int(budget // lab) if lab else None,
            "max_nodes_controller": int(budget // ctrl) if ctrl else None,
            "ctrl_cores_for_24": round(24 * ctrl / (WAVE_TARGET * t1), 1) if ctrl else None}


def _fixed(res: dict) -> float:
    return round(res["wall"] - sum(w["seconds"] for w in res["waves"]), 2)


def render(fig: dict[str, Any], extra: dict[str, Any]) -> str:
    code = extra.get("code", "?")
    if extra.get("code_end", code) != code:
        code += f" -> {extra['code_end']} (CHANGED during the run: figures may mix both)"
    t1 = (f"T1 (one-node wave, median of {len(fig['t1_samples'])}) = {fig['t1_s']:.1f} s" if fig["t1_s"] is not None
          else "no rollouts (--noop-only)")
    lines = [f"Rollout benchmark: {extra.get('fleet', '?')}, {os.cpu_count()} cores; {t1}; code {code}",
             "",
             f"{'CASE':<16}{'NODES':>6}{'WAVES':>6}{'WALL s':>9}{'WAVE s':>9}{'x T1':>7}  {'<=1.5xT1':<9}"
             f"{'OVERHEAD/WAVE s':>16}{'FIXED s':>9}{'TASK s':>8}{'BUSY':>6}{'CPU s/NODE':>12}{'CTRL':>6}"
             f"{'OTHER s':>9}"]
    for row in fig["rows"]:
        lines.append(f"{row['case']:<16}{row['nodes']:>6}{row['waves']:>6}{row['wall_s']:>9.1f}{row['wave_s']:>9.1f}"
                     f"{row['ratio']:>7.2f}  {verdict(row['target']):<9}{row['overhead_s']:>16.2f}"
                     f"{row['fixed_s']:>9.1f}{row.get('task_mean', 0):>8.2f}{row.get('busy_pct', 0):>5.0f}%"
                     f"{row.get('cpu_per_node', 0):>12.1f}{row.get('ctrl_cpu_per_node', 0):>6.1f}"
                     f"{row.get('other_cpu_s', 0):>9.1f}")
    noop = fig["noop"]
    lines += ["",
              f"no-op site.yml over {noop.get('nodes')} serving nodes + {noop.get('gateways')} gateways: "
              f"{noop.get('seconds', float('nan')):.1f} s, changed={noop.get('changed')} "
              f"(target <= {NOOP_TARGET_S:.0f} s with changed=0: {verdict(noop['target'])}); "
              f"{noop.get('tasks', '?')} tasks, {noop.get('host_tasks', '?')} host tasks, "
              f"busy {noop.get('busy_pct', 0):.0f}%, CPU {noop.get('cpu_s', 0):.0f} s "
              f"(controller {noop.get('ctrl_cpu_s', 0):.0f} s, nodes {noop.get('nodes_cpu_s', 0):.0f} s; "
              f"other processes {noop.get('other_cpu_s', 0):.0f} s)"]
    if noop.get("host_tasks"):
        lines.append(f"  per host task: {1000 * noop['seconds'] / noop['host_tasks']:.0f} ms wall, "
                     f"{1000 * noop.get('cpu_s', 0) / noop['host_tasks']:.0f} ms CPU "
                     f"({1000 * noop.get('ctrl_cpu_s', 0) / noop['host_tasks']:.0f} ms controller, "
                     f"{1000 * noop.get('nodes_cpu_s', 0) / noop['host_tasks']:.0f} ms node); "
                     f"{os.cpu_count()} cores give at best {noop.get('cpu_s', 0) / (os.cpu_count() or 1):.0f} s")
    if fig["growth_s_per_node"] is not None:
        lo, hi = fig["growth_range"]
        lines.append(f"growth {lo} -> {hi} nodes in one wave: {fig['growth_s_per_node']:+.2f} s per extra node")
    proj = fig.get("projection")
    if proj and proj["max_nodes_lab"] is not None:
        lines.append(f"CPU bound: a rolled node costs {proj['cpu_s_per_node']:.1f} CPU s here "
                     f"({proj['ctrl_cpu_s_per_node']:.1f} s on the controller); within {WAVE_TARGET} x T1 on "
                     f"{proj['cores']} cores: waves of up to {proj['max_nodes_lab']} nodes in this lab, "
                     f"{proj['max_nodes_controller']} with nodes on their own CPUs; "
                     f"24 nodes need {proj['ctrl_cores_for_24']} controller cores")
    for key, label in (("lab_up_s", "lab up"), ("bundle_s", "bundle build"), ("converge_s", "site.yml converge")):
        if key in extra:
            lines.append(f"{label}: {extra[key]:.1f} s")
    lines += ["", "WAVE s: the wave's play start to the next play start; x T1: WAVE s / T1; OVERHEAD/WAVE: WAVE s",
              "minus the nodes' work span (first task start to last result); FIXED: rollout wall minus its waves",
              "(runner, plan play, fleet health play); TASK s: mean module time per host task; BUSY: this machine's",
              "CPU busy during the rollout; CPU s/NODE: CPU seconds per rolled node, controller plus lab nodes (they",
              "share the cores here); CTRL: the controller's part (ansible, runner, atlasctl bench); OTHER: CPU",
              "seconds of everything else on the machine meanwhile (other sessions, kernel): interference."]
    for name, profile in extra.get("profiles", {}).items():
        lines += ["", f"where the time goes, {name} (task: seconds summed, times run):"]
        lines += [f"  {s:>7.1f} s  x{n:<3} {task}" for task, s, n in profile]
    if noop.get("plays"):
        lines += ["", "where the time goes, no-op site.yml (play: seconds):"]
        lines += [f"  {s:>7.1f} s  {play}" for play, s in noop["plays"]]
    if noop.get("top_tasks"):
        lines += ["", "no-op site.yml, slowest tasks (seconds summed, times run):"]
        lines += [f"  {s:>7.1f} s  x{n:<3} {task}" for task, s, n in noop["top_tasks"]]
    return "\n".join(lines)


# ------------------------------------------------------------------ the machine (impure)


def log(msg: str) -> None:
    print(f"[rollout-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _env() -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "ANSIBLE_CONFIG": str(repo_root() / "ansible.cfg"), "PYTHONUNBUFFERED": "1",
            "ANSIBLE_NOCOLOR": "1", "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}


def _run(argv: Sequence[str], logfile: Path, timeout: float,
         env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(list(argv), cwd=repo_root(), env={**_env(), **(env or {})}, text=True,
                          capture_output=True, timeout=timeout)
    seconds = time.monotonic() - started
    logfile.write_text(f"$ {' '.join(argv)}\n# rc {proc.returncode}, {seconds:.1f} s\n{proc.stdout}\n{proc.stderr}")
    return proc, seconds


def lab(args: Sequence[str], logdir: Path, name: str, timeout: float = 1800) -> float:
    """`atlas-lab ARGS`, logged; the seconds it took."""
    proc, seconds = _run([sys.executable, "-m", "atlaslab", *args], logdir / f"{name}.log", timeout)
    if proc.returncode != 0:
        raise BenchError(f"atlas-lab {' '.join(args)} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"
                         f"\n(log: {logdir / f'{name}.log'})")
    return seconds


def site(inventory: Path, logdir: Path, name: str, limit: str | None = None) -> dict[str, Any]:
    """Plain ansible-playbook site.yml (what an operator runs), timed, with play and task times."""
    plugins = logdir / "callback_plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "atlas_task_timer.py").write_text(TIMER_CALLBACK)
    timer_out = logdir / f"{name}-tasks.json"
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "site.yml"]
    if limit:
        argv += ["--limit", limit]
    env = {"ANSIBLE_CALLBACK_PLUGINS": str(plugins), "ANSIBLE_CALLBACKS_ENABLED": "atlas_task_timer",
           "ATLAS_TASK_TIMER_OUT": str(timer_out)}
    with Meter() as meter:
        proc, seconds = _run(argv, logdir / f"{name}.log", timeout=7200, env=env)
    stats = recap(proc.stdout)
    if proc.returncode != 0 or not stats:
        raise BenchError(f"site.yml ({name}) exited {proc.returncode}: {proc.stdout[-2500:]}\n"
                         f"(log: {logdir / f'{name}.log'})")
    events = json.loads(timer_out.read_text()) if timer_out.is_file() else []
    return {"seconds": round(seconds, 1), "changed": sum(s.get("changed", 0) for s in stats.values()),
            "hosts": len(stats), "tasks": sum(e["event"] in TASK_STARTS for e in events),
            "host_tasks": sum(s.get("ok", 0) + s.get("skipped", 0) + s.get("failed", 0) for s in stats.values()),
            **meter.figures(), "plays": play_times(events),
            "top_tasks": task_profile(events, top=12, play_re=re.compile(".*"))}


class Meter:
    """CPU over a block: the controller's (our children: ansible, runner, atlasctl bench), the lab nodes'
    (their cgroups: sshd, modules, engines, nginx) and the rest of the machine (other sessions, kernel)."""

    def __enter__(self) -> Meter:
        self.busy0, self.total0 = _cpu_times()
        self.nodes0 = _lab_cpu()
        self.ctrl0, self.started = _children_cpu(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self.started
        busy1, total1 = _cpu_times()
        self.ctrl = _children_cpu() - self.ctrl0
        self.nodes = _lab_cpu() - self.nodes0
        self.busy = (busy1 - self.busy0) / os.sysconf("SC_CLK_TCK")
        self.pct = 100 * (busy1 - self.busy0) / max(total1 - self.total0, 1)

    def figures(self) -> dict[str, float]:
        return {"ctrl_cpu_s": round(self.ctrl, 1), "nodes_cpu_s": round(self.nodes, 1),
                "cpu_s": round(self.ctrl + self.nodes, 1),
                "other_cpu_s": round(max(self.busy - self.ctrl - self.nodes, 0.0), 1), "busy_pct": round(self.pct, 1)}


CODE_PATHS = ("site.yml", "playbooks", "roles", "collections", "inventory", "ansible.cfg", "tools/atlasctl",
              "tools/atlas-lab")


def code_version(root: Path) -> str:
    """The commit, plus a digest of uncommitted changes to what the run executes (other engineers share the tree)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "?"
    dirty = git("diff", "HEAD", "--", *CODE_PATHS)
    dirty += git("ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS)
    return f"{head}+{hashlib.sha256(dirty.encode()).hexdigest()[:8]}" if dirty.strip() else head


def inotify_needed(nodes: int) -> int:
    """max_user_instances for a lab of ``nodes`` nodes, with room for the host's own users of inotify."""
    return max(1024, nodes * INOTIFY_PER_NODE + 256)


def ensure_inotify(nodes: int, path: Path = INOTIFY_INSTANCES) -> tuple[int, int]:
    """Raise the per-user inotify instance limit when the fleet needs more; returns (before, after)."""
    before = int(path.read_text().split()[0])
    wanted = inotify_needed(nodes)
    if before >= wanted:
        return before, before
    path.write_text(f"{wanted}\n")
    log(f"fs.inotify.max_user_instances {before} -> {wanted} ({nodes} lab nodes; ~11 per node)")
    return before, wanted


def close_masters(directory: Path) -> int:
    """Ask the SSH masters of our own control directory to exit (a lab brought down leaves them dead)."""
    closed = 0
    for sock in sorted(directory.glob("*")) if directory.is_dir() else []:
        if sock.is_socket():
            proc = subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "atlas-bench"],
                                  capture_output=True, text=True, timeout=30, check=False)
            closed += proc.returncode == 0
    return closed


def _cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


def _lab_cpu() -> float:
    """CPU seconds of every lab node so far (the lab's cgroup-v2 directory aggregates its nodes)."""
    from atlaslab import node

    for root in node.CGROUP_ROOTS:
        stat = root / node.CGROUP_LAB / "cpu.stat"
        if stat.is_file():
            for line in stat.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
    return 0.0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def roll(inventory: Path, release: str, rollout_waves: list[dict], hosts: Sequence[str]) -> dict[str, Any]:
    """One rollout through atlasctl.rollout with the given waves; the runner events are kept for the figures."""
    from atlasctl import rollout
    from atlasctl.runner import run_playbook

    events: list[dict] = []

    def run_fn(playbook: str, inv: Path, *, extravars: dict, limit: str | None,
               on_event: Callable[[dict], None], **kw: Any) -> Any:
        def both(event: dict) -> None:
            events.append(slim(event))
            on_event(event)
        return run_playbook(playbook, inv, extravars=extravars, limit=limit, on_event=both, **kw)

    with Meter() as meter:
        report = rollout.run(inventory, release, extravars={"rollout_waves": rollout_waves},
                             limit=rollout_limit(hosts), run_fn=run_fn)
    if report["status"] != "ok":
        raise BenchError(f"rollout {release} failed: {json.dumps(report.get('failure'))[:1500]} "
                         f"(report: {report.get('report')}, runner artifacts: {report.get('artifacts')})")
    done = sorted(n["host"] for n in report["nodes"] if n.get("release") == release)
    if done != sorted(hosts):
        raise BenchError(f"rollout {release}: nodes rolled {done}, expected {sorted(hosts)}")
    found = waves(events)
    if len(found) != len(rollout_waves):
        raise BenchError(f"rollout {release}: {len(found)} wave plays in the events, {len(rollout_waves)} planned")
    return {"release": release, "wall": round(meter.wall, 1), "rollout_seconds": report["seconds"], "waves": found,
            **meter.figures(), "profile": task_profile(events), "report": report.get("report")}


class _NoopOnly(Exception):
    """Ends a --noop-only run after the no-op figure (the lab still comes down)."""


def bench(sizes: list[int], per_branch: int, k: int, logdir: Path, keep: bool = False,
          noop_only: bool = False) -> dict[str, Any]:
    root = repo_root()
    inventory = root / SCALE_DIR
    fleet_path = root / FLEET_FILE
    serving = fleet_size([] if noop_only else sizes, per_branch, 0 if noop_only else k)
    names = [node_name(i) for i in range(1, serving + 1)]
    extra: dict[str, Any] = {"fleet": f"{serving} SGLang stand-in nodes + {serving // per_branch} gateways",
                             "sizes": sizes, "per_branch": per_branch, "logs": str(logdir)}
    stamp = time.strftime("%m%d%H%M%S")
    extra["code"] = code_version(root)
    control_dir = Path(tempfile.mkdtemp(prefix=CONTROL_PATH_PREFIX))
    os.environ["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(control_dir)  # ansible-playbook and ansible-runner read it
    # ansible-runner looks ansible-playbook up on PATH: this venv's, also when run as .venv/bin/python
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    raw: dict[str, Any] = {"k": k, "extra": extra, "sized": {}}
    sized: dict[int, dict] = {}
    with hold_lab("make bench-rollout"):
        log("lab lock held; bringing any lab down")
        lab(["down"], logdir, "lab-down-before", timeout=600)
        try:
            extra["inotify_instances"] = ensure_inotify(serving + serving // per_branch)
            fleet_path.write_text(render_fleet(fleet(serving, per_branch, lab_settings(root))))
            log(f"lab up: {extra['fleet']} ({fleet_path.relative_to(root)})")
            extra["lab_up_s"] = lab(["up", "--config", str(fleet_path), "--timeout", "300"], logdir,
                                         "lab-up", timeout=1800)
            if (root / "inventory/lab/hosts.yml").exists():
                raise BenchError("inventory/lab/hosts.yml exists while the scale lab is up; it would point at it")
            log("bundle build (cached)")
            extra["bundle_s"] = lab(["bundle", "--spec", str(root / BUNDLE_SPEC)], logdir, "bundle",
                                         timeout=3600)
            log(f"site.yml over the whole fleet (converge; {serving + serving // per_branch} hosts)")
            converge = raw["converge"] = site(inventory, logdir, "site-converge")
            extra["converge_s"] = converge["seconds"]
            noop_hosts = names[:NOOP_NODES]
            noop_gws = gateways_for(noop_hosts, per_branch)
            log(f"no-op site.yml over {len(noop_hosts)} nodes + {len(noop_gws)} gateways")
            noop = raw["noop"] = site(inventory, logdir, "site-noop", limit=",".join(noop_hosts + noop_gws))
            noop.update(nodes=len(noop_hosts), gateways=len(noop_gws))
            log(f"  {noop['seconds']} s, changed={noop['changed']}, CPU: controller {noop['ctrl_cpu_s']} s, "
                f"nodes {noop['nodes_cpu_s']} s, other {noop['other_cpu_s']} s")
            if noop_only:
                raise _NoopOnly
            seq = iter(range(1, 1000))

            def release() -> str:
                return f"bench-{stamp}-{next(seq)}"

            log(f"rollout: 1 node, one wave ({names[0]})")
            one = raw["one"] = roll(inventory, release(), one_wave(names[:1]), names[:1])
            log(f"  wave {one['waves'][0]['seconds']} s, wall {one['wall']} s")
            multi_hosts = names[1:k + 1]
            log(f"rollout: {k} nodes as {k} waves of one ({', '.join(multi_hosts)})")
            multi = raw["multi"] = roll(inventory, release(), waves_of_one(multi_hosts), multi_hosts)
            log(f"  waves {[w['seconds'] for w in multi['waves']]} s, wall {multi['wall']} s")
            for n in sizes:
                log(f"rollout: {n} nodes in ONE wave")
                sized[n] = raw["sized"][str(n)] = roll(inventory, release(), one_wave(names[:n]), names[:n])
                log(f"  wave {sized[n]['waves'][0]['seconds']} s, wall {sized[n]['wall']} s, "
                    f"machine busy {sized[n]['busy_pct']} %, CPU/node {sized[n]['cpu_s'] / n:.1f} s, "
                    f"other {sized[n]['other_cpu_s']} s")
        except _NoopOnly:
            log("--noop-only: no rollouts")
        finally:
            if keep:
                log("--keep: the scale lab stays up (inventory/scale/hosts.yml); `atlas-lab down` when done")
            else:
                log("bringing the scale lab down")
                with contextlib.suppress(BenchError, subprocess.TimeoutExpired):
                    lab(["down"], logdir, "lab-down-after", timeout=600)
                close_masters(control_dir)
                shutil.rmtree(control_dir, ignore_errors=True)
                fleet_path.unlink(missing_ok=True)
            extra["code_end"] = code_version(root)
            (logdir / "raw.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    if extra["code_end"] != extra["code"]:
        log(f"the code changed during the run ({extra['code']} -> {extra['code_end']}): the figures may mix both")
    return figures_from_raw(raw)


def figures_from_raw(raw: dict[str, Any]) -> dict[str, Any]:
    """The measurements (kept as raw.json in the run's log folder) -> figures, table inputs, JSON."""
    extra = dict(raw["extra"])
    if "one" not in raw:  # --noop-only
        fig = {"t1_s": None, "t1_samples": [], "rows": [], "growth_s_per_node": None, "growth_range": [],
               "projection": None, "noop": noop_figures(raw["noop"])}
        return {"figures": fig, "extra": extra, "runs": {}, "converge": raw["converge"]}
    sized = {int(n): r for n, r in raw["sized"].items()}
    fig = summarise(raw["one"], raw["multi"], sized, raw["noop"], raw["k"])
    extra["profiles"] = {"one node": raw["one"]["profile"]}
    if sized:
        extra["profiles"][f"1 wave of {max(sized)}"] = sized[max(sized)]["profile"]
    return {"figures": fig, "extra": extra, "runs": {k: raw[k] for k in ("one", "multi", "sized")},
            "converge": raw["converge"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlaslab.benchmarks.rollout", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=list(DEFAULT_SIZES),
                        help="wave sizes to measure, comma-separated (default 4,8,16,24)")
    parser.add_argument("--per-branch", type=int, default=4, help="serving nodes per branch (default 4)")
    parser.add_argument("--overhead-waves", type=int, default=4, metavar="K",
                        help="the per-wave overhead rollout: K nodes as K waves of one (default 4)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="leave the scale lab up at the end (debugging)")
    parser.add_argument("--noop-only", action="store_true",
                        help="only the converge and the no-op site.yml figure (no rollouts)")
    parser.add_argument("--raw", type=Path, default=None, metavar="RAW_JSON",
                        help="print the figures of an earlier run from its raw.json (no lab)")
    args = parser.parse_args(argv)
    if args.raw:
        return _report(figures_from_raw(json.loads(args.raw.read_text())), args.raw.parent, args.json)
    if args.per_branch < 1 or not 1 <= args.overhead_waves <= 15:
        parser.error("--per-branch must be >= 1 and --overhead-waves 1..15 (the rollout playbook has 16 waves)")
    if os.geteuid() != 0:
        print("rollout_bench: the lab needs root", file=sys.stderr)
        return exitcodes.ENVIRONMENT
    logdir = repo_root() / "artifacts" / "bench" / "rollout" / time.strftime("%Y%m%dT%H%M%S")
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        result = bench(args.sizes, args.per_branch, args.overhead_waves, logdir, keep=args.keep,
                       noop_only=args.noop_only)
    except (BenchError, subprocess.TimeoutExpired) as exc:
        print(f"rollout_bench: {exc}", file=sys.stderr)
        return exitcodes.ENVIRONMENT
    except AtlasError as exc:
        print(f"rollout_bench: {exc.render()}", file=sys.stderr)
        return exitcodes.ENVIRONMENT
    return _report(result, logdir, args.json)


def _report(result: dict[str, Any], logdir: Path, json_path: Path | None) -> int:
    text = render(result["figures"], result["extra"])
    if os.access(logdir, os.W_OK):
        (logdir / "figures.txt").write_text(text + "\n")
    print(text)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
