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
    C(cann-<version>) from 8.5, and every version installed side by side (C(versions)).
  - With I(release_dir) and I(service), also the CANN version each kept serving release pins (C(pins)).
options:
  release_dir:
    description: The serving releases' directory; each release's service record names the CANN it pins.
    type: path
  service:
    description: The serving service's name (the record is C(<release_dir>/<release>/<service>.json)).
    type: str
  managed_file:
    description: The suite's record of the CANN versions it installed (a JSON list); read into C(managed).
    type: path
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
        versions:
          description: >-
            Every CANN version installed side by side, by version: layout, version_dir, the installed version of
            toolkit, kernels and nnal (or null), set_env_scripts (that version's own environment scripts, which
            pin it whatever the links name), uninstall_scripts.
          type: dict
          sample: {"8.5.0": {layout: cann, toolkit: 8.5.0, kernels: 8.5.0, nnal: 8.5.0}}
        pins:
          description: >-
            With release_dir and service: pinned (release -> the CANN version its record names) and unknown
            (releases whose record names none; a container release pins none of the host's).
          type: dict
          returned: when release_dir and service are given
        managed:
          description: With managed_file, the CANN versions the suite installed (only these are ever pruned).
          type: list
          elements: str
          returned: when managed_file is given
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.cann import (  # noqa: E402
    DEFAULT_INSTALL_PATH,
    gather,
)


def main():
    module = AnsibleModule(
        argument_spec={"install_path": {"type": "path", "default": DEFAULT_INSTALL_PATH},
                       "release_dir": {"type": "path"}, "service": {"type": "str"},
                       "managed_file": {"type": "path"}},
        supports_check_mode=True,
    )
    p = module.params
    cann = gather(p["install_path"], release_dir=p["release_dir"], service=p["service"],
                  managed_file=p["managed_file"])
    module.exit_json(changed=False, ansible_facts={"cann": cann})


if __name__ == "__main__":
    main()
