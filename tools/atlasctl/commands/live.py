"""`atlasctl live`: the fleet's live figures from its Prometheus (p95 TTFT and TPOT, KV cache use, requests running
per node) over a window, now or at a past time (docs/monitoring.md). The rollout's SLO gate runs it for the canary
before its restart and after its bench; `atlasctl health` shows the same figures in its table.

Prometheus not answering is no error here: the JSON says so (`error`) and the exit code is 3 (environment).
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from pathlib import Path

from atlasctl import exitcodes, prometheus
from atlasctl.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("live", help="live figures per node from the inventory's Prometheus")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("-i", "--inventory", type=Path,
                       help="the inventory naming Prometheus (monitoring_prometheus_url, else group monitoring)")
    where.add_argument("--prometheus", type=_url, help="Prometheus's URL, e.g. https://10.0.0.5:9090")
    parser.add_argument("--ca-file", help="with --prometheus: the CA its certificate is checked against "
                                          "(default: the system's)")
    parser.add_argument("--user", help="with --prometheus: the API user (monitoring_api_user)")
    parser.add_argument("--password-file", help="with --prometheus: the file holding that user's password "
                                                "(monitoring_api_password_file); never the password itself")
    parser.add_argument("--node", action="append", default=[], help="only this node (repeatable)")
    parser.add_argument("--window", default=prometheus.RULE_WINDOW, help="a Prometheus duration (default 5m)")
    parser.add_argument("--at", type=float, default=None, metavar="UNIX_TIME", help="the window's end (default now)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.set_defaults(func=run)


def render(result: prometheus.Live, nodes: list[str]) -> str:
    """The fleet table's layout (the collection's table_lines, as `atlasctl health` prints it)."""
    # here, not at start-up: the filter imports Ansible
    from ansible_collections.atlas.serving.plugins.filter.serving import table_lines

    rows = [{"host": node, **prometheus.cells(result.nodes.get(node))} for node in nodes]
    when = "now" if result.at is None else f"at {result.at:.0f}"
    return "\n".join([*table_lines(rows, [("host", "NODE"), *prometheus.columns()]),
                      f"({result.url}, over {result.window} {when})"])


def _url(text: str) -> str:
    """--prometheus: an http(s) URL with a host (anything else is a usage error, not a traceback)."""
    try:
        parsed = urllib.parse.urlsplit(text)
        usable = parsed.scheme in ("http", "https") and bool(parsed.hostname) and text.isprintable() \
            and " " not in text and (parsed.port is None or parsed.port > 0)
    except ValueError:  # a port that is not a number, a bracketed host that is not an address
        usable = False
    if not usable:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL with a host (e.g. https://10.0.0.5:9090)")
    return text


def run(args: argparse.Namespace) -> int:
    if args.inventory is not None:
        result = prometheus.for_inventory(args.inventory, args.window, args.at)
        if result is None:
            raise UsageError(f"inventory {args.inventory} names no Prometheus",
                             fix="add a host to group monitoring (playbooks/monitoring.yml), or set "
                                 "monitoring_prometheus_url in its group_vars/all")
    else:
        access = prometheus.Access(args.prometheus.rstrip("/"), args.ca_file, args.user, args.password_file)
        result = prometheus.live(access, args.window, args.at)
    if args.node:
        result = prometheus.Live(result.url, result.window, result.at,
                                 {n: f for n, f in result.nodes.items() if n in args.node}, result.error)
    if args.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    elif result.error:
        print(f"no live figures: {result.error}")
    else:
        print(render(result, args.node or sorted(result.nodes)))
    return exitcodes.ENVIRONMENT if result.error else exitcodes.OK
