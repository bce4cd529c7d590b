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
:func:`open_dir`, :func:`tree_files`, :func:`open_file` and :func:`private_file_problems` are the paths a
user names, read and written with no link followed (the last section: what ``atlasctl models`` and
``atlasctl config render --out`` rely on).
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


# --- no link on the way: a tree read as its own, a file written where a user says ----------------
#
# A path a user names, and every file read as inside a tree, is reached one component at a time from a
# directory descriptor, each opened with O_NOFOLLOW | O_DIRECTORY: a symbolic link anywhere on the way
# (the last component or a parent) is refused, never followed, and swapping a directory for a link after
# the check changes nothing (the walk holds the descriptor, not the name). A file read as the tree's is a
# regular file whose every name is inside the tree (``st_nlink`` no more than the names found there): a hard
# link to a file elsewhere (/etc/shadow) is refused as a symbolic link is. What is read later by name is
# compared with what the walk saw (``st_dev``, ``st_ino`` of the descriptor read: :func:`same_file`).

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
SHOWN = 5  # problems named in a refusal; the rest are counted


class UnsafePath(PathError):
    """A path that is not what it must be (a link on the way, a hard link out of a tree, a shared directory):
    the message names the path and the fix."""


def _parts(path):
    """(start, components) of ``path``: ``/`` or ``.``, then each name (empty parts and ``.`` dropped)."""
    start = "/" if os.path.isabs(path) else "."
    return start, [part for part in path.split("/") if part not in ("", ".")]


def _kind(st):
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file or directory"


def _step(dir_fd, part, walked, create, mode):
    """The descriptor of directory ``part`` in ``dir_fd`` (made when missing and ``create``), never a link."""
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise UnsafePath(f"{walked} does not exist") from None
    except OSError:
        try:
            kind = _kind(os.lstat(part, dir_fd=dir_fd))
        except OSError as exc:
            raise UnsafePath(f"{walked}: cannot open it: {exc.strerror or exc}") from None
        raise UnsafePath(f"{walked} is {kind}, not a directory (a link is never followed)") from None
    try:
        os.mkdir(part, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass  # made meanwhile: opened below as any other, never followed
    return _step(dir_fd, part, walked, False, mode)


def open_dir(path, create=False, mode=0o755):
    """A descriptor of directory ``path``, reached from ``/`` (or the working directory, for a relative path)
    one component at a time with O_NOFOLLOW: a symbolic link anywhere in ``path`` (parents included) is
    :class:`UnsafePath`. ``create``: the missing directories are made (``mode``, less the umask)."""
    start, parts = _parts(str(path))
    fd = os.open(start, _DIR_FLAGS)
    walked = "" if start == "." else "/"
    try:
        for part in parts:
            walked = os.path.join(walked, part) if walked else part
            nxt = _step(fd, part, walked, create, mode)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def same_file(a, b):
    """Whether two stat results are of the same file (device and inode)."""
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _scan(dir_fd, prefix, files, problems):
    """Every entry under ``dir_fd`` (relative names with ``prefix``): regular files into ``files``
    ({rel: lstat}), anything that is not a regular file or a directory into ``problems``; subdirectories
    are opened with O_NOFOLLOW and must be the directory listed (a swap meanwhile is a problem)."""
    with os.scandir(dir_fd) as entries:
        listed = sorted(entries, key=lambda e: e.name)
    for entry in listed:
        rel = prefix + entry.name
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            files[rel] = st
        elif stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                problems.append(f"{rel}: cannot open it: {exc.strerror or exc}")
                continue
            try:
                if not same_file(os.fstat(sub), st):
                    problems.append(f"{rel}: replaced while it was listed")
                    continue
                _scan(sub, rel + "/", files, problems)
            finally:
                os.close(sub)
        else:
            problems.append(f"{rel}: {_kind(st)} (never followed: a tree read as its own holds regular files only)")


def _foreign(files):
    """The files of ``files`` ({rel: lstat}) with more names (``st_nlink``) than the tree holds: a hard link
    to a file with a name outside the tree."""
    inside = {}
    for st in files.values():
        inside[(st.st_dev, st.st_ino)] = inside.get((st.st_dev, st.st_ino), 0) + 1
    return [rel for rel, st in sorted(files.items()) if st.st_nlink > inside[(st.st_dev, st.st_ino)]]


def tree_files(root, ignore=frozenset()):
    """{relative path: lstat} of every regular file under ``root``, nothing followed; ``root`` is reached with
    no symbolic link on the way (:func:`open_dir`). A symbolic link, a special file or a hard link to a file
    outside the tree anywhere under it (``ignore``: relative paths left out) is :class:`UnsafePath` naming
    them all (the first :data:`SHOWN`, the rest counted)."""
    fd = open_dir(root)
    files, problems = {}, []
    try:
        _scan(fd, "", files, problems)
    except OSError as exc:
        raise UnsafePath(f"{root}: cannot list it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    files = {rel: st for rel, st in files.items() if rel not in ignore}
    problems = [p for p in problems if p.split(":")[0] not in ignore]
    problems += [f"{rel}: a hard link to a file outside the tree ({files[rel].st_nlink} names, not all in it)"
                 for rel in _foreign(files)]
    if problems:
        more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        raise UnsafePath(f"{root}: {'; '.join(problems[:SHOWN])}{more}")
    return files


def open_file(path):
    """A descriptor for reading the regular file ``path``, reached with no symbolic link on the way (parents
    included) and holding no other name (``st_nlink`` 1): else :class:`UnsafePath`."""
    parent, name = os.path.split(str(path).rstrip("/"))
    dir_fd = open_dir(parent or ".")
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafePath(f"{path}: cannot open it (a link is never followed): {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = _kind(st) if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names (a hard link)"
        raise UnsafePath(f"{path} is {what}: only a regular file with one name is read")
    return fd


def _owner_problem(st, owners, sticky_ok):
    """'' when ``st`` (an lstat) is owned by one of ``owners`` and writable by neither group nor others (a
    sticky directory, with ``sticky_ok``: by others too); else what is wrong."""
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not by root or this user"
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and stat.S_ISDIR(st.st_mode) and mode & stat.S_ISVTX):
        return f"mode {mode:04o}: writable by {'others' if mode & stat.S_IWOTH else 'its group'}"
    return ""


def private_file_problems(path, owners=None):
    """Why no one but this user and root may be trusted to be the only writer of the file ``path`` (a stamp
    file that vouches for files without reading them), or []: the path holds a symbolic link, is a directory,
    the file (when there) is not a regular file with one name of its own, the directory holding it is not
    private (owned by this user or root, writable by neither group nor others), or a directory above it is
    writable by others without the sticky bit. ``owners``: the uids trusted (default root and this user)."""
    owners = owners if owners is not None else {0, os.geteuid()}
    path = os.path.abspath(str(path))
    parent = os.path.dirname(path)
    try:
        os.close(open_dir(parent))
    except UnsafePath as exc:
        return [str(exc)]
    problems = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            problems.append(f"{path} is {_kind(st) if not stat.S_ISREG(st.st_mode) else 'a hard link'}, not a "
                            "file of its own")
        elif _owner_problem(st, owners, False):
            problems.append(f"{path}: {_owner_problem(st, owners, False)}")
    what = _owner_problem(os.lstat(parent), owners, False)
    if what:
        problems.append(f"{parent}: {what}")
    above = os.path.dirname(parent)
    while True:
        what = _owner_problem(os.lstat(above), owners, True)
        if what:
            problems.append(f"{above}: {what}")
        if above == os.path.dirname(above):
            return problems
        above = os.path.dirname(above)
