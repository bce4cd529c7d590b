#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: cann_facts
short_description: Facts about the installed Ascend CANN stack, driver and firmware
version_added: "0.1.0"
description:
  - Reads the version records that Huawei's installers write and returns them under
    C(ansible_facts.cann). Changes nothing.
  - Knows both toolkit layouts, C(ascend-toolkit/<version>) before CANN 8.5 and
    C(cann-<version>) from 8.5.
options: {}
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.module.facts
  - atlas.serving.cann
"""

EXAMPLES = r"""
- name: Read the CANN stack
  atlas.serving.cann_facts:

- name: Show the toolkit version
  ansible.builtin.debug:
    msg: "{{ ansible_facts.cann.toolkit.version | default('none') }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    cann:
      description: The Ascend stack under I(install_path).
      returned: always
      type: dict
      contains:
        install_path:
          description: The root that was read.
          type: str
          sample: /usr/local/Ascend
        host_arch:
          description: The node's CPU architecture (C(uname -m)).
          type: str
          sample: x86_64
        toolkit:
          description: >-
            Installed toolkit: installed, layout (C(ascend-toolkit) or C(cann)), version,
            innerversion, arch, package_name, home, version_dir, info_file, uninstall_script.
          type: dict
          sample: {installed: true, layout: ascend-toolkit, version: 8.3.RC1}
        kernels:
          description: Kernels (before 8.5) or ops (8.5+) package, installed, version, package_name, soc_version.
          type: dict
        nnal:
          description: NNAL (Ascend Transformer Boost), installed, version, home, uninstall_script.
          type: dict
        driver:
          description: NPU driver from driver/version.info, installed and version.
          type: dict
          sample: {installed: true, version: 24.1.rc1}
        firmware:
          description: NPU firmware from firmware/version.info, installed and version.
          type: dict
        set_env_scripts:
          description: Every set_env.sh of the stack that exists.
          type: list
          elements: str
        serving_set_env_scripts:
          description: >-
            The set_env.sh scripts a serving process sources, in order (toolkit, then NNAL);
            with the 8.5 layout the compatibility script ascend-toolkit/set_env.sh is left out.
          type: list
          elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.cann import (  # noqa: E402
    DEFAULT_INSTALL_PATH,
    gather,
)


def main():
    module = AnsibleModule(
        argument_spec={"install_path": {"type": "path", "default": DEFAULT_INSTALL_PATH}},
        supports_check_mode=True,
    )
    module.exit_json(changed=False, ansible_facts={"cann": gather(module.params["install_path"])})


if __name__ == "__main__":
    main()
