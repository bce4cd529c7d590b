#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: installer_copy
short_description: Copy installers from the bundle into a root-only directory and check the copies
version_added: "0.1.0"
description:
  - With O(state=present), copies each of O(files) from O(bundle_dir) into O(dest) (created 0700 root:root,
    or made so; every directory above it must be root's alone), hashes each copy and compares it with the
    sha256 of the bundle manifest O(manifest), whose own bytes must have O(manifest_sha256) (the manifest
    whose signature was verified in this run). A C(.zip) is unpacked from its checked copy into
    C(<dest>/<zip name without .zip>/), and each member the manifest records (C(<zip>!<member>)) is checked
    the same way. The caller runs the copies (RV(files[].run)), never the bundle's files, so a file swapped
    in the bundle after the check is never run.
  - Every file is copied and checked before the task returns; any missing, unlisted or mismatching file
    fails the task naming each one with both checksums, and removes what the task copied.
  - Each source file, its directory and every directory above it must be writable by root alone, as
    M(atlas.serving.root_only) judges them; otherwise the task fails naming them and the fix.
  - With O(state=absent), removes the copies of O(files) (and a zip's unpacked directory) from O(dest).
options:
  bundle_dir:
    description: The offline bundle on the node; O(files) are relative to it.
    type: path
  files:
    description: The files to copy, as the manifest names them (C(cann/<package>.run), C(hdk/<package>.run), a C(.zip)).
    type: list
    elements: str
    required: true
  dest:
    description: The root-only directory the copies are made in and run from.
    type: path
    required: true
  manifest:
    description: The bundle manifest. Default C(<bundle_dir>/manifest.json).
    type: path
  state:
    description: V(present) copies and checks; V(absent) removes the copies.
    type: str
    choices: [present, absent]
    default: present
notes:
  - Check mode copies nothing and reports no change (the copies are removed again after an install); with
    O(state=present) it checks the files where they are, so a bad package still fails the task.
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.trusted_manifest
"""

EXAMPLES = r"""
- name: CANN | copy the packages that will run and check the copies
  atlas.serving.installer_copy:
    bundle_dir: /srv/atlas-bundle
    files: [cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run]
    dest: /var/lib/atlas/cann
    manifest_sha256: "{{ atlas_bundle_manifest_sha256 }}"
  register: copies

- name: CANN | run the checked copy
  ansible.builtin.command:
    argv: [bash, "{{ copies.files[0].run }}", --install, --quiet]
  changed_when: true

- name: CANN | remove the copies
  atlas.serving.installer_copy:
    files: [cann/Ascend-cann-toolkit_8.3.RC1_linux-x86_64.run]
    dest: /var/lib/atlas/cann
    state: absent
"""

RETURN = r"""
files:
  description: One entry per file of O(files) (O(state=present)).
  returned: always
  type: list
  elements: dict
  contains:
    file:
      description: The file as the manifest names it.
      type: str
    src:
      description: The file in the bundle.
      type: str
    copy:
      description: The checked copy (empty in check mode).
      type: str
    sha256:
      description: The sha256 of the copy, the manifest's.
      type: str
    run:
      description: What to run, the copy or the C(.run) unpacked from a zipped copy (empty in check mode).
      type: str
removed:
  description: The paths removed (O(state=absent)); in check mode, those that would be.
  returned: always
  type: list
  elements: str
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.installer_copy import (  # noqa: E402
    CopyError,
    copy_checked,
    remove_copies,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "bundle_dir": {"type": "path"},
            "files": {"type": "list", "elements": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "manifest": {"type": "path"},
            "manifest_sha256": {"type": "str"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
        },
        required_if=[("state", "present", ["bundle_dir"])],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["state"] == "absent":
            removed = remove_copies(p["files"], p["dest"], check=module.check_mode)
            module.exit_json(changed=bool(removed), files=[], removed=removed)
        manifest = p["manifest"] or os.path.join(p["bundle_dir"], "manifest.json")
        copies, changed = copy_checked(p["bundle_dir"], p["files"], p["dest"], manifest, p["manifest_sha256"] or "",
                                       check=module.check_mode)
    except (CopyError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=changed, files=[c.as_dict() for c in copies], removed=[])


if __name__ == "__main__":
    main()
