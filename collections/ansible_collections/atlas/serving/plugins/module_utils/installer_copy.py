# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Installers run from a root-only copy whose bytes were checked, never from the bundle itself.

Checking a file in the bundle and then running it from there reads it twice: whoever can write the
bundle can swap it in between. So each installer a stage will run is copied into a directory only
root can write (0700 root:root, every directory above it root's), the copy is hashed and compared
with the sha256 of the manifest whose signature was verified in this run, and the copy is what runs.
A zipped package (7.0.RC1's kernels) is unpacked from its checked copy, and each member is checked
against the manifest's record of it (``<zip>!<member>``) the same way.

Every file is copied and checked before the caller runs any of them, so a bad package refuses the
whole set. Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
import zipfile
from dataclasses import asdict, dataclass

from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256
from ansible_collections.atlas.serving.plugins.module_utils.manifest import (
    ManifestError,
    parse_json,
    read_text,
    sha256_index,
)
from ansible_collections.atlas.serving.plugins.module_utils.root_only import chain_problems, describe

CHUNK = 1 << 20
DIR_MODE = 0o700
COPY_MODE = 0o700  # root only; executable as the vendor's .run expects to be
ZIP_SUFFIX = ".zip"
RUN_SUFFIX = ".run"
FIX = "Rebuild or copy the bundle again (atlasctl bundle build / bundle push)"


class CopyError(Exception):
    """A copy that cannot be made or trusted; the message names the file and the fix."""


@dataclass(frozen=True)
class Copy:
    file: str  # as the manifest names it, relative to the bundle
    src: str  # in the bundle
    copy: str  # the checked copy in the root-only directory ('' in check mode)
    sha256: str
    run: str  # what to run: the copy, or the .run unpacked from a zipped copy ('' in check mode)

    def as_dict(self) -> dict:
        return asdict(self)


def _relative(name: str) -> str:
    """A bundle path as the manifest writes it; anything that leaves the bundle is refused."""
    norm = posixpath.normpath(name)
    if not name or name != norm or norm.startswith(("/", "../")) or norm in (".", "..") or "\0" in name:
        raise CopyError(f"{name!r}: not a path inside the bundle (write it as the manifest does, e.g. cann/<file>.run)")
    return norm


def _open_regular(path: str, what: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CopyError(f"{path}: missing from the {what}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CopyError(f"{path}: a symbolic link (a bundle holds none)") from None
        raise CopyError(f"{path}: cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CopyError(f"{path}: not a regular file")
    return fd


def hash_path(path: str, what: str = "bundle") -> str:
    """sha256 of the regular file at ``path`` (a link is refused, not followed)."""
    fd = _open_regular(path, what)
    try:
        return file_sha256(fd, CHUNK)  # the descriptor opened (O_NOFOLLOW, a regular file): what is hashed
    finally:
        os.close(fd)


def _remove(path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return True


def _write_new(path: str, chunks) -> None:
    """``path`` created fresh (never an existing file or link followed), root-only, filled from ``chunks``."""
    _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, COPY_MODE)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fchmod(fd, COPY_MODE)
    finally:
        os.close(fd)


def _read_chunks(handle):
    while True:
        chunk = handle.read(CHUNK)
        if not chunk:
            return
        yield chunk


def prepare_dir(dest: str, check: bool = False) -> bool:
    """``dest`` a directory only root can write (created 0700 root:root, or made so); True when changed.
    Every directory above it must already be root's alone (the copies could be swapped through them)."""
    dest = os.path.abspath(dest)
    changed = False
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is None:
        if check:
            return True
        os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
        os.mkdir(dest, DIR_MODE)
        st, changed = os.lstat(dest), True
    if not stat.S_ISDIR(st.st_mode):
        raise CopyError(f"{dest}: not a directory; remove it, or set the installer directory elsewhere")
    if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (0, 0, DIR_MODE):
        if not check:
            os.chown(dest, 0, 0, follow_symlinks=False)
            os.chmod(dest, DIR_MODE)
        changed = True
    problems = [p for p in chain_problems(dest) if p.path != dest]
    if problems:
        raise CopyError(describe(problems, dest, "installer directory"))
    return changed


def _members(index: dict[str, str], rel: str) -> dict[str, str]:
    prefix = rel + "!"
    return {key[len(prefix):]: digest for key, digest in index.items() if key.startswith(prefix)}


def _unpack(zip_copy: str, rel: str, members: dict[str, str], dest: str, check: bool) -> tuple[str, list[str]]:
    """The members the manifest records, unpacked from the checked copy of the zip and checked one by
    one; returns (the .run among them, problems)."""
    runs = [m for m in members if m.endswith(RUN_SUFFIX)]
    if len(runs) != 1:
        return "", [f"{rel}: the manifest records {len(runs)} .run members in it, not one "
                    "(rebuild the bundle with atlasctl bundle build, which records zip members)"]
    root = os.path.join(dest, posixpath.basename(rel)[: -len(ZIP_SUFFIX)])
    problems = []
    if not check:
        _remove(root)
        os.mkdir(root, DIR_MODE)
    with zipfile.ZipFile(zip_copy) as archive:
        for member, expected in sorted(members.items()):
            name = _relative(member)
            target = os.path.join(root, *name.split("/"))
            try:
                with archive.open(member) as handle:
                    if check:
                        actual = file_sha256(handle, CHUNK)
                    else:
                        os.makedirs(os.path.dirname(target), mode=DIR_MODE, exist_ok=True)
                        _write_new(target, _read_chunks(handle))
                        actual = hash_path(target, "unpacked copy")
            except KeyError:
                problems.append(f"{rel}: has no member {member}, which the manifest records")
                continue
            if actual != expected:
                problems.append(f"{rel}!{member}: sha256 {actual} of the unpacked copy does not match the "
                                f"manifest's record of the member {expected}")
    return (os.path.join(root, *runs[0].split("/")) if not check else ""), problems


def copy_checked(bundle_dir: str, files: list[str], dest: str, manifest: str, manifest_sha256: str,
                 check: bool = False) -> tuple[list[Copy], bool]:
    """Copy each of ``files`` (relative to ``bundle_dir``) into ``dest`` and check each copy against the
    manifest at ``manifest`` (its bytes must have ``manifest_sha256``: the verified one). Returns the
    copies and whether anything changed. In check mode nothing is written and nothing is reported as
    changed (the copies are removed again after the install): the files are checked where they are.
    Any problem removes what this call copied and raises CopyError naming every bad file."""
    try:
        text = read_text(manifest, trusted_sha256=manifest_sha256 or "")
        index = sha256_index(parse_json(text, manifest), manifest)
    except ManifestError as exc:
        raise CopyError(f"{str(exc).rstrip('.')}. Nothing was copied or run") from None
    wanted = list(dict.fromkeys(_relative(f) for f in files))
    for rel in wanted:
        src = os.path.join(bundle_dir, *rel.split("/"))
        try:
            unsafe = chain_problems(src)
        except FileNotFoundError:
            continue  # named below, with the other problems of the set
        if unsafe:
            raise CopyError(describe(unsafe, src, "installer",
                                     "Copy the bundle as root (atlasctl bundle push does)"))
    changed = prepare_dir(dest, check)
    copies, problems, made = [], [], []
    try:
        for rel in wanted:
            src = os.path.join(bundle_dir, *rel.split("/"))
            if rel not in index:
                problems.append(f"{src}: no entry for {rel} in {manifest}")
                continue
            target = os.path.join(dest, posixpath.basename(rel))
            try:
                if check:
                    actual, copied = hash_path(src), src
                else:
                    fd = _open_regular(src, "bundle")
                    try:
                        made.append(target)
                        with os.fdopen(os.dup(fd), "rb") as handle:
                            _write_new(target, _read_chunks(handle))
                    except OSError as exc:
                        raise CopyError(f"{src}: cannot be copied to {target}: {exc.strerror} (each package "
                                        f"needs its size free in {dest})") from None
                    finally:
                        os.close(fd)
                    actual, copied = hash_path(target, "copy"), target
            except CopyError as exc:
                problems.append(str(exc))
                continue
            if actual != index[rel]:
                where = f" of its copy {target}" if not check else ""
                problems.append(f"{src}: sha256 {actual}{where} does not match the manifest's {index[rel]}")
                continue
            run = target
            if rel.endswith(ZIP_SUFFIX):
                if not check:
                    made.append(os.path.join(dest, posixpath.basename(rel)[: -len(ZIP_SUFFIX)]))
                run, bad = _unpack(copied, rel, _members(index, rel), dest, check)
                problems += bad
            copies.append(Copy(rel, src, "" if check else target, actual, "" if check else run))
        if problems:
            raise CopyError(f"Refused before any installer ran: {'; '.join(problems)}. {FIX}")
    except BaseException:
        for path in made:
            _remove(path)
        raise
    return copies, not check and (changed or bool(made))


def remove_copies(files: list[str], dest: str, check: bool = False) -> list[str]:
    """Remove what ``copy_checked`` left in ``dest`` for ``files`` (a zip's unpacked directory too)."""
    removed = []
    for rel in dict.fromkeys(_relative(f) for f in files):
        base = posixpath.basename(rel)
        paths = [os.path.join(dest, base)]
        if rel.endswith(ZIP_SUFFIX):
            paths.append(os.path.join(dest, base[: -len(ZIP_SUFFIX)]))
        for path in paths:
            if os.path.lexists(path):
                if not check:
                    _remove(path)
                removed.append(path)
    return removed
