"""`atlasctl drain -i INV NODE...`: take serving units out of their branch gateways for hardware maintenance
(playbooks/maintenance.yml). A node stands for its whole unit (every rank of a multi-node instance); a branch's
last healthy backend is never drained (the drain waits for another, then refuses, naming the branch); units go
one after the other.

Exit status: 0 every unit drained, 1 one was refused or unreachable (the report says why), 2 bad command line.
"""

from __future__ import annotations

import argparse
import json

from atlasctl import exitcodes, maintenance


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("drain", help="drain serving units at their branch gateways (maintenance)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--inventory", required=True, help="inventory path (e.g. inventory/lab)")
    p.add_argument("nodes", nargs="+", metavar="NODE", help="serving nodes (each stands for its whole unit)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = maintenance.run(args.inventory, args.nodes, "down")
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else maintenance.render(report))
    return exitcodes.OK if report["status"] == "ok" else exitcodes.FAILED
