"""`atlasctl health -i INV`: the fleet health table (service, /health, model, NPUs, last bench figures).

The LAST BENCH column is the newest `atlasctl bench` result kept under artifacts/bench/<node>/. When the
inventory names a Prometheus (monitoring_prometheus_url, else its group monitoring: docs/monitoring.md; the
health playbook resolves it, fact health_prometheus), the table gains its live figures per node (p95 TTFT
and TPOT over 5 minutes, KV cache use, requests running: atlasctl.prometheus); a Prometheus that does not
answer is a note under the table, not a failure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from atlasctl import exitcodes, prometheus
from atlasctl.bench import report as bench_report
from atlasctl.outputs import safe, safe_row
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
    # here, not at start-up: the filter imports Ansible
    from ansible_collections.atlas.serving.plugins.filter import serving

    return serving


def live_figures(result) -> prometheus.Live | None:
    """The live figures of the inventory's Prometheus, which the health playbook names (fact
    health_prometheus: its URL, CA and API user, resolved as the rollout resolves them); None when it names none."""
    found = next((h.facts["health_prometheus"] for h in result.hosts.values()
                  if (h.facts.get("health_prometheus") or {}).get("url")), None)
    return prometheus.live(prometheus.Access.of(found)) if found else None


def add_live(rows: list[dict], live: prometheus.Live) -> list[dict]:
    for row in rows:
        row["live"] = live.nodes.get(row["host"])
    return rows


def columns(live: prometheus.Live | None = None) -> list[tuple[str, str]]:
    return [*_filters().FLEET_COLUMNS, *(prometheus.columns() if live else []), ("bench", "LAST BENCH")]


def _cells(rows: list[dict], live: prometheus.Live | None) -> list[dict]:
    return [{**row, **prometheus.cells(row.get("live"))} for row in rows] if live else rows


def render_table(rows: list[dict], live: prometheus.Live | None = None) -> str:
    """The table, each cell and line made ``safe``: a host name or an engine's reply holding a control
    character (a right-to-left override, an escape, a newline) is printed escaped, never obeyed."""
    lines = _filters().table_lines([safe_row(row) for row in _cells(rows, live)], columns(live))
    lines += [safe(f"{r.get('host')}: {r['problem']}") for r in rows if r.get("problem")]
    if live and live.error:
        lines.append(safe(f"live figures: none ({live.error})"))
    elif live:
        lines.append(safe(f"live figures: {live.url}, over {live.window}"))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = run_playbook("playbooks/health.yml", args.inventory, limit=args.limit,
                          extravars={"health_timeout_s": args.wait})
    rows = rows_from(result)
    live = live_figures(result)
    if live:
        add_live(rows, live)
    if args.json:
        doc = {"ok": result.ok, "hosts": rows}
        if live:
            doc["prometheus"] = {"url": live.url, "window": live.window, "error": live.error}
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_table(rows, live))
    if args.html:
        ok = result.ok and bool(rows)
        args.html.write_text(bench_report.health_html(_cells(rows, live), columns(live), ok, None))
    return exitcodes.OK if result.ok and rows else exitcodes.FAILED
