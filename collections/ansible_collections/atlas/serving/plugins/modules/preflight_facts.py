#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: preflight_facts
short_description: Everything preflight reads from a node, in one call
description:
  - One round trip for what would otherwise be five (C(setup) with C(gather_subset=min), C(df),
    M(atlas.serving.npu_facts), M(atlas.serving.cann_facts), C(stat)). Changes nothing.
  - Sets C(ansible_facts.architecture), C(ansible_facts.python_version) and
    C(ansible_facts.service_mgr) with Ansible's own fact collectors (the values C(setup) gives),
    C(ansible_facts.npu) as M(atlas.serving.npu_facts) does and C(ansible_facts.cann) as
    M(atlas.serving.cann_facts) does.
  - Measures the free space of O(free_space) (statvfs, as C(df) does), whether the files of
    O(readable) can be read and whether the paths of O(exist) exist.
version_added: 0.1.0
options:
  free_space:
    description: Paths whose filesystem's free space is measured.
    type: list
    elements: path
    default: []
  readable:
    description: Files whose readability is checked.
    type: list
    elements: path
    default: []
  exist:
    description: Paths (files, directories, device nodes) whose existence is checked, links followed.
    type: list
    elements: path
    default: []
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.module.facts
  - atlas.serving.npu_smi
  - atlas.serving.cann
"""

EXAMPLES = r"""
- name: Preflight | read the node
  atlas.serving.preflight_facts:
    free_space: [/opt, /var/lib]
    readable: [/srv/atlas-bundle/manifest.json]
  register: node

- name: Preflight | room under /opt
  ansible.builtin.assert:
    that: node.free_gib['/opt'] >= 8
"""

RETURN = r"""
ansible_facts:
  description: architecture, python_version, service_mgr, npu and cann (see the modules named above).
  returned: always
  type: dict
free_gib:
  description: Free GiB per path of O(free_space) that could be measured.
  returned: always
  type: dict
  sample: {/opt: 120.5, /var/lib: 120.5}
install_path_free_gib:
  description: >-
    Free GiB of the filesystem that holds O(install_path) (its nearest existing directory when it is not made
    yet): where a CANN version installs beside the others.
  returned: always
  type: float
install_path_measured:
  description: The directory whose filesystem install_path_free_gib measured (or why it could not be measured).
  returned: always
  type: str
free_errors:
  description: Why a path of O(free_space) could not be measured.
  returned: always
  type: dict
  sample: {/data: /data does not exist on the node}
readable:
  description: For each file of O(readable), whether it is a regular file that can be read.
  returned: always
  type: dict
exist:
  description: For each path of O(exist), whether it exists.
  returned: always
  type: dict
  sample: {/usr/local/dcmi: true, /dev/davinci_manager: true}
"""

import platform  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.facts.system.platform import PlatformFactCollector  # noqa: E402
from ansible.module_utils.facts.system.service_mgr import ServiceMgrFactCollector  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.cann import DEFAULT_INSTALL_PATH  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.cann import gather as cann_gather  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.node_facts import (  # noqa: E402
    exist,
    free_gib,
    free_gib_where,
    readable,
)
from ansible_collections.atlas.serving.plugins.module_utils.npu_smi import gather as npu_gather  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            npu_smi_path=dict(type="path"),
            install_path=dict(type="path", default=DEFAULT_INSTALL_PATH),
            free_space=dict(type="list", elements="path", default=[]),
            readable=dict(type="list", elements="path", default=[]),
            exist=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    module.run_command_environ_update = dict(LANG="C", LC_ALL="C")
    plat = PlatformFactCollector().collect(module=module)
    svc = ServiceMgrFactCollector().collect(module=module, collected_facts={"ansible_system": plat.get("system")})
    facts = dict(
        architecture=plat.get("architecture") or platform.machine(),
        python_version=plat.get("python_version") or platform.python_version(),
        service_mgr=svc.get("service_mgr"),
        npu=npu_gather(lambda argv: module.run_command(argv, handle_exceptions=False), p["npu_smi_path"]),
        cann=cann_gather(p["install_path"]),
    )
    free, errors = free_gib(p["free_space"])
    install_free, install_where = free_gib_where(p["install_path"])
    module.exit_json(changed=False, ansible_facts=facts, free_gib=free, free_errors=errors,
                     install_path_free_gib=install_free, install_path_measured=install_where,
                     readable=readable(p["readable"]), exist=exist(p["exist"]))


if __name__ == "__main__":
    main()
