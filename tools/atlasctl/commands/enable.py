"""`atlasctl enable -i INV NODE...`: send traffic to drained serving units again after maintenance
(playbooks/maintenance.yml), each once its unit passes the health gate (service, /health, /v1/models, a
completion on its entry). A node stands for its whole unit (every rank of a multi-node instance).

Exit status: 0 every unit enabled, 1 one was refused or unreachable (the report says why), 2 bad command line.
"""

from __future__ import annotations

import argparse
import json

from atlasctl import exitcodes, maintenance


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("enable", help="enable drained serving units at their branch gateways",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--inventory", required=True, help="inventory path (e.g. inventory/lab)")
    p.add_argument("nodes", nargs="+", metavar="NODE", help="serving nodes (each stands for its whole unit)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = maintenance.run(args.inventory, args.nodes, "up")
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else maintenance.render(report))
    return exitcodes.OK if report["status"] == "ok" else exitcodes.FAILED
