#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: paths
short_description: Directories and symbolic links of a stage in one call
version_added: "0.1.0"
description:
  - Brings every directory of I(directories) to exist with I(mode), I(owner) and I(group), in order
    (list parents first), and every link of I(links) to point at its target, replacing a link that
    points elsewhere (or a regular file) atomically.
  - One round trip to the node instead of one C(ansible.builtin.file) task per path.
  - Fails, naming the path and the fix, where a directory is wanted and something else is there, or a
    link is wanted where a directory is.
options:
  directories:
    description: Directories, parents before children.
    type: list
    elements: path
    default: []
  links:
    description: Links, as C(dest) (the link) and C(src) (what it points at, stored as given).
    type: list
    elements: dict
    default: []
  mode:
    description: Mode of the directories (octal string).
    type: str
    default: "0755"
  owner:
    description: Owner of the directories.
    type: str
    default: root
  group:
    description: Group of the directories.
    type: str
    default: root
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
author:
  - atlas-serving contributors
"""

EXAMPLES = r"""
- name: Configuration directories and the stable names through current
  atlas.serving.paths:
    directories: [/etc/atlas/serving, /etc/atlas/serving/releases]
    links:
      - {dest: /etc/atlas/serving/atlas-serving.env, src: current/atlas-serving.env}
"""

RETURN = r"""
actions:
  description: What was done (or, in check mode, would be), one line per action.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.paths import (  # noqa: E402
    PathError,
    apply,
    describe,
    ids,
    plan,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "path", "default": []},
            "links": {"type": "list", "elements": "dict", "default": []},
            "mode": {"type": "str", "default": "0755"},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg="mode {!r} is not an octal mode such as '0755'".format(p["mode"]))
    links = []
    for entry in p["links"]:
        if not isinstance(entry.get("dest"), str) or not isinstance(entry.get("src"), str):
            module.fail_json(msg=f"each link needs dest and src (strings), got {entry!r}")
        links.append((entry["dest"], entry["src"]))
    try:
        uid, gid = ids(p["owner"], p["group"])
        actions = plan(p["directories"], links, mode, uid, gid)
        if actions and not module.check_mode:
            apply(actions, mode, uid, gid)
    except (PathError, OSError) as exc:
        module.fail_json(msg=str(exc))
    lines = describe(actions)
    result = {"changed": bool(actions), "actions": lines}
    if module._diff and actions:
        result["diff"] = {"before": "", "after": "\n".join(lines) + "\n",
                          "before_header": "paths", "after_header": "paths"}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
