# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Directories and symbolic links of a stage, brought to their state in one module call.

A stage that needs N directories and M links would otherwise run ``ansible.builtin.file`` N + M
times, one round trip to the node each. :func:`plan` compares what is on disk with what is
wanted and lists the actions; :func:`apply` carries them out, in order (missing parents first,
with the same mode and owner, as ``ansible.builtin.file`` with ``state: directory`` does).
A link is replaced atomically (a new link beside it, renamed over it), as
``ansible.builtin.file`` does with ``force: true``.
Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

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
        if stat.S_IMODE(st.st_mode) != mode:
            actions.append(("chmod", path, f"{oct(stat.S_IMODE(st.st_mode))} -> {oct(mode)}"))
        if (st.st_uid, st.st_gid) != (uid, gid):
            actions.append(("chown", path, f"{st.st_uid}:{st.st_gid} -> {uid}:{gid}"))
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
        elif verb == "chmod":
            os.chmod(path, mode)
        elif verb == "chown":
            os.chown(path, uid, gid)
        elif verb == "link":
            tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.atlas-link.{os.getpid()}")
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(detail, tmp)
            os.replace(tmp, path)


def describe(actions):
    """One line per action, for the diff and the result."""
    return [f"{verb} {path} ({detail})" if verb != "link" else f"link {path} -> {detail}"
            for verb, path, detail in actions]
