"""Rollout wave plan of the atlas.serving collection.

``rollout_plan``  inventory groups + wave data -> ordered waves [{name, hosts, serial}]

A wave is data: ``{name, hosts: <group or list of hosts>, serial: <batch size>}``.
Without waves: the ``canary`` group first, then every ``branch_*`` group in
``branch_order`` (default: sorted). A host runs in its first wave only.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

MAX_WAVES = 16


def default_waves(groups: dict[str, list[str]], branch_order: list[str] | None = None,
                  batch: int | str = 1, prefix: str = "branch_") -> list[dict[str, Any]]:
    branches = list(branch_order) if branch_order else sorted(g[len(prefix):] for g in groups if g.startswith(prefix))
    waves: list[dict[str, Any]] = [{"name": "canary", "hosts": "canary", "serial": 1}] if "canary" in groups else []
    waves += [{"name": b, "hosts": f"{prefix}{b}", "serial": batch} for b in branches]
    return waves


def _members(wave: dict, groups: dict[str, list[str]], index: int) -> list[str]:
    hosts = wave.get("hosts")
    if isinstance(hosts, str):
        if hosts not in groups:
            raise AnsibleFilterError(
                f"rollout_waves[{index}] ({wave.get('name')}): group {hosts!r} is not in the inventory; "
                f"use one of {', '.join(sorted(groups))} or a list of hosts")
        return list(groups[hosts])
    if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts):
        return list(hosts)
    raise AnsibleFilterError(f"rollout_waves[{index}]: hosts must be a group name or a list of hosts, got {hosts!r}")


def rollout_plan(waves: list[dict] | None, groups: dict[str, list[str]], fleet: str = "atlas_nodes",
                 resume_from: str | None = None, branch_order: list[str] | None = None,
                 batch: int | str = 1) -> list[dict[str, Any]]:
    """Ordered waves of fleet hosts; waves before ``resume_from`` are marked ``skipped``."""
    if not waves:
        waves = default_waves(groups, branch_order, batch)
    fleet_hosts = set(groups.get(fleet, []))
    seen: set[str] = set()
    plan: list[dict[str, Any]] = []
    for i, wave in enumerate(waves):
        if not isinstance(wave, dict) or not wave.get("name"):
            raise AnsibleFilterError(f"rollout_waves[{i}] must be a mapping with name and hosts, got {wave!r}")
        hosts = [h for h in _members(wave, groups, i) if h in fleet_hosts and h not in seen]
        seen.update(hosts)
        if hosts:
            plan.append({"name": str(wave["name"]), "hosts": hosts, "serial": wave.get("serial", batch)})
    names = [w["name"] for w in plan]
    if len(set(names)) != len(names):
        raise AnsibleFilterError(f"rollout wave names must be unique, got {names}")
    if len(plan) > MAX_WAVES:
        raise AnsibleFilterError(f"{len(plan)} waves; playbooks/rollout.yml runs at most {MAX_WAVES}: "
                                 "merge branches into waves in rollout_waves")
    if resume_from:
        if resume_from not in names:
            raise AnsibleFilterError(f"rollout_resume_from {resume_from!r} is not a wave; waves: {', '.join(names)}")
        start = names.index(resume_from)
        for wave in plan[:start]:
            wave["skipped"] = True
    for i, wave in enumerate(plan, 1):
        wave["index"] = i
        wave.setdefault("skipped", False)
    return plan


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan}
