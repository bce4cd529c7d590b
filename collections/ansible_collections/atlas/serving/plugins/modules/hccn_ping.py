#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hccn_ping
short_description: Ping every address of the other nodes of an instance from every local NPU (hccn_tool -ping)
description:
  - For each local NPU of I(devices) and each address of I(targets) runs
    C(hccn_tool -i N -ping -g address A); a pair is reachable when the tool exits 0 and prints a loss line
    with C(0.00% packet loss) (docs/npu-network.md).
  - One ping at a time per local NPU, the local NPUs in parallel (I(workers)); I(workers=1) runs every
    ping one after another.
  - Fails when a pair is unreachable, naming both nodes, both NPUs and the tool's loss line. Read-only,
    runs in check mode too.
version_added: 0.1.0
options:
  node:
    description: This node's name, as the messages give it.
    type: str
    required: true
  devices:
    description: Local NPU ids to ping from.
    type: list
    elements: int
    required: true
  targets:
    description: The peers' addresses, each C(node), C(device) (NPU id) and C(address).
    type: list
    elements: dict
    required: true
  workers:
    description: How many local NPUs ping at the same time.
    type: int
    default: 8
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.hccn_tool
"""

EXAMPLES = r"""
- name: NPU network | all pairs of instance ds-v3
  atlas.serving.hccn_ping:
    node: atlas-n1
    devices: [0, 1, 2, 3, 4, 5, 6, 7]
    targets:
      - {node: atlas-n2, device: 0, address: 10.20.0.20}
      - {node: atlas-n2, device: 1, address: 10.20.0.21}
"""

RETURN = r"""
pairs:
  description: Every pair pinged, with C(ok), C(rc) and C(loss_line).
  returned: always
  type: list
  elements: dict
failed_pairs:
  description: The unreachable pairs, one line each naming both nodes, both NPUs and the loss line.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import hccn  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type="str", required=True),
            devices=dict(type="list", elements="int", required=True),
            targets=dict(type="list", elements="dict", required=True),
            workers=dict(type="int", default=8),
            hccn_tool_path=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    module.run_command_environ_update = dict(LANG="C", LC_ALL="C")
    p = module.params
    bad = [t for t in p["targets"] if not isinstance(t.get("address"), str) or not isinstance(t.get("node"), str)]
    if bad:
        module.fail_json(msg=f"each target needs node and address (strings), got {bad[0]!r}")
    tool = hccn.find_tool(p["hccn_tool_path"])
    if tool is None:
        module.fail_json(msg=hccn.tool_missing(p["hccn_tool_path"]))

    def run(argv):
        return module.run_command(argv, handle_exceptions=False)

    pairs = hccn.ping_all(run, tool, hccn.ping_pairs(p["node"], p["devices"], p["targets"]), p["workers"])
    failed = [hccn.describe_pair(x) for x in pairs if not x["ok"]]
    if failed:
        module.fail_json(msg=f"{len(failed)} of {len(pairs)} NPU pairs unreachable: " + "; ".join(failed),
                         pairs=pairs, failed_pairs=failed)
    module.exit_json(changed=False, pairs=pairs, failed_pairs=[])


if __name__ == "__main__":
    main()
