"""Filters of multi-node serving instances (logic in module_utils/serving_instance.py; docs/multinode-serving.md).

``serving_rank``               serving_instances + host + hostvars + engine + release (+ NPUs per node) -> the
                               host's rank: instance, nodes, rank, head, mode, entry, flags, record (a host in no
                               instance of two or more nodes: instance none, no flags, empty record)
``serving_instance_problems``  serving_instances + hostvars (+ NPUs per node) -> what is wrong with them
``serving_entry_nodes``        hosts + serving_instances -> the hosts less the non-head ranks (they serve no HTTP)
``serving_unit``               host + serving_instances -> the nodes that roll out, roll back and restart with it,
                               in rank order ([host] for a host in no instance of two or more nodes)
``serving_unit_behind``        nodes + hostvars + fact + value + play hosts -> the nodes that did not reach a step
                               of this run (not in the play, or their fact is not the step's value)
``serving_comm_env``           the HCCL/Gloo/TP variables (atlas.serving.hccl_env) + engine -> those the engine reads
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import serving_instance


def serving_rank(serving_instances, host: str, hostvars, engine: str, release: str, npus_per_node=None) -> dict:
    try:
        return serving_instance.rank(str(host), serving_instances or {}, hostvars, str(engine), str(release),
                                     npus_per_node)
    except serving_instance.InstanceError as exc:
        raise AnsibleFilterError(f"{host}: {exc}") from None


def serving_instance_problems(serving_instances, hostvars, npus_per_node=None) -> list:
    return serving_instance.problems(serving_instances or {}, hostvars, default_npus=npus_per_node)


def serving_entry_nodes(hosts, serving_instances) -> list:
    return serving_instance.entry_nodes(list(hosts or []), serving_instances or {})


def serving_unit(host: str, serving_instances) -> list:
    try:
        return serving_instance.unit_of(str(host), serving_instances or {})
    except serving_instance.InstanceError as exc:
        raise AnsibleFilterError(str(exc)) from None


def serving_unit_behind(nodes, hostvars, mark: str, value: str, present) -> list:
    return serving_instance.behind(list(nodes or []), hostvars, str(mark), str(value), set(present or []))


def serving_comm_env(env: dict, engine: str) -> dict:
    return serving_instance.comm_env_for(str(engine), dict(env or {}))


class FilterModule:
    def filters(self):
        return {
            "serving_rank": serving_rank,
            "serving_instance_problems": serving_instance_problems,
            "serving_entry_nodes": serving_entry_nodes,
            "serving_comm_env": serving_comm_env,
            "serving_unit": serving_unit,
            "serving_unit_behind": serving_unit_behind,
        }
