"""`atlasctl health -i INV`: the fleet health table (service, /health, model, NPUs, last bench figures).

The LAST BENCH column is the newest `atlasctl bench` result kept under artifacts/bench/<node>/.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from atlasctl import exitcodes
from atlasctl.bench import report as bench_report
from atlasctl.collection import ensure_on_path
from atlasctl.runner import run_playbook


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("health", help="fleet health table")
    parser.add_argument("-i", "--inventory", required=True, help="inventory path (e.g. inventory/lab)")
    parser.add_argument("-l", "--limit", default=None, help="host pattern")
    parser.add_argument("--json", action="store_true", help="print rows as JSON")
    parser.add_argument("--html", type=Path, default=None, help="also write the fleet table as an HTML page")
    parser.add_argument("--wait", type=_seconds, default=30, metavar="SECONDS",
                        help="how long each node's /health may take to answer 200 (default 30: a status query; the "
                             "health stage of site.yml waits health_timeout_s, 600, for engines that load weights)")
    parser.set_defaults(func=run)


def _seconds(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 1 to 3600")
    return int(text)


def rows_from(result) -> list[dict]:
    rows = []
    for name in sorted(result.hosts):
        host = result.hosts[name]
        report = dict(host.facts.get("health_report") or {})
        if not report:
            state = "unreachable" if host.unreachable else "failed"
            report = {"host": name, "service": state, "problem": f"{host.failed_task}: {host.message}".strip(": ")}
        report.setdefault("host", name)
        report.setdefault("bench", bench_report.brief(bench_report.latest(name)))
        rows.append(report)
    return rows


def _filters():
    ensure_on_path()
    return importlib.import_module("ansible_collections.atlas.serving.plugins.filter.serving")


def columns() -> list[tuple[str, str]]:
    return [*_filters().FLEET_COLUMNS, ("bench", "LAST BENCH")]


def render_table(rows: list[dict]) -> str:
    lines = _filters().table_lines(rows, columns())
    lines += [f"{r['host']}: {r['problem']}" for r in rows if r.get("problem")]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = run_playbook("playbooks/health.yml", args.inventory, limit=args.limit,
                          extravars={"health_timeout_s": args.wait})
    rows = rows_from(result)
    if args.json:
        print(json.dumps({"ok": result.ok, "hosts": rows}, indent=2, sort_keys=True))
    else:
        print(render_table(rows))
    if args.html:
        args.html.write_text(bench_report.health_html(rows, columns(), result.ok and bool(rows), None))
    return exitcodes.OK if result.ok and rows else exitcodes.FAILED
