#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: paths
short_description: Directories, files and symbolic links of a stage in one call
version_added: "0.1.0"
description:
  - Brings every directory of I(directories) to exist with I(mode), I(owner) and I(group), in order
    (list parents first), then every file of I(files) to its content, mode and owner (written
    atomically, only when it differs), then every link of I(links) to point at its target, replacing
    a link that points elsewhere (or a regular file) atomically.
  - One round trip to the node instead of one C(ansible.builtin.file) task per path and two per
    unchanged C(template) or C(copy). Render templates on the controller (C(lookup('template', ...)))
    and pass the content. A task that writes secrets sets C(no_log), as it would for C(template).
  - Fails, naming the path and the fix, where a directory is wanted and something else is there, or a
    link is wanted where a directory is.
options:
  directories:
    description: Directories, parents before children.
    type: list
    elements: path
    default: []
  files:
    description:
      - Files, as C(dest), C(content) (text), C(mode) (octal string, default C(0644)), C(owner) and
        C(group) (default C(root)). Their directories must exist (list them in I(directories)).
    type: list
    elements: dict
    default: []
  inspect:
    description:
      - Paths to read before any change (a link's target, not followed), returned as I(inspected);
        what a stage needs to know about paths it does not manage, in the same round trip.
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
inspected:
  description: For each path of I(inspect), C(exists) and C(link) (its target, or null when it is not a link).
  returned: always
  type: dict
written:
  description: The files of I(files) whose content was (or, in check mode, would be) written.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.paths import (  # noqa: E402
    PathError,
    converge,
    describe,
    describe_files,
    file_diffs,
    ids,
    inspect,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "path", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "inspect": {"type": "list", "elements": "path", "default": []},
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
        inspected = inspect(p["inspect"])
        uid, gid = ids(p["owner"], p["group"])
        files = []
        for entry in p["files"]:
            if not isinstance(entry.get("dest"), str) or not isinstance(entry.get("content"), str):
                module.fail_json(msg="each file needs dest and content (strings), got dest "
                                     f"{entry.get('dest')!r}")
            raw = entry.get("mode", "0644")
            try:
                fmode = raw if isinstance(raw, int) else int(str(raw), 8)  # an int: YAML read 0644 already
            except ValueError:
                module.fail_json(msg=f"{entry['dest']}: mode {raw!r} is not an octal mode such as '0644'")
            try:
                fuid, fgid = ids(entry.get("owner", "root"), entry.get("group", "root"))
            except PathError:
                if not module.check_mode:
                    raise
                fuid, fgid = -1, -1  # check mode on a bare node: the account is created by an earlier task
            files.append((entry["dest"], entry["content"].encode("utf-8"), fmode, fuid, fgid))
        dir_actions, file_actions, link_actions = converge(p["directories"], files, links, mode, uid, gid,
                                                           check=module.check_mode)
    except (PathError, OSError) as exc:
        module.fail_json(msg=str(exc))
    lines = describe(dir_actions) + describe_files(file_actions) + describe(link_actions)
    written = [path for verb, path, _ in file_actions if verb == "write"]
    result = {"changed": bool(lines), "actions": lines, "written": written, "inspected": inspected}
    if module._diff and lines:
        diffs = [{"before": "", "after": "\n".join(describe(dir_actions + link_actions)) + "\n",
                  "before_header": "paths", "after_header": "paths"}] if dir_actions or link_actions else []
        result["diff"] = diffs + file_diffs(file_actions, files)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
