# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read-only proof, in one module call, that a stage's node state is what its full tasks leave.

A stage's fast path (DESIGN.md, "Fast paths") calls the module ``stage_state`` once: it reads the
account, the directories, files and links, the release directories and the unit, and lists every
difference from the wanted state. No difference: the stage is converged and its node tasks are
skipped. Any difference: they all run. Each check states exactly what a full task ensures:

- :func:`account_differences`: ``group`` (exists; ``system: true`` created it below SYS_GID_MAX) and
  ``user`` (exists, primary group, shell, home, home exists, password field in /etc/shadow, member of
  each supplementary group that exists on the node: ``groups`` + ``append: true`` of groups the role
  found there);
- :func:`path_differences`: what ``paths`` would do (its own :func:`paths.plan` and
  :func:`paths.plan_files`, one comparison), plus links the stage reads but does not manage;
- :func:`oldest_to_prune`: the release directories a ``find`` + ``file: state=absent`` prune by
  mtime would remove (the same listing and order as ``ansible.builtin.find``);
- :func:`unit_differences`: ``systemd_service`` with ``enabled: true`` and ``state: started``;
- :func:`mirror_differences`: what ``rsync --recursive --times --delete`` from a source directory
  would itemize (its quick check: kind, size and mtime in whole seconds; directories' mtimes too);
- :func:`verified_differences`: what ``model_verify`` would read or rewrite: every listed file
  vouched for by its stamp, no extra file, the stamp file as a run would leave it.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible_collections.atlas.serving.plugins.module_utils.checksums import VerifyError
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
from ansible_collections.atlas.serving.plugins.module_utils.tree_check import check_tree


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
                        login_defs="/etc/login.defs", getpwnam=pwd.getpwnam, getgrnam=grp.getgrnam, groups=()):
    """What the ``group`` (system) and ``user`` (that group, shell, home created, password, ``groups``
    appended where they exist) tasks would change, one line each. The password field itself is never
    part of a line."""
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
    out += supplementary_differences(pw, groups, getgrnam)
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


def supplementary_differences(pw, groups, getgrnam=grp.getgrnam):
    """Each group of ``groups`` that exists on the node and does not list the user (a group that does
    not exist is no difference: the role adds the user only to groups the node has)."""
    out = []
    for name in groups:
        try:
            gr = getgrnam(name)
        except KeyError:
            continue
        if pw.pw_name not in gr.gr_mem and pw.pw_gid != gr.gr_gid:
            out.append(f"user {pw.pw_name} is not in group {name}")
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


def _tree(root):
    """{relative path: lstat} of everything under ``root`` ('.' is root itself), links not followed."""
    out = {".": os.lstat(root)}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = os.lstat(path)
    return out


def mirror_differences(source, dest, file_mode=None, dir_mode=None):
    """What ``rsync --recursive --times --delete source/ dest/`` would itemize, one line each: an entry
    missing, extra (deleted) or of another kind, a file of another size or mtime (rsync's quick check,
    whole seconds: its default --modify-window 0), a directory of another mtime (--times sets them).
    With ``file_mode``/``dir_mode`` (``--perms --chmod=D<dir_mode>,F<file_mode>``), an entry of another
    mode too. Anything in ``source`` that is neither a file nor a directory is a difference: rsync without
    --links skips it, and the fast path does not reason about what it skips."""
    try:
        want = _tree(source)
    except FileNotFoundError:
        return [f"{source} does not exist"]
    try:
        have = _tree(dest)
    except FileNotFoundError:
        return [f"{dest} does not exist"]
    out = []
    for rel, st in sorted(want.items()):
        path = os.path.normpath(os.path.join(dest, rel))
        found = have.get(rel)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            out.append(f"{os.path.join(source, rel)} is neither a file nor a directory")
        elif found is None:
            out.append(f"{path} is missing")
        elif stat.S_IFMT(found.st_mode) != stat.S_IFMT(st.st_mode):
            out.append(f"{path} is not a {'directory' if stat.S_ISDIR(st.st_mode) else 'file'}")
        elif stat.S_ISREG(st.st_mode) and found.st_size != st.st_size:
            out.append(f"{path} has {found.st_size} bytes, not {st.st_size}")
        elif int(found.st_mtime) != int(st.st_mtime):
            out.append(f"{path} has another mtime than {os.path.join(source, rel)}")
        else:
            mode = dir_mode if stat.S_ISDIR(st.st_mode) else file_mode
            if mode is not None and stat.S_IMODE(found.st_mode) != mode:
                out.append(f"{path} has mode {stat.S_IMODE(found.st_mode):04o}, not {mode:04o}")
    out += [f"{os.path.normpath(os.path.join(dest, rel))} is not in {source} (rsync --delete removes it)"
            for rel in sorted(set(have) - set(want))]
    return out


def verified_differences(root, **check):
    """Why ``model_verify`` with these options (``tree_check.check_tree``'s) would read a file, fail, or
    write its stamp file; [] when stamps alone prove the tree as listed. Reads no file."""
    try:
        report, _stamps = check_tree(root, read=False, write_stamps=False, **check)
    except VerifyError as exc:
        return [str(exc)]
    out = [f"{root}/{r.path}: {r.message or r.status}" for r in report.bad]
    if not out and report.stamps_changed:
        out.append(f"{report.stamps_path}: the stamps of {root} would be rewritten")
    return out
