#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hccn_facts
short_description: Ascend NPU network port facts from hccn_tool
description:
  - For each NPU runs the read-only C(hccn_tool -i N) gets C(-ip -g), C(-netdetect -g), C(-gateway -g),
    C(-link -g), C(-net_health -g) and C(-tls -g), NPUs in parallel, and returns them under
    C(ansible_facts.hccn). Commands and output formats with their sources are in docs/npu-network.md.
  - When C(hccn_tool) is absent the module does not fail; C(present) is false and C(error) says why.
    A get that fails leaves its fields null and is listed in that NPU's C(errors).
version_added: 0.1.0
options:
  devices:
    description:
      - NPU ids to read. Default is every NPU C(npu-smi info) lists.
    type: list
    elements: int
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.module.facts
  - atlas.serving.hccn_tool
"""

EXAMPLES = r"""
- name: NPU network | read the NPU ports
  atlas.serving.hccn_facts:
    devices: [0, 1, 2, 3, 4, 5, 6, 7]

- name: NPU network | every link is up
  ansible.builtin.assert:
    that: ansible_facts.hccn.links_up
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    hccn:
      description: NPU network ports.
      returned: always
      type: complex
      contains:
        present:
          description: hccn_tool was found.
          type: bool
        hccn_tool:
          description: The hccn_tool that was run, or null.
          type: str
        count:
          description: Number of NPUs read.
          type: int
        devices:
          description: One entry per NPU read; a value the tool did not print is null.
          type: list
          elements: dict
          sample:
            - {id: 0, address: 10.20.0.10, netmask: 255.255.255.0, netdetect: 10.20.0.1, gateway: 10.20.0.1,
               link: UP, net_health: Success, tls: 0, errors: []}
        links_up:
          description: Every NPU read has link status UP (false when none was read).
          type: bool
        health_ok:
          description: Every NPU read has net health status Success (false when none was read).
          type: bool
        tls_switches:
          description: The distinct TLS switch values read (one value when the node is consistent).
          type: list
          elements: int
        error:
          description: Why present is false; null otherwise.
          type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import hccn, npu_smi  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(devices=dict(type="list", elements="int"), hccn_tool_path=dict(type="path")),
        supports_check_mode=True,
    )
    module.run_command_environ_update = dict(LANG="C", LC_ALL="C")

    def run(argv):
        return module.run_command(argv, handle_exceptions=False)

    devices = module.params["devices"]
    if devices is None:
        devices = [d["id"] for d in npu_smi.gather(run, read_boards=False)["devices"]]  # the ids only: no board
    facts = hccn.gather(run, devices, module.params["hccn_tool_path"])
    module.exit_json(changed=False, ansible_facts=dict(hccn=facts))


if __name__ == "__main__":
    main()
