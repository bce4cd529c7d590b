"""Filters of the cann role (logic in module_utils/cann.py).

``cann_plan``   installed versions (``ansible_facts.cann.versions``) + wanted version + components
                -> {actions: {component: none|install|upgrade}, removes, keeps_others, why}
``cann_prune``  installed versions + the kept releases' pins + versions to keep + the versions the suite installed
                -> {remove, held, why_not}
``cann_layout`` a CANN version -> ``cann`` (8.5+: cann-<v>) or ``ascend-toolkit`` (before: ascend-toolkit/<v>)
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils import cann


def cann_plan(versions: dict, wanted: str, components: list) -> dict:
    return cann.plan_versions(versions or {}, str(wanted), list(components))


def cann_prune(versions: dict, pins: dict, keep: list, managed: list) -> dict:
    return cann.prune_versions(versions or {}, pins or {}, [str(v) for v in keep], [str(v) for v in managed or []])


def cann_layout(version: str) -> str:
    return cann.layout_of(str(version))


class FilterModule:
    def filters(self):
        return {"cann_plan": cann_plan, "cann_prune": cann_prune, "cann_layout": cann_layout}
