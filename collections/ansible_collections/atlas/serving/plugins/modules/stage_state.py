#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stage_state
short_description: Prove in one read-only call that a stage is converged (a stage's fast path)
version_added: "0.1.0"
description:
  - Reads, without changing anything, what a stage's full tasks would bring to a state and lists
    every difference; C(converged) is true only when there is none. A role runs it first and skips
    its node tasks when the stage is converged, and runs them all otherwise (DESIGN.md, "Fast paths").
  - I(account) is what C(ansible.builtin.group) (system) and C(ansible.builtin.user) (that primary
    group, I(shell), I(home) created, password field, supplementary I(groups) appended where the node
    has them) ensure. I(directories), I(files), I(links),
    I(mode), I(owner) and I(group) are compared as C(atlas.serving.paths) compares them (the same
    code). I(expect_links) are links the stage reads but does not manage. I(prune_oldest) is a
    prune of the oldest directories by mtime that must have nothing to remove. I(unit) must be
    loaded, enabled and active.
  - Set C(no_log) when I(files) carry secrets, as for C(paths); the differences name paths, never
    content.
options:
  account:
    description: C(user), C(group), C(shell), C(home), C(password) (the field in /etc/shadow, default C(!)) and
      C(groups) (supplementary groups the user must be in, each one only when it exists on the node; default none).
    type: dict
  expect_links:
    description: Links read, not managed, as C(path) and C(target) (null where the path must not be a link).
    type: list
    elements: dict
    default: []
  prune_oldest:
    description:
      - C(path) (a directory), C(keep) (how many of its newest subdirectories by mtime stay) and
        C(protect) (names kept whatever their age); any other subdirectory from index C(keep) on is a difference.
    type: dict
  unit:
    description: A systemd unit that must be loaded, enabled and active (so not failed).
    type: str
  mirror:
    description:
      - C(source) and C(dest) directories; C(dest) must be what C(rsync --recursive --times --delete
        source/ dest/) leaves, so that rsync would itemize nothing (its quick check compares size and mtime).
      - With C(file_mode) and C(dir_mode) (octal strings, as C(--perms --chmod=D<dir_mode>,F<file_mode>) sets
        them), an entry of another mode is a difference too.
    type: dict
  verified:
    description:
      - Trees that C(atlas.serving.model_verify) with these options (C(path), C(manifest),
        C(checksum_files), C(prefix), C(manifest_sha256), C(allow_extra), C(stamp_file)) would pass
        without reading a file or writing its stamp file; no file is read.
    type: list
    elements: dict
    default: []
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.stage_paths
"""

EXAMPLES = r"""
- name: Serving | state | a converged atlas-serving
  atlas.serving.stage_state:
    account: {user: atlas-serving, group: atlas-serving, shell: /usr/sbin/nologin, home: /var/lib/atlas/serving}
    directories: [/etc/atlas/serving]
    links:
      - {dest: /etc/atlas/serving/atlas-serving.env, src: current/atlas-serving.env}
    prune_oldest: {path: /etc/atlas/serving/releases, keep: 3, protect: [bank-2026.12.0]}
    unit: atlas-serving
  register: serving_state
"""

RETURN = r"""
converged:
  description: True when nothing differs from the wanted state.
  returned: always
  type: bool
differences:
  description: What differs, one line each (paths and names only, never file content).
  returned: always
  type: list
  elements: str
inspected:
  description: For each path of I(inspect), C(exists) and C(link), as C(atlas.serving.paths) returns them.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.paths import inspect  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.stage_state import (  # noqa: E402
    account_differences,
    mirror_differences,
    oldest_to_prune,
    path_differences,
    unit_differences,
    verified_differences,
)

VERIFIED_KEYS = ("path", "manifest", "checksum_files", "prefix", "manifest_sha256", "allow_extra", "stamp_file")


def main():
    module = AnsibleModule(
        argument_spec={
            "account": {"type": "dict"},
            "directories": {"type": "list", "elements": "path", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "links": {"type": "list", "elements": "dict", "default": []},
            "mode": {"type": "str", "default": "0755"},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "expect_links": {"type": "list", "elements": "dict", "default": []},
            "inspect": {"type": "list", "elements": "path", "default": []},
            "prune_oldest": {"type": "dict"},
            "unit": {"type": "str"},
            "mirror": {"type": "dict"},
            "verified": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    p = module.params
    try:
        mode = int(p["mode"], 8)
    except ValueError:
        module.fail_json(msg="mode {!r} is not an octal mode such as '0755'".format(p["mode"]))
    for key, fields in (("links", ("dest", "src")), ("expect_links", ("path",))):
        for entry in p[key]:
            if not all(isinstance(entry.get(f), str) for f in fields):
                module.fail_json(msg=f"each entry of {key} needs {' and '.join(fields)} (strings), got {entry!r}")
    inspected = inspect(p["inspect"])
    differences = []
    account = p["account"]
    if account is not None:
        missing = [k for k in ("user", "group", "shell", "home") if not isinstance(account.get(k), str)]
        if missing:
            module.fail_json(msg=f"account needs {', '.join(missing)} (strings), got {account!r}")
        groups = account.get("groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            module.fail_json(msg=f"account groups must be a list of group names, got {groups!r}")
        differences += account_differences(account["user"], account["group"], account["shell"], account["home"],
                                           account.get("password", "!"), groups=groups)
    differences += path_differences(p["directories"], p["files"], [(e["dest"], e["src"]) for e in p["links"]],
                                    mode, p["owner"], p["group"],
                                    [(e["path"], e.get("target")) for e in p["expect_links"]])
    prune = p["prune_oldest"]
    if prune is not None:
        if not isinstance(prune.get("path"), str) or not str(prune.get("keep", "")).isdigit():
            module.fail_json(msg=f"prune_oldest needs path (a directory) and keep (a count), got {prune!r}")
        differences += [f"{path} would be pruned (not among the newest {prune['keep']})"
                        for path in oldest_to_prune(prune["path"], int(prune["keep"]), prune.get("protect") or [])]
    mirror = p["mirror"]
    if mirror is not None:
        if not all(isinstance(mirror.get(k), str) for k in ("source", "dest")):
            module.fail_json(msg=f"mirror needs source and dest (directories), got {mirror!r}")
        modes = {}
        for key in ("file_mode", "dir_mode"):
            value = mirror.get(key)
            if value not in (None, ""):
                try:
                    modes[key] = int(str(value), 8)
                except ValueError:
                    module.fail_json(msg=f"mirror {key} must be an octal mode such as 0644, got {value!r}")
        differences += mirror_differences(mirror["source"], mirror["dest"], **modes)
    for entry in p["verified"]:
        unknown = sorted(set(entry) - set(VERIFIED_KEYS))
        if unknown or not isinstance(entry.get("path"), str):
            module.fail_json(msg=f"each entry of verified needs path and takes only {', '.join(VERIFIED_KEYS)}; "
                                 f"got {entry!r}")
        options = {k: entry[k] for k in VERIFIED_KEYS[1:] if entry.get(k) is not None}
        differences += verified_differences(entry["path"], **options)
    if p["unit"]:
        differences += unit_differences(p["unit"], module.run_command)
    module.exit_json(changed=False, converged=not differences, differences=differences, inspected=inspected)


if __name__ == "__main__":
    main()
