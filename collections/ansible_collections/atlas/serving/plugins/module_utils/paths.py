# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Directories, files and symbolic links of a stage, brought to their state in one module call.

A stage that needs N directories, F files and M links would otherwise run ``ansible.builtin.file``
N + M times and ``template``/``copy`` F times (two round trips each when the file is unchanged: a
stat, then ``file`` for its attributes), one round trip to the node each. Files are rendered on
the controller and their content passed in; :func:`plan_files` compares it with what is on disk
and :func:`apply_files` writes what differs atomically (a temporary file in the same directory,
mode and owner set, fsynced, renamed over the old one; created in place, it gets the SELinux
context of its directory as ``template`` does). :func:`plan` compares what is on disk with what is
wanted and lists the actions; :func:`apply` carries them out, in order (missing parents first,
with the same mode and owner, as ``ansible.builtin.file`` with ``state: directory`` does).
A link is replaced atomically (a new link beside it, renamed over it), as
``ansible.builtin.file`` does with ``force: true``. :func:`plan_prune` lists the files of a
directory that match a pattern and that the call does not manage (the stale ones a ``find`` +
``file: state=absent`` loop would remove); :func:`apply_prune` removes them.
:func:`file_entries` reads the ``files`` option of the modules that take one (``paths``,
``stage_state``), so both compare the same way.
Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import fnmatch
import grp
import os
import pwd
import stat


class PathError(Exception):
    """A path cannot be brought to the wanted state (named, with the fix)."""


def ids(owner, group):
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise PathError(f"owner {owner!r} does not exist on this node") from None
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise PathError(f"group {group!r} does not exist on this node") from None
    return uid, gid


def _attributes(path, st, mode, uid, gid):
    """``chmod`` and ``chown`` actions for an existing path whose mode or owner differ."""
    actions = []
    if stat.S_IMODE(st.st_mode) != mode:
        actions.append(("chmod", path, f"{oct(stat.S_IMODE(st.st_mode))} -> {oct(mode)}"))
    if (st.st_uid, st.st_gid) != (uid, gid):
        actions.append(("chown", path, f"{st.st_uid}:{st.st_gid} -> {uid}:{gid}"))
    return actions


def _beside(path, tag):
    """A temporary name in ``path``'s directory, free (what an interrupted run left is removed)."""
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.atlas-{tag}.{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    return tmp


def _set_attributes(verb, path, mode, uid, gid):
    if verb == "chmod":
        os.chmod(path, mode)
    elif verb == "chown":
        os.chown(path, uid, gid)


def plan(directories, links, mode, uid, gid):
    """The actions that bring the paths to their wanted state, as (verb, path, detail) tuples:
    ``mkdir``, ``chmod``, ``chown`` for directories; ``link`` for links (detail: the target)."""
    actions = []
    planned = set()
    for path in directories:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            # Missing parents are created too, with the same mode and owner (as file: state=directory).
            missing = [path]
            parent = os.path.dirname(path.rstrip("/"))
            while parent and parent != "/" and not os.path.lexists(parent) and parent not in planned:
                missing.append(parent)
                parent = os.path.dirname(parent)
            for new in reversed(missing):
                if new not in planned:
                    planned.add(new)
                    actions.append(("mkdir", new, oct(mode)))
            continue
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise PathError(f"{path} is {kind}; a directory is wanted there: move it away, then run again")
        actions += _attributes(path, st, mode, uid, gid)
    for dest, src in links:
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            actions.append(("link", dest, src))
            continue
        if stat.S_ISLNK(st.st_mode):
            if os.readlink(dest) != src:
                actions.append(("link", dest, src))
        elif stat.S_ISDIR(st.st_mode):
            raise PathError(f"{dest} is a directory; a link to {src} is wanted there: move it away, then run again")
        else:
            actions.append(("link", dest, src))  # a regular file is replaced, as file: state=link force=true
    return actions


def apply(actions, mode, uid, gid):
    for verb, path, detail in actions:
        if verb == "mkdir":
            os.mkdir(path, mode)
            os.chmod(path, mode)  # mkdir's mode passes through the umask
            os.chown(path, uid, gid)
        elif verb == "link":
            tmp = _beside(path, "link")
            os.symlink(detail, tmp)
            os.replace(tmp, path)
        else:
            _set_attributes(verb, path, mode, uid, gid)


def describe(actions):
    """One line per action, for the diff and the result."""
    return [f"{verb} {path} ({detail})" if verb != "link" else f"link {path} -> {detail}"
            for verb, path, detail in actions]


def plan_files(files):
    """The actions that bring files to their content, mode and owner, as (verb, path, detail):
    ``write`` (detail: the content on disk before, or None), ``chmod``, ``chown``.
    ``files``: (dest, content bytes, mode, uid, gid) tuples."""
    actions = []
    for dest, content, mode, uid, gid in files:
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            actions.append(("write", dest, None))
            continue
        if stat.S_ISLNK(st.st_mode):
            actions.append(("write", dest, None))  # the link is replaced by the file, as template does
            continue
        if not stat.S_ISREG(st.st_mode):
            raise PathError(f"{dest} is not a regular file; a file is wanted there: move it away, then run again")
        with open(dest, "rb") as fh:
            before = fh.read()
        if before != content:
            actions.append(("write", dest, before))
            continue
        actions += _attributes(dest, st, mode, uid, gid)
    return actions


def apply_files(actions, files):
    """Carry out plan_files' actions (``files`` as given to it)."""
    wanted = {dest: (content, mode, uid, gid) for dest, content, mode, uid, gid in files}
    for verb, path, _detail in actions:
        content, mode, uid, gid = wanted[path]
        if verb == "write":
            tmp = _beside(path, "tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(content)
                    os.fchown(fh.fileno(), uid, gid)
                    os.fchmod(fh.fileno(), mode)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                raise
        else:
            _set_attributes(verb, path, mode, uid, gid)


def converge(directories, files, links, mode, uid, gid, check=False):
    """Plan, and unless ``check``, apply: directories first, then files, then links (a link can
    point at a file written in the same call). Returns (directory, file, link) actions."""
    actions = plan(directories, links, mode, uid, gid)
    dir_actions = [a for a in actions if a[0] != "link"]
    link_actions = [a for a in actions if a[0] == "link"]
    file_actions = plan_files(files)
    if not check:
        apply(dir_actions, mode, uid, gid)
        apply_files(file_actions, files)
        apply(link_actions, mode, uid, gid)
    return dir_actions, file_actions, link_actions


def inspect(paths):
    """{path: {"exists": bool, "link": target or None}} (lstat: a link is not followed)."""
    out = {}
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            out[path] = {"exists": False, "link": None}
            continue
        out[path] = {"exists": True, "link": os.readlink(path) if stat.S_ISLNK(st.st_mode) else None}
    return out


def describe_files(actions):
    return [f"{verb} {path}" if verb == "write" else f"{verb} {path} ({detail})" for verb, path, detail in actions]


def file_diffs(actions, files):
    """One before/after diff per written file (``--diff``)."""
    after = {dest: content for dest, content, _m, _u, _g in files}

    def text(data):
        if data is None:
            return ""
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "(binary content)\n"

    return [{"before": text(detail), "after": text(after[path]), "before_header": path, "after_header": path}
            for verb, path, detail in actions if verb == "write"]


def file_entries(entries, tolerate_unknown_owner=False):
    """The ``files`` option (dicts of dest, content, mode, owner, group) as plan_files' tuples.
    ``tolerate_unknown_owner``: an owner or group missing on the node gives uid/gid -1 (check mode on
    a bare node, where an earlier task creates the account) instead of an error."""
    files = []
    for entry in entries:
        if not isinstance(entry.get("dest"), str) or not isinstance(entry.get("content"), str):
            raise PathError(f"each file needs dest and content (strings), got dest {entry.get('dest')!r}")
        raw = entry.get("mode", "0644")
        try:
            fmode = raw if isinstance(raw, int) else int(str(raw), 8)  # an int: YAML read 0644 already
        except ValueError:
            raise PathError(f"{entry['dest']}: mode {raw!r} is not an octal mode such as '0644'") from None
        try:
            fuid, fgid = ids(entry.get("owner", "root"), entry.get("group", "root"))
        except PathError:
            if not tolerate_unknown_owner:
                raise
            fuid, fgid = -1, -1
        files.append((entry["dest"], entry["content"].encode("utf-8"), fmode, fuid, fgid))
    return files


def plan_prune(rules, keep):
    """``remove`` actions (verb, path, pattern) for the entries of each rule's directory whose name
    matches its pattern (fnmatch, as ``find`` matches; names starting with a dot are left alone, as
    ``find`` and nginx's ``include *.conf`` do) and that are not in ``keep`` (the paths this call
    manages). ``rules``: (directory, pattern) tuples; a missing directory has nothing to remove.
    Only regular files and links are removed: anything else matching is an error naming it."""
    keep = {os.path.normpath(path) for path in keep}
    actions = []
    for directory, pattern in rules:
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            raise PathError(f"prune: {directory} is not a directory: name the directory whose {pattern!r} "
                            "files this call manages") from None
        for name in sorted(names):
            path = os.path.join(directory, name)
            if name.startswith(".") or not fnmatch.fnmatch(name, pattern) or os.path.normpath(path) in keep:
                continue
            mode = os.lstat(path).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
                raise PathError(f"{path} matches {pattern!r} in {directory} and is not managed here, but it is "
                                "not a regular file or link, so it is not removed: move it away, then run again")
            actions.append(("remove", path, pattern))
    return actions


def apply_prune(actions):
    for _verb, path, _pattern in actions:
        os.unlink(path)


def describe_prune(actions):
    return [f"remove {path} (matches {pattern}, not managed)" for _verb, path, pattern in actions]
