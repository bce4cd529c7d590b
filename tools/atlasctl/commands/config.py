"""`atlasctl config`: serving profiles checked against the real engines, and the NPU memory planner.

    atlasctl config render PROFILE [-i INV] [--out DIR] [--json]   args, env (0600) and systemd unit of a profile
    atlasctl config render -i INV --host HOST [--out DIR] [--json]  ... of the host's profile and rank in its
                                                                    serving instance (docs/multinode-serving.md)
    atlasctl config lint [PROFILE ...] [-i INV] [--json]           every flag/value/variable vs the release schema
                                                                    (with -i and no PROFILE: every rank too)
    atlasctl config lint --release R [--argv-file F] [--env-file E]  lint a rendered .args file, .env file or both:
                                                                    exactly the files given, no profile
    atlasctl config plan [PROFILE ...] [-i INV] [--npus N --hbm-mb M] [--nodes K] [--model-dir DIR] [--reserve-gib G]
                         [--json]                                   layout (TP x PP x DP, EP, W8A8) from the flags
    atlasctl config plan -i INV --host HOST [...]                    the plan of the host's serving instance
    atlasctl config schema refresh [RELEASE ...] [--wheel-dir DIR]

Profiles: the serving role's, and with -i INV also those in the directories INV's hosts name in
serving_profile_dirs (searched first, as the serving role does; the lab's: -i inventory/lab).

Every environment value is held to its key's grammar, with no shell metacharacter and no loader or interpreter
variable (module_utils/engine_lint.py ``env_value_findings``): lint reports it, render writes nothing and plan
plans nothing for a profile lint finds anything in.

Exit codes: 0 all real / all fit; 1 a finding or a refused plan (plan: also a profile lint refuses); 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from atlasctl import exitcodes, planner
from atlasctl.errors import UsageError
from atlasctl.inputs import read_text
from atlasctl.outputs import write_files
from atlasctl.site_data import profile_dirs

INVENTORY_HELP = "also the profiles in the serving_profile_dirs of this inventory's hosts"
HOST_HELP = "a host of -i INV: its profile with its rank's flags and variables (serving_instances)"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("config", help="render, lint and plan serving profiles")
    csub = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)

    p = csub.add_parser("render", help="render a profile (args, env, unit)")
    p.add_argument("profile", nargs="?", help="profile name (with --host: default the host's serving_profile)")
    p.add_argument("-i", "--inventory", help=INVENTORY_HELP)
    p.add_argument("--host", help=HOST_HELP)
    p.add_argument("--out", type=Path, default=None, help="write <service>.args/.env (0600)/.service here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_render)

    p = csub.add_parser("lint", help="check profiles (or a rendered .args/.env) against the engine schemas",
                        description="Lint serving profiles, or rendered files: with --argv-file and/or --env-file "
                                    "exactly the files given are linted (either alone, or both), against --release; "
                                    "no profile is linted then.")
    p.add_argument("profiles", nargs="*", help="profile names (default: all shipped, and -i INV's)")
    p.add_argument("-i", "--inventory", help=INVENTORY_HELP)
    p.add_argument("--release", help="engine release of --argv-file/--env-file (e.g. vllm-ascend-0.11.0)")
    p.add_argument("--argv-file", type=Path, help="a rendered .args file (one argument per line); alone or with "
                                                  "--env-file")
    p.add_argument("--env-file", type=Path, help="a rendered .env file (KEY=value lines); alone or with --argv-file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_lint)

    p = csub.add_parser("plan", help="NPU memory plan and capacity table (of profiles lint passes)")
    p.add_argument("profiles", nargs="*", help="profile names (default: all shipped, and -i INV's)")
    p.add_argument("-i", "--inventory", help=INVENTORY_HELP)
    p.add_argument("--host", help=HOST_HELP)
    p.add_argument("--npus", type=int, help="NPUs per node (default: the profile's hardware)")
    p.add_argument("--nodes", type=int, help="nodes of the instance (default: the profile's --nnodes, DP size / "
                                             "local DP size, hardware.nodes, else 1)")
    p.add_argument("--hbm-mb", type=int, help="HBM per NPU in MB as npu-smi prints it (65536 for 64 GB)")
    p.add_argument("--model-dir", type=Path, help="model directory: config.json + *.safetensors headers")
    p.add_argument("--reserve-gib", type=float, help="activation/workspace reserve per NPU (default 2)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_plan)

    p = csub.add_parser("schema", help="engine schemas")
    ssub = p.add_subparsers(dest="schema_command", metavar="ACTION", required=True)
    r = ssub.add_parser("refresh", help="pip download --no-deps the pinned wheels and extract their schemas")
    r.add_argument("releases", nargs="*", help="releases (default: all pinned)")
    r.add_argument("--wheel-dir", type=Path, help="keep the downloaded wheels here")
    r.set_defaults(func=run_schema_refresh)


def _host_rank(args: argparse.Namespace, dirs) -> planner.Rank | None:
    if not args.host:
        return None
    if not args.inventory:
        raise UsageError("--host needs -i INV", fix="e.g. -i inventory/example-multinode --host atlas-dc1-02")
    rank = planner.rank_of(args.inventory, args.host, dirs)
    if rank.note:
        print(f"note: {rank.note}", file=sys.stderr)
    return rank


def run_render(args: argparse.Namespace) -> int:
    dirs = profile_dirs(args.inventory)
    rank = _host_rank(args, dirs)
    name = args.profile or (rank.profile if rank else None)
    if not name:
        raise UsageError("config render needs a PROFILE (or -i INV --host HOST)",
                         fix="e.g. atlasctl config render vllm-ascend-0.11.0-mistral-7b-8x64g")
    if rank and name != rank.profile:
        raise UsageError(f"profile {name} is not {args.host}'s serving_profile ({rank.profile})",
                         fix="omit PROFILE with --host, or drop --host")
    rendered = planner.render(name, api_key=os.environ.get("ATLAS_SERVING_API_KEY", ""), dirs=dirs, rank=rank)
    if args.out:
        files = [(f"atlas-serving{suffix}", text, mode) for suffix, text, mode in (
            (".args", rendered.args_text, 0o640), (".env", rendered.env_text, 0o600),
            (".service", rendered.unit_text, 0o644), (".keys.yaml", rendered.keys_text, 0o640)) if text]
        for path in write_files(args.out, files):
            print(path)
        return exitcodes.OK
    if args.json:
        data = rendered.as_dict()
        data["env"] = [_mask(line) for line in data["env"]]
        print(json.dumps(data, indent=1))
    else:
        print(_mask_args(rendered.args_text) + _mask_env(rendered.env_text), end="")
    return exitcodes.OK


def _mask(line: str) -> str:
    key = line.split("=", 1)[0]
    return f"{key}=<secret>" if key in {"VLLM_API_KEY", "SGLANG_API_KEY"} else line


def _mask_env(text: str) -> str:
    return "".join(_mask(line) + "\n" for line in text.splitlines())


def _mask_args(text: str) -> str:
    lines, hide = [], False
    for line in text.splitlines():
        lines.append("<secret>" if hide else line)
        hide = line == "--api-key"
    return "".join(line + "\n" for line in lines)


def _lint_files(args: argparse.Namespace) -> dict[str, list[dict]]:
    """{label: findings} of exactly the rendered files given (--argv-file, --env-file, or both) against --release;
    the .env file read as systemd's EnvironmentFile reads it (module_utils/engine_lint.py ``parse_env_file``)."""
    from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint

    given = "--argv-file" if args.argv_file else "--env-file"
    if not args.release:
        raise UsageError(f"{given} needs --release", fix="e.g. --release vllm-ascend-0.11.0")
    if args.profiles:
        raise UsageError(f"{given} lints the files given, not profiles ({' '.join(args.profiles)})",
                         fix="lint the profiles and the rendered files in two runs")
    argv, env, findings = [], {}, []
    if args.argv_file:
        argv = lint.args_file_argv(read_text(args.argv_file, "--argv-file",
                                             fix="pass a rendered .args file (one argument per line)"))
    if args.env_file:
        env, findings = lint.parse_env_file(read_text(args.env_file, "--env-file",
                                                      fix="pass a rendered .env file (KEY=value lines)"))
    try:
        findings = lint.lint(argv, env, args.release) + findings
    except lint.LintError as exc:
        raise UsageError(f"--release {args.release}: {exc}", fix="pass one of " + ", ".join(
            lint.known_releases(lint.schema_dir_default()))) from None
    return {str(args.argv_file or args.env_file): findings}


def run_lint(args: argparse.Namespace) -> int:
    from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as lint

    results: dict[str, list[dict]] = {}
    releases: set[str] = set()
    if args.argv_file or args.env_file:
        results = _lint_files(args)
        releases.add(args.release)
    else:
        dirs = profile_dirs(args.inventory)
        for name in args.profiles or planner.profile_names(dirs):
            results[name] = planner.lint_profile(name, dirs)
            releases.add(str(planner.load_profile(name, dirs).get("engine_release")))
        if args.inventory and not args.profiles:
            for instance, host in planner.instance_ranks(args.inventory):
                rank = planner.rank_of(args.inventory, host, dirs)
                label = f"{instance} rank {rank.rank['rank']} ({host})"
                results[label] = planner.lint_profile(rank.profile, dirs, rank)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        for name, findings in results.items():
            print(f"{name}: {'ok' if not findings else f'{len(findings)} finding(s)'}")
            for f in findings:
                print(f"  {f['kind']}: {f['message']}")
    for release in sorted(releases):  # a release with a schema and no verified ranges says so
        note = lint.ranges_note(release)
        if note:
            print(f"note: {note}", file=sys.stderr)
    return exitcodes.FAILED if any(results.values()) else exitcodes.OK


def _check_plan_args(args: argparse.Namespace) -> None:
    """The plan's figures, checked by the planner's own bounds (module_utils/memplan.py) before any profile."""
    from ansible_collections.atlas.serving.plugins.module_utils import memplan

    examples = {"--npus": "8", "--hbm-mb": "65536", "--nodes": "2", "--reserve-gib": "2"}
    checks = (("--npus", args.npus, lambda v, what: memplan.whole(v, what)),
              ("--hbm-mb", args.hbm_mb, memplan.hbm_bytes_of),
              ("--nodes", args.nodes, lambda v, what: memplan.whole(v, what, high=memplan.NODES_MAX)),
              ("--reserve-gib", args.reserve_gib, memplan.gib_bytes))
    for flag, value, check in checks:
        if value is None:
            continue
        try:
            check(value, f"config plan {flag}")
        except memplan.PlanError as exc:
            raise UsageError(str(exc), fix=f"pass e.g. {flag} {examples[flag]}, or omit it for the profile's "
                             "hardware and the default reserve") from None


def _lint_refusals(targets: list[tuple[str, planner.Rank | None]], dirs: planner.Dirs) -> str:
    """What ``config lint`` finds in the profiles (on their ranks) ``targets``, as the lines ``config plan`` refuses
    with; "" when lint finds nothing (plan plans only what lint passes)."""
    lines = []
    for name, rank in targets:
        findings = planner.lint_profile(name, dirs, rank)
        if findings:
            lines.append(f"{name}: {len(findings)} lint finding(s); not planned (`atlasctl config lint {name}`)")
            lines.extend(f"  {f['kind']}: {f['message']}" for f in findings)
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    _check_plan_args(args)
    dirs = profile_dirs(args.inventory)
    rank = _host_rank(args, dirs)
    if rank is not None:
        rows = [planner.plan_profile(rank.profile, args.npus, args.hbm_mb, args.model_dir, args.reserve_gib, dirs,
                                     args.nodes, rank=rank)]
    else:
        rows = [planner.plan_profile(n, args.npus, args.hbm_mb, args.model_dir, args.reserve_gib, dirs, args.nodes)
                for n in (args.profiles or planner.profile_names(dirs))]
    refused = _lint_refusals([(rank.profile, rank)] if rank is not None else
                             [(n, None) for n in (args.profiles or planner.profile_names(dirs))], dirs)
    if refused:
        print(refused, file=sys.stderr)
        return exitcodes.FAILED
    if args.json:
        print(json.dumps([{"profile": r.profile, "skipped": r.skipped, **r.plan} for r in rows], indent=1))
    else:
        print("\n".join(planner.capacity_table(rows)))
        for row in rows:
            if row.plan and not row.plan["fits"]:
                print(row.plan["message"], file=sys.stderr)
    return exitcodes.FAILED if any(r.plan and not r.plan["fits"] for r in rows) else exitcodes.OK


def run_schema_refresh(args: argparse.Namespace) -> int:
    from atlasctl.engine_schema import refresh

    for path in refresh.refresh(args.releases or None, wheel_dir=args.wheel_dir):
        print(path)
    return exitcodes.OK
