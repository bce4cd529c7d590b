#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: root_only
short_description: Refuse a directory tree that a user other than root can change
version_added: "0.1.0"
description:
  - Fails when a user other than root can change O(path), anything under it or any directory above it
    (as written and as resolved through links); such a user could swap a file between the check that
    a stage makes and its use. Every one of those paths must be owned by root and writable by neither
    its group nor others. A directory above O(path) that others may write but that has the sticky bit
    (C(/tmp)) is accepted, since only an entry's owner may rename or remove the entry there.
  - Under O(path), a symbolic link or special file fails the task too (a bundle holds none).
  - The failure names every such path with its owner, group and mode, and the commands that fix them
    (C(chown -R root:root) and C(chmod -R go-w) of the tree, C(chown root:root) and C(chmod go-w) of a
    directory above it).
  - Read-only; C(changed) is always false.
options:
  path:
    description: The directory tree to judge (the offline bundle on the node).
    type: path
    required: true
  name:
    description: What O(path) is, for the failure message (C(bundle)).
    type: str
    default: ""
  hint:
    description: A last sentence for the failure message (how the tree is meant to get there).
    type: str
    default: ""
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: Only root can change the bundle
  atlas.serving.root_only:
    path: /srv/atlas-bundle
    name: bundle
    hint: atlasctl bundle push copies a bundle so.
"""

RETURN = r"""
checked:
  description: The tree judged, resolved.
  returned: always
  type: str
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.root_only import describe, tree_problems  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "name": {"type": "str", "default": ""},
            "hint": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        problems = tree_problems(p["path"])
    except OSError as exc:
        module.fail_json(msg=f"{exc.filename or p['path']}: {exc.strerror}")
    if problems:
        module.fail_json(msg=describe(problems, p["path"], p["name"], p["hint"]))
    module.exit_json(changed=False, checked=os.path.realpath(p["path"]))


if __name__ == "__main__":
    main()
