"""Hardware maintenance outside a rollout: drain serving units at their branch gateways, or enable them again
(``atlasctl drain`` / ``atlasctl enable``), through playbooks/maintenance.yml.

A node stands for its whole serving unit (every rank of a multi-node instance: they serve and stop together);
units go one after the other, so the last-backend guard of each drain sees the ones before it. The report has one
entry per node: drained / enabled, refused (the branch's last healthy backend; a health gate not passed), or
unreachable, with why.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import serving_instance

from atlasctl import exitcodes
from atlasctl import inventory as inventory_mod
from atlasctl.errors import UsageError
from atlasctl.runner import resolve_inventory, run_playbook

PLAYBOOK = "playbooks/maintenance.yml"
STATES = {"down": "drained", "up": "enabled"}


def units(listing: dict[str, Any], nodes: list[str]) -> list[list[str]]:
    """The serving units of ``nodes`` (each once, in the order given); a name not in the fleet is a UsageError."""
    fleet = inventory_mod.groups(listing).get(inventory_mod.SERVING_GROUP, [])
    unknown = [n for n in nodes if n not in fleet]
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not a serving node of the inventory",
                         fix=f"name nodes of {inventory_mod.SERVING_GROUP}: {', '.join(fleet) or '(none)'}")
    hostvars = inventory_mod.hostvars(listing)
    instances = next((hv.get("serving_instances") for hv in hostvars.values() if hv.get("serving_instances")), {})
    found: list[list[str]] = []
    for node in nodes:
        try:
            unit = serving_instance.unit_of(node, instances or {})
        except serving_instance.InstanceError as exc:
            raise UsageError(f"inventory: {exc}") from None
        if unit not in found:
            found.append(unit)
    return found


def run(inventory: str | Path, nodes: list[str], state: str, *,
        run_fn: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Drain (``down``) or enable (``up``) the units of ``nodes``; the report."""
    run_fn = run_fn or run_playbook
    inv = resolve_inventory(inventory)
    found = units(inventory_mod.listing(inv), nodes)
    hosts = [h for unit in found for h in unit]
    result = run_fn(PLAYBOOK, inv, extravars={"maintenance_state": state}, limit=",".join(hosts))
    report_nodes = []
    for unit in found:
        for host in unit:
            seen = result.hosts.get(host)
            if seen is not None and seen.facts.get("maintenance_result") and not seen.failed:
                outcome, why = seen.facts["maintenance_result"], ""
            elif seen is not None and seen.unreachable:
                outcome, why = "unreachable", seen.message
            elif seen is not None and seen.failed:
                outcome, why = "refused", f"{seen.failed_task}: {seen.message}"
            else:
                outcome, why = "not reached", "an earlier unit failed (units go one after the other)"
            report_nodes.append({"host": host, "unit": unit, "result": outcome, "why": why})
    ok = all(n["result"] == STATES[state] for n in report_nodes)
    return {"inventory": str(inv), "state": STATES[state], "status": "ok" if ok else "failed",
            "nodes": report_nodes, "ansible_rc": result.rc, "artifacts": str(result.artifacts)}


def render(report: dict[str, Any]) -> str:
    verb = "drain" if report["state"] == "drained" else "enable"
    lines = [f"{verb} on {report['inventory']}: {report['status'].upper()}"]
    for node in report["nodes"]:
        unit = f" (unit {' + '.join(node['unit'])})" if len(node["unit"]) > 1 else ""
        lines.append(f"  {node['host']}{unit}: {node['result']}" + (f": {node['why'][:600]}" if node["why"] else ""))
    return "\n".join(lines)


def add_command(sub: argparse._SubParsersAction, name: str, state: str, summary: str, doc: str) -> None:
    """``atlasctl drain`` and ``atlasctl enable``: the same command line, the state apart."""
    p = sub.add_parser(name, help=summary, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-i", "--inventory", required=True, help="inventory path (e.g. inventory/lab)")
    p.add_argument("nodes", nargs="+", metavar="NODE", help="serving nodes (each stands for its whole unit)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")

    def command(args: argparse.Namespace) -> int:
        report = run(args.inventory, args.nodes, state)
        print(json.dumps(report, indent=1, sort_keys=True) if args.json else render(report))
        return exitcodes.OK if report["status"] == "ok" else exitcodes.FAILED

    p.set_defaults(func=command)
