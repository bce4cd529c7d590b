# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only proof, in one module call, that a stage's node state is what its full tasks leave.

A stage's fast path (DESIGN.md, "Fast paths") calls the module ``stage_state`` once: it reads the
account, the directories, files and links, the release directories and the unit, and lists every
difference from the wanted state. No difference: the stage is converged and its node tasks are
skipped. Any difference: they run as before. Each check states exactly what a full task ensures:

- :func:`account_differences`: ``group`` (exists; ``system: true`` created it below SYS_GID_MAX) and
  ``user`` (exists, primary group, shell, home, home exists, password field in /etc/shadow);
- :func:`path_differences`: what ``paths`` would do (its own :func:`paths.plan` and
  :func:`paths.plan_files`, one comparison), plus links the stage reads but does not manage;
- :func:`oldest_to_prune`: the release directories a ``find`` + ``file: state=absent`` prune by
  mtime would remove (the same listing and order as ``ansible.builtin.find``);
- :func:`unit_differences`: ``systemd_service`` with ``enabled: true`` and ``state: started``.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible_collections.atlas.serving.plugins.module_utils.health import parse_show
from ansible_collections.atlas.serving.plugins.module_utils.paths import (
    PathError,
    describe,
    describe_files,
    file_entries,
    ids,
    plan,
    plan_files,
)


def sys_gid_max(login_defs="/etc/login.defs"):
    """SYS_GID_MAX of login.defs (what ``groupadd -r`` stays under), 999 when it is not set."""
    try:
        with open(login_defs, encoding="utf-8") as fh:
            for line in fh:
                words = line.split()
                if len(words) >= 2 and words[0] == "SYS_GID_MAX" and words[1].isdigit():
                    return int(words[1])
    except FileNotFoundError:
        pass
    return 999


def shadow_password(user, shadow="/etc/shadow"):
    """The password field of ``user`` in ``shadow``, or None when it has no entry."""
    with open(shadow, encoding="utf-8") as fh:
        for line in fh:
            fields = line.rstrip("\n").split(":")
            if fields[0] == user and len(fields) > 1:
                return fields[1]
    return None


def account_differences(user, group, shell, home, password="!", shadow="/etc/shadow",
                        login_defs="/etc/login.defs", getpwnam=pwd.getpwnam, getgrnam=grp.getgrnam):
    """What the ``group`` (system) and ``user`` (that group, shell, home created, password) tasks
    would change, one line each. The password field itself is never part of a line."""
    out = []
    try:
        gr = getgrnam(group)
    except KeyError:
        gr = None
        out.append(f"group {group} does not exist")
    if gr is not None and gr.gr_gid > sys_gid_max(login_defs):
        out.append(f"group {group} (gid {gr.gr_gid}) is not a system group")
    try:
        pw = getpwnam(user)
    except KeyError:
        return out + [f"user {user} does not exist"]
    if gr is not None and pw.pw_gid != gr.gr_gid:
        out.append(f"user {user} has primary gid {pw.pw_gid}, not {group} ({gr.gr_gid})")
    if pw.pw_shell != shell:
        out.append(f"user {user} has shell {pw.pw_shell}, not {shell}")
    if pw.pw_dir != home:
        out.append(f"user {user} has home {pw.pw_dir}, not {home}")
    if not os.path.isdir(home):
        out.append(f"home {home} of {user} does not exist")
    try:
        field = shadow_password(user, shadow)
    except OSError as exc:
        out.append(f"cannot read {shadow} ({exc.strerror})")
    else:
        if field is None:
            out.append(f"user {user} has no entry in {shadow}")
        elif field != password:
            out.append(f"user {user} has another password field in {shadow} than the one wanted")
    return out


def path_differences(directories, files, links, mode, owner, group, expect_links=()):
    """What ``paths`` with these arguments would do (its actions, described), and every link of
    ``expect_links`` ((path, target or None for "not a link") tuples) that reads otherwise.
    ``files`` as the ``paths`` option takes them. A path of the wrong kind, or an owner missing on
    the node, is a difference (the full tasks name it, or create the account first)."""
    try:
        uid, gid = ids(owner, group)
        actions = plan(directories, links, mode, uid, gid)
        wanted = file_entries(files)
        out = describe(actions) + describe_files(plan_files(wanted))
    except PathError as exc:
        return [str(exc)]
    for path, target in expect_links:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            out.append(f"{path} does not exist")
            continue
        found = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
        if found != target:
            out.append(f"{path} -> {found or '(not a link)'}, not {target or '(not a link)'}")
    return out


def oldest_to_prune(directory, keep, protect=()):
    """The subdirectories of ``directory`` that a prune keeping the newest ``keep`` by mtime (and
    every name of ``protect``) removes: ``find`` (file_type directory, no hidden ones, a link is not
    a directory) sorted by mtime, newest first, stable; then each from index ``keep`` on."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        st = os.lstat(entry.path)
        if stat.S_ISDIR(st.st_mode):
            found.append((st.st_mtime, entry.path))
    ordered = sorted(found, key=lambda item: item[0], reverse=True)
    return [path for index, (_mtime, path) in enumerate(ordered)
            if index >= keep and os.path.basename(path) not in protect]


def unit_differences(name, run):
    """What ``systemd_service`` (enabled: true, state: started) would change for unit ``name``;
    ``run(argv)`` returns (rc, stdout, stderr)."""
    rc, out, err = run(["systemctl", "show", "-p", "LoadState", "-p", "ActiveState", "-p", "UnitFileState",
                        "--", name])
    if rc != 0:
        return [f"systemctl show {name} failed: {(err or out).strip()}"]
    props = parse_show(out)
    diffs = []
    if props.get("LoadState") != "loaded":
        diffs.append(f"unit {name} is {props.get('LoadState', 'unknown')}, not loaded")
    if props.get("UnitFileState") != "enabled":
        diffs.append(f"unit {name} is {props.get('UnitFileState') or 'not installed'}, not enabled")
    if props.get("ActiveState") != "active":
        diffs.append(f"unit {name} is {props.get('ActiveState', 'unknown')}, not active")
    return diffs
