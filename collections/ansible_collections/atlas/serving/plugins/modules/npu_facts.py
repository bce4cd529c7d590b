#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: npu_facts
short_description: Ascend NPU facts from npu-smi
description:
  - Runs C(npu-smi info) and C(npu-smi info -t board -i <id>) for every NPU it lists, and returns the NPUs
    under C(ansible_facts.npu), with every NPU's board checked (Compatibility of the driver and firmware, the
    same versions on every NPU) in C(board_errors) and C(board_warnings).
  - When C(npu-smi) is absent or fails (driver not installed or not loaded) the module does not fail;
    C(present) is false and C(error) carries the reason, so a preflight can decide what to say.
version_added: 0.1.0
options: {}
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.module.facts
  - atlas.serving.npu_smi
"""

EXAMPLES = r"""
- name: Preflight | npu | read NPU facts
  atlas.serving.npu_facts:

- name: Preflight | npu | every NPU is healthy
  ansible.builtin.assert:
    that: ansible_facts.npu.present and ansible_facts.npu.health_ok
    fail_msg: "NPUs: {{ ansible_facts.npu.devices | map(attribute='health') | list }} {{ ansible_facts.npu.error }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    npu:
      description: NPU state.
      returned: always
      type: complex
      contains:
        present:
          description: npu-smi answered and listed at least one NPU.
          type: bool
        count:
          description: Number of NPU chips listed.
          type: int
        devices:
          description: One entry per chip.
          type: list
          elements: dict
          sample:
            - {id: 0, chip: 0, name: 910B3, health: OK, power_w: 101.8, temp_c: 43, aicore_pct: 0,
               hbm_used_mb: 3318, hbm_total_mb: 65536, memory_used_mb: 0, memory_total_mb: 0,
               bus_id: "0000:C1:00.0"}
        processes:
          description: Processes holding NPU memory ({npu, chip, pid, name, memory_mb}).
          type: list
          elements: dict
        version:
          description: npu-smi/driver version from the table header.
          type: str
          sample: 24.1.rc1.b030
        health_ok:
          description: Every NPU reports Health OK (false when none is present).
          type: bool
        hbm_total_mb:
          description: HBM of all NPUs, MB.
          type: int
          sample: 524288
        hbm_used_mb:
          description: HBM in use on all NPUs, MB.
          type: int
        board:
          description: C(npu-smi info -t board) of the first NPU as key/value strings (empty if it failed).
          type: dict
          sample: {"Software Version": "24.1.rc1", "Firmware Version": "7.5.0.1.129", "Compatibility": "OK",
                   "PCI Device ID": "0xD802"}
        npu_ids:
          description: The NPU ids C(npu-smi info) lists, each once, in its order.
          type: list
          elements: int
          sample: [0, 1, 2, 3, 4, 5, 6, 7]
        boards:
          description: C(npu-smi info -t board) of every NPU of I(npu_ids), in that order (empty where it failed).
          type: list
          elements: dict
        board_errors:
          description: >-
            What every NPU's board rules out, one message per finding naming the NPUs, the driver and firmware
            versions and the fix: Compatibility NOK (the firmware does not match the driver), or NPUs that do
            not run the same driver and firmware.
          type: list
          elements: str
          sample: ["NPU 0, 1: npu-smi info -t board says Compatibility NOK: the firmware does not match the driver
                    (driver 24.1.rc2 (Software Version), firmware 7.1.0.6.220 (Firmware Version)). Fix: install the
                    firmware of the driver's own HDK release (...), then reboot"]
        board_warnings:
          description: >-
            What was not judged: Compatibility UNKNOWN (a broken firmware installation, or firmware older than
            23.0.RC2), NOT SUPPORT (npu-smi not run as root), no Compatibility line, or a board that could not
            be read.
          type: list
          elements: str
        npu_smi_path:
          description: The npu-smi that was run, or null.
          type: str
        error:
          description: Why present is false; null otherwise.
          type: str
          sample: "/usr/local/bin/npu-smi info exited 255: dcmi module initialize failed. ret is -8005"
"""

# Imports follow the documentation blocks, as in ansible-core's modules.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.npu_smi import gather  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(npu_smi_path=dict(type="path")),
        supports_check_mode=True,
    )
    module.run_command_environ_update = dict(LANG="C", LC_ALL="C")

    def run(argv):
        return module.run_command(argv, handle_exceptions=False)

    facts = gather(run, module.params["npu_smi_path"])
    module.exit_json(changed=False, ansible_facts=dict(npu=facts))


if __name__ == "__main__":
    main()
