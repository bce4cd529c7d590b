"""`atlasctl compat check`: judge a release plan against the compatibility table (no host touched).

The table: the collection's data/compat.yml (or --table), with the rows of the extra tables that the
inventory given with -i names in atlas_compat_extra_tables (the lab's engines: -i inventory/lab), merged
as preflight's gate merges them (plugin_utils/site_data.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from atlasctl import exitcodes, site_data

FIELDS = ("cann", "engine", "engine_version", "python", "torch", "torch_npu", "vllm")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("compat", help="check a release plan against the compatibility table")
    csub = parser.add_subparsers(dest="compat_command", metavar="ACTION", required=True)
    check = csub.add_parser("check", help="is CANN + engine (+ Python, torch, torch-npu, vLLM) a possible plan?")
    for field in FIELDS:
        check.add_argument(f"--{field.replace('_', '-')}", dest=field, default="")
    check.add_argument("--table", type=Path, default=None, help="table (default: the collection's data/compat.yml)")
    check.add_argument("-i", "--inventory",
                       help="add the extra tables this inventory names (atlas_compat_extra_tables)")
    check.add_argument("--json", action="store_true", help="print the verdict as JSON")
    check.set_defaults(func=_check)


def _compat():
    from ansible_collections.atlas.serving.plugins.module_utils import compat

    return compat


def _check(args: argparse.Namespace) -> int:
    compat = _compat()
    table = site_data.load_compat(args.table, site_data.compat_tables(args.inventory))
    plan = {f: getattr(args, f) for f in FIELDS if getattr(args, f)}
    verdict = compat.evaluate(plan, table)
    if args.json:
        print(json.dumps(verdict, indent=2, default=str))
    elif verdict["ok"]:
        what = "lab engine, no CANN requirement" if verdict["lab"] else "compatible"
        print(f"{compat.describe_plan(verdict['plan'])}: {what}")
    else:
        print(f"{compat.describe_plan(verdict['plan'])}: refused")
        for problem in verdict["problems"]:
            print(f"  {problem}")
        for fix in verdict["fixes"]:
            print(f"  fix: {fix}")
        if verdict.get("source"):
            print(f"  source: {verdict['source']}")
    return exitcodes.OK if verdict["ok"] else exitcodes.FAILED
