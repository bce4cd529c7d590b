"""Staged rollouts: a lock per inventory, resume state, event folding into a per-run report.

The playbook (playbooks/rollout.yml) does the work; this module drives it through
ansible-runner, refuses a second rollout on the same inventory, remembers which waves
completed so `--resume` starts at the failed one, and writes the JSON/HTML report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from ansible_collections.atlas.serving.plugins.module_utils import evidence as evidence_format
from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256
from ansible_collections.atlas.serving.plugins.plugin_utils import release_id

from atlasctl import evidence, outputs, prometheus, site_data
from atlasctl import inventory as inventory_mod
from atlasctl.errors import AtlasError, UsageError
from atlasctl.inputs import load_yaml, shown
from atlasctl.paths import state_dir
from atlasctl.runner import resolve_inventory, run_playbook

PLAYBOOK = "playbooks/rollout.yml"
WAVE_PLAY_RE = re.compile(r"^Rollout \| wave (\d+)$")
FAILED_PREFIX = "ROLLOUT FAILED "
log = logging.getLogger(__name__)


class RolloutBusy(AtlasError):
    """Another rollout holds this inventory's lock."""


def rollouts_dir() -> Path:
    return Path(os.environ.get("ATLAS_ROLLOUT_DIR", state_dir() / "rollouts"))


def inventory_key(inventory: Path) -> str:
    """``<name>-<hash>``: the inventory's folder of rollouts (the playbook names its evidence pack's the same way)."""
    return evidence_format.inventory_key(str(inventory))


@contextlib.contextmanager
def inventory_lock(inventory: Path, release: str) -> Iterator[Path]:
    """Hold the inventory's rollout lock; a second holder is refused at once, naming the first."""
    folder = rollouts_dir() / inventory_key(inventory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rollout.lock"
    fh = open(path, "a+")  # noqa: SIM115 (held for the whole rollout)
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            raise RolloutBusy(f"a rollout is already running on {inventory} ({holder})",
                              fix="wait for it to finish; two rollouts on one inventory are refused") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}, release {release}, since {_now()}\n")
        fh.flush()
        yield folder
    finally:
        fh.close()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


STATE_FILE = "state.json"


def state_fix(path: Path) -> str:
    return (f"keep it aside (mv {shown(path)} {shown(path)}.unreadable) and run the rollout without --resume: "
            "every wave runs again, nodes already on the release included")


def parse_state(text: str, path: Path) -> dict[str, Any]:
    """A rollout's resume state (what :func:`save_state` writes); anything else is a UsageError naming the file."""
    def bad(problem: str) -> UsageError:
        return UsageError(f"rollout state {shown(path)}: {problem}", fix=state_fix(path))

    try:
        state = json.loads(text)
    except RecursionError:
        raise bad("nested too deeply to be a rollout state") from None
    except ValueError as exc:  # JSONDecodeError, or a number past Python's int-from-str limit
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(state, dict):
        raise bad(f"a JSON {type(state).__name__}, not an object")
    if state.get("status") not in ("ok", "failed"):
        raise bad(f"status is {state.get('status')!r}, not 'ok' or 'failed'")
    if release_id.problem(state.get("release")):
        raise bad(f"release {state.get('release')!r} is not a release id")
    plan, completed = state.get("plan", []), state.get("completed", [])
    if not isinstance(plan, list):
        raise bad("plan is not a list of waves")
    for i, wave in enumerate(plan):
        if not (isinstance(wave, dict) and isinstance(wave.get("name"), str)
                and isinstance(wave.get("index"), int) and not isinstance(wave.get("index"), bool)
                and isinstance(wave.get("hosts"), list) and all(isinstance(h, str) for h in wave["hosts"])):
            raise bad(f"plan[{i}] is not a wave (name, index and hosts)")
    if not isinstance(completed, list) or not all(isinstance(name, str) for name in completed):
        raise bad("completed is not a list of wave names")
    if state.get("failure") is not None and not isinstance(state["failure"], dict):
        raise bad("failure is not an object")
    inputs = state.get("inputs")
    if inputs is not None and not (
            isinstance(inputs, dict) and isinstance(inputs.get("vars_files"), list)
            and all(isinstance(v, dict) and isinstance(v.get("path"), str) and isinstance(v.get("sha256"), str)
                    for v in inputs["vars_files"])
            and isinstance(inputs.get("extra_sha256", ""), str)
            and isinstance(inputs.get("limit"), str | None)):
        raise bad("inputs is not an object of vars_files (path, sha256), extra_sha256 and limit")
    return state


def _sha256_file(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def extra_digest(extravars: dict | None) -> str:
    """The sha256 of the -e values (canonical JSON): a resume compares it; the values, keys among them, stay out of
    the state."""
    return hashlib.sha256(json.dumps(extravars or {}, sort_keys=True, default=str).encode()).hexdigest()


def run_inputs(vars_files: list[Path] | None, extravars: dict | None = None,
               limit: str | None = None) -> dict[str, Any]:
    """What a rollout ran with, as its state keeps it for ``--resume``: the --vars files by path and sha256, the -e
    values by the sha256 of their canonical JSON, and the --limit."""
    return {"vars_files": [{"path": str(p.resolve()), "sha256": _sha256_file(p) or ""} for p in vars_files or []],
            "extra_sha256": extra_digest(extravars), "limit": limit}


def last_state(inventory: str | Path) -> dict[str, Any]:
    """The inventory's last rollout state, read without its lock (``run`` reads it again under the lock)."""
    return load_state(rollouts_dir() / inventory_key(resolve_inventory(inventory)))


def resume_vars(state: dict[str, Any], vars_files: list[Path] | None, extravars: dict | None = None,
                limit: str | None = None) -> list[Path]:
    """The --vars files a ``--resume`` runs with: the interrupted rollout's when none are given. A resume runs
    the rest of the same rollout, so it is refused with other --vars files, or one changed since (the rest of the
    waves would move to another release), and with other -e values or another --limit (the waves already done were
    planned, gated and rolled back under those: a gate's threshold, a wait, the hosts)."""
    inputs = state.get("inputs")
    if not inputs:
        return list(vars_files or [])  # a state that kept no inputs: nothing to hold the resume to
    again = "resume with the interrupted rollout's --vars files, -e values and --limit, or start the release " \
            "again without --resume"
    if "limit" in inputs and (limit or None) != inputs["limit"]:
        raise UsageError(f"--resume with --limit {limit or '(none)'}: the interrupted rollout ran with --limit "
                         f"{inputs['limit'] or '(none)'}", fix=f"give the same --limit; {again}")
    if "extra_sha256" in inputs and extra_digest(extravars) != inputs["extra_sha256"]:
        raise UsageError("--resume with -e values other than the interrupted rollout's (compared by digest: the "
                         "state keeps no value)", fix=f"give the same -e values (and --allow-downgrade if it had "
                         f"it); {again}")
    recorded = [Path(v["path"]) for v in inputs["vars_files"]]
    chosen = list(vars_files) if vars_files else recorded
    if [str(p.resolve()) for p in chosen] != [str(p) for p in recorded]:
        raise UsageError(f"--resume with --vars {' '.join(map(str, chosen)) or '(none)'}: the interrupted rollout "
                         f"ran with --vars {' '.join(map(str, recorded)) or '(none)'}",
                         fix=f"give the same --vars files or none (its own are used); {again}")
    for entry, path in zip(inputs["vars_files"], recorded, strict=True):
        found = _sha256_file(path)
        if found != entry["sha256"]:
            what = "cannot be read" if found is None else "changed since the interrupted rollout read it"
            raise UsageError(f"--vars {path} {what}", fix=f"put back the file the rollout ran with; {again}")
    return chosen


def load_state(folder: Path) -> dict[str, Any]:
    """The inventory's last rollout state ({} when none ran); unreadable: a UsageError naming the file."""
    path = folder / STATE_FILE
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"rollout state {shown(path)}: cannot read it ({exc})", fix=state_fix(path)) from None
    return parse_state(text, path)


def set_aside(folder: Path) -> Path:
    """Move an unreadable state out of the way (renamed, never deleted); its new path."""
    path = folder / STATE_FILE
    kept = folder / f"{STATE_FILE}.unreadable-{_now().replace(':', '')}"
    path.replace(kept)
    return kept


def save_state(folder: Path, state: dict[str, Any]) -> None:
    tmp = folder / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    tmp.replace(folder / STATE_FILE)


def resume_wave(state: dict[str, Any], release: str) -> str:
    if not state or state.get("status") == "ok":
        raise UsageError("nothing to resume: the last rollout on this inventory completed (or none ran)",
                         fix="run without --resume")
    if state.get("release") != release:
        raise UsageError(f"the interrupted rollout was release {state.get('release')!r}, not {release!r}",
                         fix=f"resume with --release {state.get('release')}, or start {release} without --resume")
    waves = [w["name"] for w in state.get("plan", []) if w["name"] not in state.get("completed", [])]
    if not waves:
        raise UsageError("every wave of the interrupted rollout completed", fix="run without --resume")
    return waves[0]


@dataclasses.dataclass
class Progress:
    """Folds runner events into waves, node results and the failure; prints on a TTY."""

    out: TextIO | None
    plan: list[dict] = dataclasses.field(default_factory=list)
    wave_index: int = 0
    wave_started: dict[str, float] = dataclasses.field(default_factory=dict)
    wave_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    completed: list[str] = dataclasses.field(default_factory=list)
    nodes: list[dict] = dataclasses.field(default_factory=list)
    failure: dict | None = None
    failures: list[dict] = dataclasses.field(default_factory=list)
    unreachable: list[str] = dataclasses.field(default_factory=list)

    def _say(self, text: str) -> None:
        if self.out:
            self.out.write(outputs.safe(text) + "\n")  # host names and messages from the run: one line each
            self.out.flush()

    def wave_name(self, index: int) -> str:
        for wave in self.plan:
            if wave["index"] == index:
                return wave["name"]
        return f"wave {index}"

    def _ran(self, index: int) -> bool:
        return any(w["index"] == index and not w.get("skipped") for w in self.plan)

    def _close_wave(self) -> None:
        # A host unreachable before the waves (the bundle-trust play) or in another wave does not
        # undo this wave: only one of this wave's hosts does.
        hosts = next((w["hosts"] for w in self.plan if w["index"] == self.wave_index), [])
        failed_here = any(h in hosts for h in self.unreachable) or \
            (self.failure is not None and self.failure.get("host") in hosts)
        if self._ran(self.wave_index) and not failed_here:
            name = self.wave_name(self.wave_index)
            self.wave_seconds[name] = time.monotonic() - self.wave_started[name]
            if name not in self.completed:
                self.completed.append(name)
                self._say(f"  wave {name} done in {self.wave_seconds[name]:.1f}s")

    def __call__(self, event: dict) -> None:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            match = WAVE_PLAY_RE.match(data.get("play", ""))
            if match and int(match.group(1)) != self.wave_index:
                self._close_wave()
                self.wave_index = int(match.group(1))
                if not self._ran(self.wave_index):
                    return
                name = self.wave_name(self.wave_index)
                self.wave_started.setdefault(name, time.monotonic())
                hosts = next((w["hosts"] for w in self.plan if w["name"] == name), [])
                self._say(f"wave {name}: {', '.join(hosts)}")
        elif kind == "runner_on_ok":
            self._ok(data)
        elif kind == "runner_on_failed" and data.get("task") == "Rollout | rollback | stop the rollout":
            msg = str((data.get("res") or {}).get("msg", ""))
            if msg.startswith(FAILED_PREFIX):
                failure = json.loads(msg[len(FAILED_PREFIX):])
                self.failures.append(failure)
                # The rollback's own report names the node and the gate (over an unreachable host seen
                # earlier). The ranks of a multi-node instance roll back together: the one to report is the
                # rank that failed on its own, not one that followed it (via_unit; it names a lost rank).
                current = self.failure or {}
                if not current or current.get("gate") == "unreachable" or \
                        (current.get("via_unit") and not failure.get("via_unit")):
                    self.failure = failure
                self._say(f"  {failure['host']}: FAILED at gate {failure['gate']}: "
                          f"{failure['why'][:300]} -> rolled back to {failure['previous']}")
        elif kind == "runner_on_unreachable":
            host = data.get("host", "?")
            self.unreachable.append(host)
            if self.failure is None:
                self.failure = {"host": host, "gate": "unreachable", "wave": self.wave_name(self.wave_index),
                                "task": data.get("task", ""), "measured": {},
                                "why": str((data.get("res") or {}).get("msg", ""))[:1500]}
            self._say(f"  {host}: UNREACHABLE at {data.get('task', '')}")

    def _ok(self, data: dict) -> None:
        facts = (data.get("res") or {}).get("ansible_facts") or {}
        task = data.get("task", "")
        if task == "Rollout | plan | the waves":
            self.plan = facts.get("rollout_plan", [])
        elif task == "Rollout | node | report" and "rollout_node_report" in facts:
            report = facts["rollout_node_report"]
            self.nodes.append(report)
            self._say(f"  {report['host']}: {report['previous']} -> {report['release']} ok")
        elif task.startswith("Rollout | node | gate ") and self.out:
            self._say(f"  {data.get('host')}: {task.removeprefix('Rollout | node | gate ')}")

    def finish(self, ok: bool) -> None:
        if ok:
            self._close_wave()


def run(inventory: str | Path, release: str, *, extravars: dict | None = None, resume: bool = False,
        limit: str | None = None, out: TextIO | None = None,
        run_fn: Callable[..., Any] = run_playbook, vars_files: list[Path] | None = None,
        inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run a rollout under the inventory's lock; returns the report (also kept as JSON). ``inputs``
    (:func:`run_inputs`) is kept in the state for a later ``--resume`` (:func:`resume_vars`)."""
    inv = resolve_inventory(inventory)
    with inventory_lock(inv, release) as folder:
        try:
            state = load_state(folder)
        except UsageError:
            if resume:
                raise
            # A fresh rollout needs nothing from it; it is kept, not overwritten by this run's state.
            log.warning("rollout state %s is unreadable: kept as %s", folder / STATE_FILE, set_aside(folder))
            state = {}
        resume_from = resume_wave(state, release) if resume else None
        previously = list(state.get("completed", [])) if resume else []
        variables = {**(extravars or {}), "atlas_release_id": release}
        if resume_from:
            variables["rollout_resume_from"] = resume_from
        progress = Progress(out=out)
        started, started_at = time.monotonic(), _now()
        # The report and the run's evidence pack (docs/evidence.md), side by side.
        stem = evidence_format.run_stem(started_at, release)
        pack = folder / f"{stem}{evidence_format.SUFFIX}"
        variables["rollout_evidence_dir"] = str(pack)
        files = {"vars_files": vars_files} if vars_files else {}  # by path: their values stay out of artifacts
        # The plan play runs on localhost: a --limit without it would plan nothing and "succeed".
        limit = f"{limit},localhost" if limit and "localhost" not in limit.split(",") else limit
        result = run_fn(PLAYBOOK, inv, extravars=variables, limit=limit, on_event=progress, **files)
        ok = result.rc == 0 and progress.failure is None
        progress.finish(ok)
        report = {
            "inventory": str(inv), "release": release, "status": "ok" if ok else "failed",
            "started_at": started_at, "seconds": round(time.monotonic() - started, 1),
            "resumed_from": resume_from, "plan": progress.plan,
            "completed": previously + [w for w in progress.completed if w not in previously],
            "wave_seconds": {k: round(v, 1) for k, v in progress.wave_seconds.items()},
            "nodes": progress.nodes, "failure": progress.failure, "rollbacks": progress.failures,
            "ansible_rc": result.rc,
            "artifacts": str(result.artifacts),
        }
        if not ok and progress.failure is None:
            report["failure"] = {"host": "-", "gate": "playbook", "wave": progress.wave_name(progress.wave_index),
                                 "why": f"ansible-playbook exited {result.rc}; see {result.artifacts}", "measured": {}}
        kept = inputs or (state.get("inputs") if resume else None)
        save_state(folder, {"release": release, "status": report["status"],
                            "plan": progress.plan or state.get("plan", []),
                            "completed": report["completed"], "failure": report["failure"],
                            **({"inputs": kept} if kept else {})})
        report["resume_inputs"] = bool(kept and kept["vars_files"])
        path = folder / f"{stem}.json"
        # The report is written there with the pack's summary, and the pack is bound to the report's sha256.
        report["evidence"] = evidence.complete(pack, report, path)
        report["report"] = str(path)
        return report


# --- the plan (nothing changes): plugin_utils/platform_plan.py ------------------------------------------------

WAVE_VARS = ("rollout_waves", "rollout_branch_order", "rollout_batch_size", "serving_instances")


def release_variables(vars_files: list[Path] | None, extravars: dict | None) -> dict[str, Any]:
    """The release's variables as Ansible will see them: the --vars files in order, then -e."""
    merged: dict[str, Any] = {}
    for path in vars_files or []:
        merged.update(load_yaml(path, "--vars") or {})
    merged.update(extravars or {})
    return merged


def plan(inventory: str | Path, release: str, *, extravars: dict | None = None, vars_files: list[Path] | None = None,
         limit: str | None = None, accept_no_rollback: bool = False,
         observed: dict[str, dict] | None = None) -> dict[str, Any]:
    """The rollout's plan from the inventory and the release's variables (and what the nodes reported, when
    given): per wave and unit the steps, levels before and after, capacity left, the point of no return and what
    is refused. Reads the inventory only; changes nothing."""
    inv = resolve_inventory(inventory)
    listing = inventory_mod.listing(inv, limit)
    groups = inventory_mod.groups(listing)
    before = inventory_mod.hostvars(listing)
    extra = release_variables(vars_files, extravars)
    after = {host: {**hv, **extra, "atlas_release_id": release} for host, hv in before.items()}
    fleet = groups.get(inventory_mod.SERVING_GROUP, [])
    wave_vars = {**(before.get(fleet[0], {}) if fleet else {}), **extra}
    from ansible_collections.atlas.serving.plugins.plugin_utils import platform_plan as platform
    from ansible_collections.atlas.serving.plugins.plugin_utils import rollout_waves as waves_mu

    try:
        waves = waves_mu.plan(wave_vars.get("rollout_waves"), groups, inventory_mod.SERVING_GROUP,
                              branch_order=wave_vars.get("rollout_branch_order"),
                              batch=wave_vars.get("rollout_batch_size", 1),
                              serving_instances=wave_vars.get("serving_instances") or {})
    except waves_mu.WaveError as exc:
        raise UsageError(f"inventory {inv}: {exc}") from None
    groups_of: dict[str, list[str]] = {}
    for group, hosts in groups.items():
        for host in hosts:
            groups_of.setdefault(host, []).append(group)
    table = site_data.load_compat(extras=site_data.compat_tables(inv, listing))
    accept = accept_no_rollback or any(inventory_mod.as_bool(after[h].get(platform.ACCEPT_VAR)) for h in fleet)
    result = platform.plan(release, waves, before, after, groups_of, table, observed=observed,
                           serving_instances=wave_vars.get("serving_instances") or {}, accept_no_rollback=accept)
    result["inventory"] = str(inv)
    return result


def _levels_text(before: dict, after: dict) -> str:
    parts = []
    for key, label in (("release", "release"), ("driver", "driver"), ("firmware", "firmware"), ("cann", "CANN")):
        if before.get(key) != after.get(key):
            parts.append(f"{label} {before.get(key) or '(none)'} -> {after.get(key) or '(none)'}")
        elif after.get(key):
            parts.append(f"{label} {after[key]}")
    return ", ".join(parts)


def render_plan(result: dict[str, Any]) -> str:
    """The plan as text: per wave the branch capacity and per unit its steps and levels; then the point of no
    return, what is refused and why, warnings and what was assumed."""
    lines = [f"rollout {result['release']} on {result['inventory']}: PLAN (nothing changes)"]
    if result["assumed"]:
        lines.append(f"  assumed: {', '.join(result['assumed'])} run the inventory's driver_version, "
                     "driver_firmware_version, cann_version and atlas_release_id (no node was read)")
    for wave in result["waves"]:
        capacity = "; ".join(f"branch {b or '(none)'} keeps {c['left']} of {c['backends']} backend(s)"
                             for b, c in sorted(wave["capacity"].items()))
        lines.append(f"wave {wave['index']} {wave['name']}{' (skipped: resumed later)' if wave['skipped'] else ''}"
                     f": {capacity or 'no backend drained'}")
        for unit in wave["units"]:
            mark = "  [point of no return]" if unit["point_of_no_return"] else ""
            lines.append(f"  {' + '.join(unit['hosts'])} [{unit['branch'] or '-'}]: {' '.join(unit['steps'])}{mark}")
            lines.append(f"      {_levels_text(unit['before'], unit['after'])}")
            lines += [f"      - {note}" for note in unit["notes"]]
    pnr = result["point_of_no_return"]
    if pnr["units"]:
        state = "ACCEPTED (--accept-no-rollback)" if pnr["accepted"] else "not accepted"
        lines.append(f"point of no return ({state}):")
        lines += [f"  {why}" for why in pnr["why"]]
    else:
        lines.append("point of no return: none (a failed gate rolls each unit back to its previous release)")
    for refusal in result["refused"]:
        lines.append(f"REFUSED {refusal['what']}: {refusal['why']}. Fix: {refusal['fix']}")
    lines += [f"warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)


def live_brief(live: dict[str, Any] | None) -> str:
    """The SLO gate's live latency from Prometheus (rollout_slo_measured.prometheus): 'TTFT 180ms -> 210ms, TPOT
    ...' over its window before the restart and after the bench; '' when the inventory names no Prometheus."""
    if not live:
        return ""
    if live.get("error"):
        return f"none: {live['error']}"
    before, after = prometheus.cells(live.get("before")), prometheus.cells(live.get("after"))
    return (f"TTFT {before['ttft_p95_ms']} -> {after['ttft_p95_ms']}, "
            f"TPOT {before['tpot_p95_ms']} -> {after['tpot_p95_ms']} ({live.get('window')})")


def html_report(report: dict[str, Any]) -> str:
    """A self-contained page: waves, nodes, the failure with what it measured."""
    esc = outputs.html_text  # HTML-escaped, control characters made visible
    rows = "".join(
        f"<tr><td>{esc(w['name'])}</td><td>{esc(', '.join(w['hosts']))}</td>"
        f"<td>{'skipped' if w.get('skipped') else ('done' if w['name'] in report['completed'] else 'not run')}</td>"
        f"<td>{report['wave_seconds'].get(w['name'], '')}</td></tr>" for w in report["plan"])
    nodes = "".join(f"<tr><td>{esc(n['host'])}</td><td>{esc(n['wave'])}</td><td>{esc(n['previous'])}</td>"
                    f"<td>{esc(n['release'])}</td>"
                    f"<td>{esc(json.dumps(n.get('slo', {}).get('metrics', {}))[:400])}</td>"
                    f"<td>{esc(live_brief(n.get('slo', {}).get('prometheus')))}</td></tr>"
                    for n in report["nodes"])
    failure = report.get("failure")
    fail_html = (f"<h2>Failure</h2><pre>{esc(json.dumps(failure, indent=1))}</pre>" if failure else "")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Rollout {esc(report['release'])}</title>"
            "<style>body{font-family:sans-serif}td,th{border:1px solid #ccc;padding:4px}</style></head><body>"
            f"<h1>Rollout {esc(report['release'])}: {esc(report['status'])}</h1>"
            f"<p>{esc(report['inventory'])}, started {esc(report['started_at'])}, {report['seconds']} s</p>"
            f"<h2>Waves</h2><table><tr><th>wave</th><th>hosts</th><th>state</th><th>s</th></tr>{rows}</table>"
            f"<h2>Nodes</h2><table><tr><th>host</th><th>wave</th><th>from</th><th>to</th><th>SLO metrics</th>"
            "<th>Prometheus p95 before -> after</th></tr>"
            f"{nodes}</table>{fail_html}</body></html>\n")
