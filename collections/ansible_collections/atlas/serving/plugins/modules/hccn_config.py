#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hccn_config
short_description: Configure the Ascend NPU network ports with hccn_tool and /etc/hccn.conf
description:
  - Reads every NPU back first (C(hccn_tool -i N -ip -g), C(-gateway -g), C(-netdetect -g), C(-tls -g)) and
    runs only the set commands whose value differs (C(-ip -s address A netmask M), C(-gateway -s gateway G),
    C(-netdetect -s address D), C(-tls -s enable 0|1)), per NPU in that order; then writes I(conf_path)
    (atomically) when its C(address_N), C(netmask_N), C(netdetect_N), C(gateway_N), C(send_arp_status_N)
    keys differ, keeping every other line; then reads back again and fails naming what still differs.
  - When nothing differs, C(changed=false) and nothing runs. Check mode reads only and reports the commands and
    the file's diff (with C(--diff)). Sources of every command are in docs/npu-network.md.
version_added: 0.1.0
options:
  addresses:
    description: One IPv4 address per NPU; the index is the NPU id.
    type: list
    elements: str
    required: true
  netmask:
    description: Netmask of the NPU subnet.
    type: str
    required: true
  gateway:
    description: Gateway of the NPU subnet.
    type: str
    required: true
  netdetect:
    description: Address each NPU probes for its net health. Default is I(gateway).
    type: str
  tls_enable:
    description: TLS switch of every NPU (0 or 1). Not set leaves it as it is.
    type: int
    choices: [0, 1]
  conf_path:
    description: The NPU network configuration file.
    type: path
    default: /etc/hccn.conf
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.hccn_tool
attributes:
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: NPU network | configure the NPU ports
  atlas.serving.hccn_config:
    addresses: [10.20.0.10, 10.20.0.11, 10.20.0.12, 10.20.0.13, 10.20.0.14, 10.20.0.15, 10.20.0.16, 10.20.0.17]
    netmask: 255.255.255.0
    gateway: 10.20.0.1
    tls_enable: 0
"""

RETURN = r"""
changes:
  description: What differed, one line per NPU and setting (empty when nothing did).
  returned: always
  type: list
  elements: str
  sample: ["NPU 0 ip: unset -> 10.20.0.10/255.255.255.0", "NPU 0 gateway: unset -> 10.20.0.1"]
commands:
  description: The hccn_tool commands run (in check mode, that would run).
  returned: always
  type: list
  elements: str
conf_changed:
  description: Whether the configuration file's NPU keys differed.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import hccn  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            addresses=dict(type="list", elements="str", required=True),
            netmask=dict(type="str", required=True),
            gateway=dict(type="str", required=True),
            netdetect=dict(type="str"),
            tls_enable=dict(type="int", choices=[0, 1]),
            conf_path=dict(type="path", default=hccn.CONF_PATH),
            hccn_tool_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    module.run_command_environ_update = dict(LANG="C", LC_ALL="C")
    p = module.params
    tool = hccn.find_tool(p["hccn_tool_path"])
    if tool is None:
        module.fail_json(msg=hccn.tool_missing(p["hccn_tool_path"]))
    wanted = hccn.wanted_devices(p["addresses"], p["netmask"], p["gateway"], p["netdetect"])

    def run(argv):
        return module.run_command(argv, handle_exceptions=False)

    try:
        result = hccn.configure(run, tool, wanted, p["tls_enable"], p["conf_path"], module.check_mode)
    except (hccn.HccnError, OSError) as exc:
        module.fail_json(msg=str(exc))
    diff = result.pop("diff")
    if module._diff and result["conf_changed"]:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
