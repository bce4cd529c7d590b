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
    C(cann-<version>) from 8.5, and every version installed side by side (C(versions)); the
    links and, before 8.5, the real directory C(ascend-toolkit/latest) are never taken for a version.
  - >-
    Records read (docs/ascend-platform.md names the source of each) are the toolkit's
    C(<arch>-linux/ascend_toolkit_install.info); the kernels' C(opp_kernel/version.info) before 8.5 (the release
    is C(version_dir), C(Version) the component build); the ops' C(<arch>-linux/ascend_ops_install.info) from 8.5
    (else C(share/info/<pkg>/version.info)); NNAL's C(nnal/atb/<v>/version.info) (indented C(Key : Value) lines,
    else the directory name); C(driver/version.info) and C(firmware/version.info).
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
            The toolkit the links name (the last installed): installed, layout (C(ascend-toolkit) or C(cann)),
            version, innerversion, arch, package_name, home (the link read through), version_dir, arch_dir,
            info_file, uninstall_script (C(<version_dir>/<arch>-linux/script/uninstall.sh)).
          type: dict
          sample: {installed: true, layout: ascend-toolkit, version: 8.3.RC1}
        kernels:
          description: >-
            Kernels (before 8.5) or ops (8.5+) package installed with that toolkit: installed, component
            (C(kernels) or C(ops)), version (the release), build (the kernels' component build), package_name
            (the ops record's; the kernels record names none), info_file, uninstall_script
            (C(opp_kernel/script/uninstall.sh), from 8.5 C(<arch>-linux/script/ops_uninstall.sh)).
          type: dict
          sample: {installed: true, component: ops, version: 9.1.0, package_name: Ascend-cann-910b-ops}
        nnal:
          description: >-
            NNAL (Ascend Transformer Boost) that C(nnal/atb/latest) names: installed, version, build, platform,
            home, info_file, uninstall_script (C(nnal/atb/<v>/scripts/uninstall.sh) before 8.5,
            C(nnal/nnal_uninstall.sh) from 8.5).
          type: dict
        driver:
          description: >-
            NPU driver from driver/version.info: installed, version (C(package_version), else C(Version)),
            package_version, info_file.
          type: dict
          sample: {installed: true, version: 24.1.rc2.2, package_version: 24.1.rc2.2}
        firmware:
          description: >-
            NPU firmware from firmware/version.info: installed, version (C(Version), the firmware build that names
            the firmware package), package_version (the HDK release), info_file.
          type: dict
          sample: {installed: true, version: 7.1.0.11.220, package_version: 23.0.7}
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
            toolkit, kernels (the ops package from 8.5) and nnal (or null), set_env_scripts (that version's own
            environment scripts, which pin it whatever the links name), uninstall_scripts (toolkit, kernels: the
            kernels' or ops' uninstaller, nnal: that version's own C(nnal/atb/<v>/scripts/uninstall.sh)).
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
