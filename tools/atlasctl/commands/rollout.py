"""`atlasctl rollout -i INV --release ID`: staged rollout (canary, then branch by branch) through
playbooks/rollout.yml with health and SLO gates, automatic rollback and --resume. A release that names a new
driver, firmware or CANN moves the platform of each unit inside its drained window (docs/platform-upgrades.md).

`--plan` changes nothing: per wave and unit the steps that will run, the levels before and after, the branch
capacity left, the point of no return and what is refused (`--json`: the same as data).

Exit status: 0 every wave completed (--plan: nothing refused), 1 a gate failed (the node was rolled back, the
rollout stopped; --plan: something is refused), 2 bad command line, a rollout already running on the inventory,
or a point of no return not accepted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from atlasctl import exitcodes, rollout
from atlasctl.errors import UsageError
from atlasctl.inputs import load_yaml, parse_yaml


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="staged rollout of a release with health/SLO gates and rollback",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--inventory", required=True, help="inventory path (e.g. inventory/lab)")
    p.add_argument("--release", required=True, help="release id (atlas_release_id) to roll out")
    p.add_argument("--vars", type=Path, action="append", default=[],
                   help="YAML file of the release's variables (engines_version, serving_flags_extra, ...); passed "
                        "to Ansible by path (-e @FILE), so secrets such as serving_api_key belong here, not in -e")
    p.add_argument("-e", "--extra", action="append", default=[], metavar="KEY=VALUE",
                   help="one release variable (VALUE parsed as YAML)")
    p.add_argument("--resume", action="store_true",
                   help="start at the wave that failed last time, with that run's --vars files (give the same -e "
                        "values and --limit)")
    p.add_argument("--allow-downgrade", action="store_true",
                   help="accept a bundle built before the one the nodes accepted last (atlas_allow_downgrade)")
    p.add_argument("--plan", action="store_true",
                   help="print the plan (steps per wave and unit, levels, capacity, point of no return); "
                        "change nothing")
    p.add_argument("--accept-no-rollback", action="store_true",
                   help="accept the plan's point of no return (a driver or CANN move a rollback cannot undo); "
                        "the inventory's rollout_accept_no_rollback: true does the same")
    p.add_argument("-l", "--limit", default=None, help="host pattern")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--html", type=Path, default=None, help="also write the report as an HTML page")
    p.set_defaults(func=run)


def check_vars_files(files: list[Path]) -> list[Path]:
    """The --vars files, each an existing YAML mapping (read here only to check it)."""
    for path in files:
        data = load_yaml(path, "--vars", fix="pass a YAML file of release variables (`key: value` lines)") or {}
        if not isinstance(data, dict):
            raise UsageError(f"--vars {path} is not a mapping", fix="write `key: value` lines")
    return [path.resolve() for path in files]


def check_release(release: str) -> str:
    """A release id that is one safe path component (it becomes a directory on every node): the serving
    role's rule (plugin_utils/release_id.py)."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import release_id as rule

    problem = rule.problem(release)
    if problem:
        raise UsageError(f"--release {problem}", fix=f"e.g. --release {rule.EXAMPLE}")
    return release


def extravars(pairs: list[str]) -> dict:
    out: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(f"-e {pair!r} is not KEY=VALUE", fix="e.g. -e serving_lint_override=true")
        out[key] = parse_yaml(value, f"-e {key}", fix="quote the value, e.g. -e 'key=\"text\"'")
    return out


def _summary(report: dict) -> str:
    lines = [f"rollout {report['release']} on {report['inventory']}: {report['status'].upper()} "
             f"in {report['seconds']} s (waves done: {', '.join(report['completed']) or '-'})"]
    failure = report.get("failure")
    if failure:
        lines.append(f"  failed: node {failure['host']}, wave {failure.get('wave')}, gate {failure['gate']}: "
                     f"{failure['why'][:600]}")
        if failure.get("measured"):
            lines.append(f"  measured: {json.dumps(failure['measured'].get('metrics', failure['measured']))[:600]}")
        lines.append(f"  resume after fixing: atlasctl rollout -i {report['inventory']} --release "
                     f"{report['release']} --resume"
                     + (" (its --vars files are used again; give the same -e values and --limit)"
                        if report.get("resume_inputs") else ""))
    lines.append(f"  report: {report['report']}")
    pack = report.get("evidence") or {}
    if pack.get("dir"):
        signed = f"signed by {pack.get('key')}" if pack.get("signed") else "UNSIGNED"
        lines.append(f"  evidence: {pack['dir']} ({signed}; atlasctl evidence verify {pack['dir']})")
    elif pack.get("note"):
        lines.append(f"  evidence: {pack['note']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    check_release(args.release)
    variables, files = extravars(args.extra), check_vars_files(args.vars)
    if args.allow_downgrade:
        variables["atlas_allow_downgrade"] = True  # roles/bundle_trust: going back on purpose
    if args.resume:  # the rest of the interrupted rollout: its --vars files, -e values and --limit
        files = rollout.resume_vars(rollout.last_state(args.inventory), files, variables, args.limit)
    inputs = rollout.run_inputs(files, variables, args.limit)
    planned = rollout.plan(args.inventory, args.release, extravars=variables, vars_files=files, limit=args.limit,
                           accept_no_rollback=args.accept_no_rollback)
    if args.plan:
        print(json.dumps(planned, indent=1, sort_keys=True) if args.json else rollout.render_plan(planned))
        return exitcodes.OK if planned["ok"] else exitcodes.FAILED
    if planned["point_of_no_return"]["units"] and not planned["point_of_no_return"]["accepted"]:
        raise UsageError(f"release {args.release} has a point of no return: {planned['point_of_no_return']['why'][0]}",
                         fix=f"read `atlasctl rollout -i {args.inventory} --release {args.release} --plan`, then "
                             "pass --accept-no-rollback")
    if planned["point_of_no_return"]["accepted"]:
        variables["rollout_accept_no_rollback"] = True  # the playbook checks it again before each unit
    out = sys.stdout if sys.stdout.isatty() and not args.json else None
    try:
        report = rollout.run(args.inventory, args.release, extravars=variables, resume=args.resume,
                             limit=args.limit, out=out, vars_files=files, inputs=inputs)
    except rollout.RolloutBusy as exc:
        print(f"atlasctl rollout: {exc.render()}", file=sys.stderr)
        return exitcodes.USAGE
    if args.html:
        args.html.write_text(rollout.html_report(report))
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else _summary(report))
    return exitcodes.OK if report["status"] == "ok" else exitcodes.FAILED
