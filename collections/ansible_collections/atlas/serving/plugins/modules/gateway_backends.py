#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gateway_backends
short_description: Refuse to drain a branch's last healthy backend
version_added: "0.1.0"
description:
  - Runs on a branch gateway. Reads the branch's backend include files (one per serving node,
    written by the gateway role) and asks C(/health) of every enabled backend but I(node).
  - Succeeds at once when I(node) is already drained (or has no backend file), since it takes no traffic.
  - Otherwise succeeds as soon as another backend is enabled and healthy, polling for at most I(wait_s);
    fails otherwise with a message naming the branch, the gateway, every node's state and the fix.
  - With I(last_backend_guard=false) it only reads every backend's state and whether I(node) is drained.
  - Changes nothing.
options:
  branch:
    description: The branch name (for the message).
    type: str
    required: true
  branch_dir:
    description: The branch's backend directory, C(<gateway_backend_dir>/<branch>).
    type: path
    required: true
  gateway:
    description: The gateway's inventory name (for the message).
    type: str
    default: this gateway
  node:
    description: The node about to be drained.
    type: str
    required: true
  last_backend_guard:
    description: Check that another backend serves; false reads the backends' states only and checks nothing.
    type: bool
    default: true
  wait_s:
    description: Seconds to wait for another healthy backend before refusing.
    type: int
    default: 120
  probe_timeout_s:
    description: Seconds one C(/health) request may take.
    type: float
    default: 2.0
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: Another backend of the branch serves before atlas-n1 is drained
  atlas.serving.gateway_backends:
    branch: east
    branch_dir: /etc/nginx/atlas-backends/east
    node: atlas-n1
  delegate_to: atlas-gw-east
"""

RETURN = r"""
backends:
  description: Every backend of the branch (node, address, port, enabled, healthy, detail).
  returned: always
  type: list
  elements: dict
serving:
  description: The other backends that are enabled and healthy.
  returned: always
  type: list
  elements: str
drained:
  description: Whether I(node) takes no traffic (drained, or no backend file); then nothing was checked.
  returned: always
  type: bool
waited_s:
  description: Seconds spent waiting.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.gateway import (  # noqa: E402
    read_backends,
    refusal,
    takes_traffic,
    wait_for_another,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "branch": {"type": "str", "required": True},
            "branch_dir": {"type": "path", "required": True},
            "gateway": {"type": "str", "default": "this gateway"},
            "node": {"type": "str", "required": True},
            "wait_s": {"type": "int", "default": 120},
            "probe_timeout_s": {"type": "float", "default": 2.0},
            "last_backend_guard": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        backends = read_backends(p["branch_dir"])
        if not p["last_backend_guard"]:
            module.exit_json(changed=False, backends=[b.as_dict() for b in backends], serving=[], waited_s=0.0,
                             drained=not takes_traffic(backends, p["node"]))
        if not takes_traffic(backends, p["node"]):
            # Already drained (or not in the upstream): no request reaches it, nothing to check.
            module.exit_json(changed=False, backends=[b.as_dict() for b in backends], serving=[],
                             waited_s=0.0, drained=True)
        serving, backends, waited = wait_for_another(p["branch_dir"], p["node"], p["wait_s"],
                                                     probe_timeout=p["probe_timeout_s"])
    except OSError as exc:
        module.fail_json(msg="{}: cannot read the backends of branch {}: {}".format(p["branch_dir"], p["branch"], exc))
    result = {"changed": False, "backends": [b.as_dict() for b in backends],
              "serving": [b.node for b in serving], "waited_s": round(waited, 1), "drained": False}
    if not serving:
        module.fail_json(msg=refusal(p["branch"], p["gateway"], p["node"], backends, waited), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
