# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who besides root can change a path: what a stage refuses before it trusts a checked file.

A stage checks a file against the signed manifest, then uses it. A user who can write the file, the
directory holding it or any directory above it (replace the file, or rename a directory and put another
in its place) can swap it between the check and the use. Only root may: every path from ``/`` down to
the file is owned by root and writable by neither group nor others. A directory above that is
writable by others but has the sticky bit (``/tmp``) is accepted: in it only an entry's owner (here
root) may rename or remove that entry (unlink(2), EPERM; chmod(2), S_ISVTX).

``tree_problems`` judges a directory tree as a whole (a bundle: every directory and file under it, and
every directory above it); a symbolic link or special file inside it is a problem too, as in a bundle
(DESIGN.md, the offline bundle). ``chain_problems`` judges one path and the directories above it.
``describe`` is the refusal: every problem, then the commands that fix them.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import grp
import os
import pwd
import shlex
import stat
from dataclasses import dataclass

GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
SHOWN = 5  # problems named in a refusal; the rest are counted
LINK = "a symbolic link (a bundle holds none)"
SPECIAL = "not a regular file or directory"


@dataclass(frozen=True)
class Problem:
    path: str
    what: str
    inside: bool  # inside the judged tree (fix: chown -R / chmod -R it), or a directory above it


def _name(lookup, number: int) -> str:
    try:
        return f"{lookup(number)[0]} ({number})"
    except KeyError:
        return str(number)


def entry_problem(st: os.stat_result, *, above: bool) -> str:
    """'' when only root can change the entry ``st`` describes (an lstat), else what is wrong.
    ``above``: a directory above the judged path (a root-owned sticky one may be writable by others)."""
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return "" if above else LINK
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return SPECIAL
    shown = f"owner {_name(pwd.getpwuid, st.st_uid)}, group {_name(grp.getgrgid, st.st_gid)}, mode {mode:04o}"
    if st.st_uid != 0:
        return f"{shown}: not owned by root"
    if mode & GROUP_OTHER_WRITE:
        if above and stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX:
            return ""
        return f"{shown}: writable by {'others' if mode & stat.S_IWOTH else 'its group'}"
    return ""


def _above(path: str) -> list[str]:
    """The directories above ``path``, nearest first, ``/`` last."""
    found = []
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return found
        found.append(parent)
        path = parent


def chain_problems(path: str, *, inside: bool = False) -> list[Problem]:
    """``path`` and every directory above it, as written and as resolved: a link on the way is followed
    and the directories above its target are judged too (the link itself cannot be changed, only
    replaced through its directory, which is judged). ``inside``: ``path`` is the root of a judged tree."""
    path = os.path.abspath(path)
    problems, seen = [], set()
    for spelled in dict.fromkeys((path, os.path.realpath(path))):
        for candidate in [spelled] + _above(spelled):
            if candidate in seen:
                continue
            seen.add(candidate)
            own = candidate == spelled
            st = os.lstat(candidate)  # a missing path: FileNotFoundError, for the caller to name
            if own and stat.S_ISLNK(st.st_mode):
                continue  # judged as resolved
            what = entry_problem(st, above=not own)
            if what:
                problems.append(Problem(candidate, what, inside=own and inside))
    return problems


def tree_problems(root: str) -> list[Problem]:
    """Every directory and file under ``root`` (links not followed), ``root`` itself and every directory
    above it (as written and resolved)."""
    problems = chain_problems(root, inside=True)
    stack = [os.path.realpath(root)]
    while stack:
        directory = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            problems.append(Problem(directory, f"cannot be listed: {exc.strerror}", inside=True))
            continue
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            what = entry_problem(st, above=False)
            if what:
                problems.append(Problem(entry.path, what, inside=True))
            elif stat.S_ISDIR(st.st_mode):
                stack.append(entry.path)
    return problems


def describe(problems: list[Problem], root: str, what: str = "", hint: str = "") -> str:
    """One refusal: which paths a user other than root can change, then the commands that fix them."""
    root, real = os.path.abspath(root), os.path.realpath(root)  # chown -R does not follow a link it is given
    named = "; ".join(f"{p.path}: {p.what}" for p in problems[:SHOWN])
    more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    fixes = []
    if any(p.inside and p.what not in (LINK, SPECIAL) for p in problems):
        fixes.append(f"chown -R root:root {shlex.quote(real)} && chmod -R go-w {shlex.quote(real)}")
    for p in problems:
        if not p.inside and p.what not in (LINK, SPECIAL):
            fixes.append(f"chown root:root {shlex.quote(p.path)} && chmod go-w {shlex.quote(p.path)}")
    if any(p.what in (LINK, SPECIAL) for p in problems):
        fixes.append("remove the links and special files (copy the bundle again)")
    return (f"{what + ' ' if what else ''}{root}: a user other than root can change what is checked here "
            f"before it is used: {named}{more}. Only root may write it and every directory above it; fix: "
            f"{'; '.join(dict.fromkeys(fixes))}{'. ' + hint if hint else ''}")
