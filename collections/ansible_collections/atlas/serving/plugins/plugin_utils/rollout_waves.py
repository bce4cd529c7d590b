# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout's waves: inventory groups + wave data (+ serving_instances) -> ordered waves
[{name, hosts, serial, units, batches, index, skipped}]. One implementation for the rollout playbook (the filter
``rollout_plan``) and ``atlasctl rollout --plan``.

A wave is data: ``{name, hosts: <group or list of hosts>, serial: <batch size>}``.
Without waves: the ``canary`` group first, then every ``branch_*`` group in
``branch_order`` (default: sorted). A host runs in its first wave only.

A multi-node serving instance is one unit (docs/multinode-serving.md): the wave of its first rank takes
every rank of it, and ``serial`` counts units, not hosts. ``batches`` is what the wave's play runs with
(Ansible's ``serial`` list, in hosts): one unit's ranks are always in one batch, one after the other in
rank order.

Controller only (never shipped to a node).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import serving_instance


class WaveError(ValueError):
    """Wave data that cannot be planned; the message names the wave and the fix."""


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
            raise WaveError(
                f"rollout_waves[{index}] ({wave.get('name')}): group {hosts!r} is not in the inventory; "
                f"use one of {', '.join(sorted(groups))} or a list of hosts")
        return list(groups[hosts])
    if isinstance(hosts, list) and all(isinstance(h, str) for h in hosts):
        return list(hosts)
    raise WaveError(f"rollout_waves[{index}]: hosts must be a group name or a list of hosts, got {hosts!r}")


def _units_per_batch(serial: Any, units: int, index: int, name: str) -> list[int]:
    """``serial`` (a count, ``"N%"``, or a list of them, the last repeating, as Ansible reads it) in units."""
    values = serial if isinstance(serial, list) and serial else [serial]
    out = []
    for value in values:
        text = str(value).strip()
        pct = text.endswith("%") and text[:-1].strip().isdigit()
        if not (pct or text.isdigit()) or isinstance(value, bool) or int(text.rstrip("%")) < 1:
            raise WaveError(f"rollout_waves[{index}] ({name}): serial {serial!r} is not a batch size: "
                            "use a whole number >= 1, a percentage such as \"25%\", or a list of them")
        out.append(max(1, int(int(text[:-1]) * units / 100)) if pct else int(text))
    return out


def _batches(units: list[list[str]], sizes: list[int]) -> list[int]:
    """Hosts per batch when each batch takes the next ``sizes[i]`` units (the last size repeats)."""
    out, i, step = [], 0, 0
    while i < len(units):
        take = sizes[min(step, len(sizes) - 1)]
        out.append(sum(len(u) for u in units[i:i + take]))
        i, step = i + take, step + 1
    return out


def _wave_units(members: list[str], instances: dict, fleet_hosts: set[str], seen: set[str]) -> list[list[str]]:
    try:
        found = serving_instance.units([h for h in members if h in fleet_hosts and h not in seen], instances)
    except serving_instance.InstanceError as exc:
        raise WaveError(str(exc)) from None
    for unit in found:
        outside = [h for h in unit if h not in fleet_hosts]
        if outside:
            raise WaveError(f"the serving instance of {unit[0]} names {', '.join(outside)}, not in the "
                            "fleet (atlas_nodes): a rollout moves every rank of an instance together; "
                            "add the node(s) to atlas_nodes or fix serving_instances")
    return [u for u in found if not seen.intersection(u)]


def plan(waves: list[dict] | None, groups: dict[str, list[str]], fleet: str = "atlas_nodes",
         resume_from: str | None = None, branch_order: list[str] | None = None,
         batch: int | str = 1, serving_instances: dict | None = None) -> list[dict[str, Any]]:
    """Ordered waves of fleet hosts; waves before ``resume_from`` are marked ``skipped``."""
    if not waves:
        waves = default_waves(groups, branch_order, batch)
    fleet_hosts = set(groups.get(fleet, []))
    seen: set[str] = set()
    plan: list[dict[str, Any]] = []
    for i, wave in enumerate(waves):
        if not isinstance(wave, dict) or not wave.get("name"):
            raise WaveError(f"rollout_waves[{i}] must be a mapping with name and hosts, got {wave!r}")
        units = _wave_units(_members(wave, groups, i), serving_instances or {}, fleet_hosts, seen)
        hosts = [h for unit in units for h in unit]
        seen.update(hosts)
        if hosts:
            serial = wave.get("serial", batch)
            sizes = _units_per_batch(serial, len(units), i, str(wave["name"]))
            plan.append({"name": str(wave["name"]), "hosts": hosts, "serial": serial, "units": units,
                         "batches": _batches(units, sizes)})
    names = [w["name"] for w in plan]
    if len(set(names)) != len(names):
        raise WaveError(f"rollout wave names must be unique, got {names}")
    if len(plan) > MAX_WAVES:
        raise WaveError(f"{len(plan)} waves; playbooks/rollout.yml runs at most {MAX_WAVES}: "
                        "merge branches into waves in rollout_waves")
    if resume_from:
        if resume_from not in names:
            raise WaveError(f"rollout_resume_from {resume_from!r} is not a wave; waves: {', '.join(names)}")
        start = names.index(resume_from)
        for wave in plan[:start]:
            wave["skipped"] = True
    for i, wave in enumerate(plan, 1):
        wave["index"] = i
        wave.setdefault("skipped", False)
    return plan
