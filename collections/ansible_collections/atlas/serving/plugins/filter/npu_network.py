"""Filters of the NPU network stage and of multi-node serving (logic in module_utils/npu_network.py,
module_utils/hccn.py and module_utils/comm_env.py).

``npu_network_instances``  serving_instances + host -> the host's instances of two or more nodes
``npu_network_problems``   hostvars + host + serving_instances -> what is wrong with the stage's inputs
``npu_network_targets``    an instance + host + hostvars -> every NPU address of its other nodes
``hccn_verify_problems``   hccn facts' devices + host + the wanted ports -> link, health, address problems
``hccl_env``               a node's facts (+ interface, address, overrides) -> HCCL_IF_IP and the *_SOCKET_IFNAME
``hccl_env_problems``      those variables + host + the node's facts -> each one naming what the node lacks
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import comm_env, hccn, npu_network


def npu_network_instances(serving_instances, host: str) -> list:
    return npu_network.multi_node_instances(host, serving_instances)


def npu_network_problems(hostvars, host: str, serving_instances, npu_count=None) -> list:
    return npu_network.problems(host, hostvars, serving_instances, npu_count)


def npu_network_targets(instance: dict, host: str, hostvars) -> list:
    return npu_network.ping_targets(host, instance, hostvars)


def hccn_verify_problems(devices: list, host: str, addresses: list, netmask: str, gateway: str,
                         netdetect: str = "", tls_enable=None) -> list:
    wanted = hccn.wanted_devices(addresses, netmask, gateway, netdetect or None)
    return hccn.verify_problems(host, devices, wanted, tls_enable)


def hccl_env(facts: dict, interface: str = "", address: str = "", overrides: dict | None = None) -> dict:
    try:
        return comm_env.render(facts, interface or None, address or None, overrides or {})
    except comm_env.CommEnvError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def hccl_env_problems(env: dict, host: str, facts: dict) -> list:
    return comm_env.problems(host, env, facts)


class FilterModule:
    def filters(self):
        return {
            "npu_network_instances": npu_network_instances,
            "npu_network_problems": npu_network_problems,
            "npu_network_targets": npu_network_targets,
            "hccn_verify_problems": hccn_verify_problems,
            "hccl_env": hccl_env,
            "hccl_env_problems": hccl_env_problems,
        }
