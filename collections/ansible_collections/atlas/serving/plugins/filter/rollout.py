"""Rollout wave plan of the atlas.serving collection.

``rollout_plan``  inventory groups + wave data (+ serving_instances) -> ordered waves
                  [{name, hosts, serial, units, batches}]
``release_id_problem``  atlas_release_id -> '' or why it cannot name a release (plugin_utils/release_id.py)
``rollout_evidence_nodes``  hostvars + the plan (+ hosts that dropped out of the play) -> each planned
                  node's part of the evidence record, picked by name, secrets withheld
                  (module_utils/evidence.py, docs/evidence.md)
``rollout_evidence_dir``  inventory source + start time + release + root -> where the run's evidence pack goes

The waves' logic: plugin_utils/rollout_waves.py (shared with ``atlasctl rollout --plan``).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import evidence
from ansible_collections.atlas.serving.plugins.plugin_utils import release_id, rollout_waves

MAX_WAVES = rollout_waves.MAX_WAVES


def rollout_plan(waves: list[dict] | None, groups: dict[str, list[str]], fleet: str = "atlas_nodes",
                 resume_from: str | None = None, branch_order: list[str] | None = None,
                 batch: int | str = 1, serving_instances: dict | None = None) -> list[dict[str, Any]]:
    """Ordered waves of fleet hosts; waves before ``resume_from`` are marked ``skipped``."""
    try:
        return rollout_waves.plan(waves, groups, fleet, resume_from, branch_order, batch, serving_instances)
    except rollout_waves.WaveError as exc:
        raise AnsibleFilterError(str(exc)) from None


def release_id_problem(value: Any) -> str:
    """'' when ``value`` is a release id (plugin_utils/release_id.py), else why not: the serving role's assert."""
    return release_id.problem(value)


def rollout_evidence_nodes(hostvars: Any, plan: list, dropped: list | None = None) -> list[dict]:
    return evidence.nodes(hostvars, plan, dropped)


def rollout_evidence_dir(inventory: str, started_at: str, release: str, root: str) -> str:
    return evidence.pack_dir(root, inventory, started_at, release)


class FilterModule:
    def filters(self):
        return {"rollout_plan": rollout_plan, "release_id_problem": release_id_problem,
                "rollout_evidence_nodes": rollout_evidence_nodes, "rollout_evidence_dir": rollout_evidence_dir}
