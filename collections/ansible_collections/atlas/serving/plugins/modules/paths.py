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
  - With I(prune), removes the files of a directory that match a pattern and are not among the
    I(files) and I(links) of this call (after they are written), the stale ones, in the same round trip.
  - Fails, naming the path and the fix, where a directory is wanted and something else is there, a
    link is wanted where a directory is, or a path I(prune) would remove is not a regular file or link.
options:
  prune:
    description:
      - Directories whose stale entries are removed, as C(path) (the directory) and C(pattern) (a
        glob on the name, default C(*)). An entry that matches, is not a I(files) or I(links) C(dest)
        of this call and does not start with a dot is removed; it must be a regular file or a link
        (anything else fails the task, named). A missing directory has nothing to remove.
    type: list
    elements: dict
    default: []
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.stage_paths
attributes:
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Configuration directories and the stable names through current
  atlas.serving.paths:
    directories: [/etc/atlas/serving, /etc/atlas/serving/releases]
    links:
      - {dest: /etc/atlas/serving/atlas-serving.env, src: current/atlas-serving.env}

- name: Backend files of the branch; those of nodes no longer in it are removed
  atlas.serving.paths:
    directories: [/etc/nginx/atlas-backends/east]
    files:
      - {dest: /etc/nginx/atlas-backends/east/n1.conf, content: "server 10.0.0.11:8000;\n"}
    prune:
      - {path: /etc/nginx/atlas-backends/east, pattern: "*.conf"}
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
removed:
  description: The paths I(prune) removed (or, in check mode, would remove).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.paths import (  # noqa: E402
    PathError,
    apply_prune,
    converge,
    describe,
    describe_files,
    describe_prune,
    file_diffs,
    file_entries,
    ids,
    inspect,
    plan_prune,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "path", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "inspect": {"type": "list", "elements": "path", "default": []},
            "links": {"type": "list", "elements": "dict", "default": []},
            "prune": {"type": "list", "elements": "dict", "default": []},
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
    rules = []
    for entry in p["prune"]:
        if not isinstance(entry.get("path"), str) or not isinstance(entry.get("pattern", "*"), str):
            module.fail_json(msg=f"each prune entry needs path (the directory) and pattern (a glob), got {entry!r}")
        rules.append((entry["path"], entry.get("pattern", "*")))
    try:
        inspected = inspect(p["inspect"])
        uid, gid = ids(p["owner"], p["group"])
        # check mode on a bare node: the account is created by an earlier task
        files = file_entries(p["files"], tolerate_unknown_owner=module.check_mode)
        dir_actions, file_actions, link_actions = converge(p["directories"], files, links, mode, uid, gid,
                                                           check=module.check_mode)
        prune_actions = plan_prune(rules, [dest for dest, *_rest in files] + [dest for dest, _src in links])
        if not module.check_mode:
            apply_prune(prune_actions)
    except (PathError, OSError) as exc:
        module.fail_json(msg=str(exc))
    lines = (describe(dir_actions) + describe_files(file_actions) + describe(link_actions)
             + describe_prune(prune_actions))
    written = [path for verb, path, _detail in file_actions if verb == "write"]
    result = {"changed": bool(lines), "actions": lines, "written": written, "inspected": inspected,
              "removed": [path for _verb, path, _pattern in prune_actions]}
    if module._diff and lines:
        listed = describe(dir_actions + link_actions) + describe_prune(prune_actions)
        diffs = [{"before": "", "after": "\n".join(listed) + "\n",
                  "before_header": "paths", "after_header": "paths"}] if listed else []
        result["diff"] = diffs + file_diffs(file_actions, files)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
