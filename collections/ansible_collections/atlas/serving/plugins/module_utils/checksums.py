# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One-pass md5 + sha256 verification of a directory tree, with verification stamps; and the product's one
streaming digest of a single file (``file_digest``, ``file_sha256``: a wheel, a zip member, an evidence file...).

* Each file is read once, into reused buffers; md5 and sha256 are fed the same bytes.
* Files are hashed in parallel threads (hashlib releases the GIL on buffers >= 2 KiB).
* The portable reader is here: a file read sequentially through the page cache with one reused
  buffer, on any filesystem. Wherever the kernel and the filesystem allow it, the fast path
  (fast_read.py) reads instead: a file of at least ``DIRECT_MIN_SIZE`` with O_DIRECT, alone or
  beside others, by ``DIRECT_READERS`` prefetch threads while the current buffer is hashed (where
  O_DIRECT is refused or a read ends short of the block size, the rest of the file is read here,
  buffered); a file of at most one buffer in one O_DIRECT read into a page-aligned buffer of its
  reader (``hash_small_file``), hashed in that thread; files between one buffer and
  ``DIRECT_MIN_SIZE`` buffered, advised to the kernel (WILLNEED) a window ahead of the readers.
  Once the large files are all taken, more readers join (``SMALL_READERS_PER_WORKER``): a cold
  small file is a round trip to the storage, and its reader hashes nothing meanwhile.
  Memory is at most ``(2 x workers - 1) x (2 + DIRECT_READERS x DIRECT_BUFFERS_PER_READER) x bufsize``
  plus ``workers x bufsize`` for the extra small-file readers, whatever the file sizes; the
  buffers are kept per thread from file to file (a small file touches only its own pages).
* After a full check a *stamp* per file records (size, mtime_ns, ctime_ns, inode, device,
  md5, sha256). A later run trusts a stamp only when all five stat fields are unchanged
  and the stamp's digests equal the digests expected now. ctime cannot be set from user
  space, so restoring size and mtime after an edit does not revive a stamp; replacing the
  file (rename) changes the inode; a changed manifest changes the expected digests.
  A file whose ctime is within ``racy margin`` of the moment its read began is not stamped
  (an edit in the same timestamp tick could otherwise go unseen, as with racy-git).

Standard library only: this file and the two it imports (manifest.py, fast_read.py) are shipped to
managed nodes by Ansible.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# Ansible ships module_utils under ansible_collections; atlasctl puts <repo>/collections on sys.path.
# Names, not the modules: the controller kit's install.sh loads these files by full name, without their packages.
from ansible_collections.atlas.serving.plugins.module_utils.fast_read import (
    DIRECT_BUFFERS_PER_READER,
    DIRECT_MIN_SIZE,
    DIRECT_READERS,
    HAVE_DIRECT,
    SMALL_READERS_PER_WORKER,
    aligned,
    direct_buffers,
    direct_chunks,
    drop_direct,
    first_read,
    open_once,
    read_all,
)
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ALGORITHMS, Expected

__all__ = [
    "COARSE_RACY_MARGIN_NS", "DEFAULT_BUFSIZE", "DIRECT_BUFFERS_PER_READER", "DIRECT_MIN_SIZE", "DIRECT_READERS",
    "FILE_CHUNK", "HIDDEN_OUTSIDE", "LINKS", "NOT_REGULAR", "NOT_VOUCHED", "PROBLEMS", "RACY_MARGIN_NS",
    "REFUSED_HARDLINK", "REFUSED_LINK", "SMALL_READERS_PER_WORKER", "STAMP_FILE_NAME", "STAMP_FORMAT", "STATUS_ERROR",
    "STATUS_EXTRA", "STATUS_MISMATCH", "STATUS_MISSING", "STATUS_OK", "Digests", "FileResult", "FileStat", "Progress",
    "Report", "VerifyError", "atomic_write_text", "default_stamps_path", "default_workers", "digest_tree",
    "direct_buffers", "file_digest", "file_sha256", "foreign_links", "hash_file", "hash_many", "hash_small_file",
    "is_racy", "list_files", "load_stamps", "make_stamp", "save_stamps", "scan_tree", "stamp_vouches", "verify_tree",
]

DEFAULT_BUFSIZE = 4 << 20
STAMP_FILE_NAME = ".atlas-verified.json"
STAMP_FORMAT = 1
RACY_MARGIN_NS = 100_000_000  # > one kernel tick: coarse timestamps lag the real clock by <= 1 jiffy
COARSE_RACY_MARGIN_NS = 2_000_000_000  # filesystems with whole-second timestamps

Progress = Callable[[int, int], None]

STATUS_OK = "ok"
STATUS_MISMATCH = "mismatch"
STATUS_MISSING = "missing"
STATUS_EXTRA = "extra"
STATUS_ERROR = "error"

LINKS = ("follow", "refuse")  # verify_tree's ``links``: model directories may link; a bundle never does
REFUSED_LINK = "a symlink or special file, refused (a bundle holds regular files only; not followed)"
REFUSED_HARDLINK = ("a hard link to a file outside the tree, refused (another name of the same file is outside "
                    "it; not read)")
# links=follow: a file reached through a link to outside the root is still checked, but what it holds is never
# reported (a link to /etc/shadow must not print its digest).
HIDDEN_OUTSIDE = "a link to a file outside the root: its digests are not shown"
NOT_REGULAR = "not a regular file"
NOT_VOUCHED = "no stamp vouches for it (it would be read)"
# What a bad file's problem is called (FileResult.problem), worst digest first: the bundle's words.
PROBLEMS = ("missing", "unexpected", "size", "sha256", "md5", "symlink", "hardlink", "unreadable")


class VerifyError(Exception):
    """The verification could not run at all (root missing, not a directory)."""


@dataclass(frozen=True)
class FileStat:
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    dev: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@dataclass(frozen=True)
class Digests:
    size: int
    md5: str
    sha256: str

    def as_dict(self) -> dict:
        return {"size": self.size, "md5": self.md5, "sha256": self.sha256}


@dataclass(frozen=True)
class FileResult:
    path: str
    status: str
    source: str | None = None  # "read" | "stamp" | None
    expected: dict | None = None
    actual: dict | None = None
    mismatched: tuple[str, ...] = ()
    message: str = ""

    @property
    def problem(self) -> str:
        """'' when the file is good, else one of PROBLEMS; a mismatch is named by its first of size,
        sha256, md5 (what ``atlasctl bundle verify`` and install.sh report)."""
        if self.status == STATUS_MISSING:
            return "missing"
        if self.status == STATUS_EXTRA:
            return "unexpected"
        if self.status == STATUS_MISMATCH:
            return next(k for k in ("size", "sha256", "md5") if k in self.mismatched)
        if self.status == STATUS_ERROR:
            if self.message == REFUSED_HARDLINK:
                return "hardlink"
            return "symlink" if self.message in (REFUSED_LINK, NOT_REGULAR) else "unreadable"
        return ""

    @property
    def summary(self) -> str:
        """What is wrong in a few words, a mismatch by its first bad field (``sha256 mismatch:
        expected <hex>, got <hex>``); ``message`` has every bad field."""
        problem = self.problem
        if self.status == STATUS_MISMATCH and self.actual is not None:
            want, have = (self.expected or {}).get(problem), (self.actual or {}).get(problem)
            return f"{problem} mismatch: expected {want}, got {have}"
        return self.message

    def describe(self) -> str:
        return f"{self.path}: {self.summary}"

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "status": self.status,
            "source": self.source,
            "expected": self.expected,
            "actual": self.actual,
            "mismatched": list(self.mismatched),
            "message": self.message,
        }


@dataclass(frozen=True)
class Report:
    root: str
    results: tuple[FileResult, ...]
    allow_extra: bool
    bytes_read: int
    bytes_skipped: int
    seconds: float
    workers: int
    stamps_path: str | None
    stamps_changed: bool
    stamps_written: bool
    warnings: tuple[str, ...] = field(default=())

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def bad(self) -> list[FileResult]:
        bad_statuses = {STATUS_MISMATCH, STATUS_MISSING, STATUS_ERROR}
        if not self.allow_extra:
            bad_statuses.add(STATUS_EXTRA)
        return [r for r in self.results if r.status in bad_statuses]

    @property
    def failed(self) -> bool:
        return bool(self.bad)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def totals(self) -> dict:
        return {
            "files": len(self.results),
            "ok": self.count(STATUS_OK),
            "mismatch": self.count(STATUS_MISMATCH),
            "missing": self.count(STATUS_MISSING),
            "extra": self.count(STATUS_EXTRA),
            "error": self.count(STATUS_ERROR),
            "from_stamps": sum(1 for r in self.results if r.source == "stamp"),
            "bytes_read": self.bytes_read,
            "bytes_skipped": self.bytes_skipped,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 1),
            "workers": self.workers,
        }

    def failure_message(self) -> str:
        """One line per bad file, naming expected and actual digests (like get_url)."""
        lines = [f"verification of {self.root} failed for {len(self.bad)} file(s):"]
        lines.extend(f"  {r.path}: {r.message}" for r in self.bad)
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "root": self.root,
            "failed": self.failed,
            "allow_extra": self.allow_extra,
            "totals": self.totals(),
            "stamps_path": self.stamps_path,
            "stamps_changed": self.stamps_changed,
            "stamps_written": self.stamps_written,
            "warnings": list(self.warnings),
            "files": [r.as_dict() for r in self.results],
        }


# --- hashing: the portable reader ------------------------------------------------------------


def default_workers(n_files: int | None = None) -> int:
    """One thread per usable core (hashing is CPU-bound once the disk keeps up), at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    workers = max(1, min(cores, 8))
    if n_files is not None:
        workers = max(1, min(workers, n_files))
    return workers


def hash_file(
    path: str,
    bufsize: int = DEFAULT_BUFSIZE,
    on_bytes: Callable[[int], None] | None = None,
    buf: bytearray | None = None,
    md5_lane: ThreadPoolExecutor | None = None,
    direct: bool | None = None,
    direct_buffers: list[mmap.mmap] | None = None,
    opened: list | None = None,
) -> Digests:
    """md5 and sha256 of one file in a single sequential read.

    With ``md5_lane`` (a one-thread executor), md5 runs there over the same buffer while
    this thread runs sha256: both release the GIL on large buffers, so one file keeps two
    cores busy and the slower md5 no longer serialises behind sha256.

    ``direct``: read with O_DIRECT (None: for files of at least ``DIRECT_MIN_SIZE``) into
    ``direct_buffers`` (from ``direct_buffers()``: O_DIRECT needs page-aligned buffers), or
    fresh ones for this file; ``buf`` then holds only what is read buffered after O_DIRECT stops.
    ``opened``: a list the fstat of the descriptor read is appended to (what was read, whatever the path
    named meanwhile).
    """
    md5, sha = _new_md5(), hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        first = os.fstat(handle.fileno())
        if opened is not None:
            opened.append(first)
        length = first.st_size
        if direct is None:
            direct = length >= DIRECT_MIN_SIZE
        if length <= bufsize:  # one buffer: a hand-off to the lane would cost more than it saves
            md5_lane = None
        for chunk in _chunks(handle, path, bufsize, buf, direct, direct_buffers):
            _update(md5, sha, chunk, md5_lane)
            size += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return Digests(size=size, md5=md5.hexdigest(), sha256=sha.hexdigest())


def _update(md5, sha, chunk: memoryview, md5_lane: ThreadPoolExecutor | None) -> None:
    if md5_lane is None:
        md5.update(chunk)
        sha.update(chunk)
        return
    pending = md5_lane.submit(md5.update, chunk)
    sha.update(chunk)
    pending.result()


def _chunks(handle, path: str, bufsize: int, buf: bytearray | None, direct: bool,
            buffers: list[mmap.mmap] | None):
    """The chunks of an open file: with O_DIRECT (fast_read.direct_chunks) where asked and the filesystem
    allows it, the rest through the page cache."""
    fast = direct_chunks(path, bufsize, buffers) if direct else None
    if fast is None:
        return _buffered_chunks(handle, bufsize, buf)
    return _direct_then_buffered(fast, handle, bufsize, buf)


def _direct_then_buffered(fast, handle, bufsize: int, buf: bytearray | None):
    rest = yield from fast  # where O_DIRECT stopped: every byte from there is read once, buffered
    yield from _buffered_chunks(handle, bufsize, buf, offset=rest)


def _buffered_chunks(handle, bufsize: int, buf: bytearray | None = None, offset: int = 0):
    """Chunks of an open binary file from ``offset`` on (0: from where it stands), through one reused buffer
    (page cache). ``handle``: a file, or any binary file object (a zip member: no descriptor to advise; one
    without ``readinto`` is read with ``read``)."""
    buffer = buf if buf is not None else bytearray(bufsize)
    view = memoryview(buffer)
    if offset:
        handle.seek(offset)
    _advise_sequential(_fileno(handle))
    readinto = getattr(handle, "readinto", None)
    if readinto is None:
        while True:
            data = handle.read(bufsize)
            if not data:
                return
            yield memoryview(data)
    while True:
        n = readinto(buffer)
        if not n:
            return
        yield view[:n]


def _fileno(handle) -> int | None:
    try:
        return handle.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        return None


def _advise_sequential(fd: int | None) -> None:
    if fd is not None and hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


# --- hashing one file: the product's one streaming digest ------------------------------------

FILE_CHUNK = 1 << 20  # file_digest's read: 1 MiB, what a whole-file digest needs and no more (hashlib >= 2 KiB)


def file_digest(source, algorithms: tuple[str, ...] | list[str] = ("sha256",), chunk: int = FILE_CHUNK) -> dict:
    """{algorithm: hex digest} of a file's bytes, streamed: read through one reused buffer of ``chunk`` bytes
    (the page cache; at most ``chunk`` bytes of the file in memory, whatever its size), every algorithm fed the
    same bytes, so a file is read once however many digests it needs. Every file the product hashes is hashed
    here (a tree of model files: :func:`verify_tree`, with O_DIRECT and threads).

    ``source``: a path (str, bytes, os.PathLike), opened here as ``open(path, "rb")`` opens it (a symlink is
    followed; a directory raises IsADirectoryError, a missing file FileNotFoundError); or what a caller that
    must refuse a link or a special file opened itself (O_NOFOLLOW, fstat) and so hashes exactly that: a file
    descriptor (int), or an open binary file object (a file, a zip member; ``readinto`` or ``read``). Those
    are read from where they stand to their end and left open. ``algorithms``: hashlib names (md5 is asked
    for usedforsecurity=False: FIPS hosts). Standard library, Python 3.9 (managed nodes): not
    hashlib.file_digest (3.11).
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive number of bytes, not {chunk!r}")
    hashers = [(name, _new_md5() if name == "md5" else hashlib.new(name)) for name in algorithms]
    if not hashers:
        raise ValueError("file_digest needs at least one algorithm")
    if isinstance(source, bool):
        raise TypeError(f"not a file: {source!r}")
    if isinstance(source, int):
        with open(source, "rb", buffering=0, closefd=False) as handle:
            _feed(handle, hashers, chunk)
    elif isinstance(source, (str, bytes, os.PathLike)):
        with open(source, "rb", buffering=0) as handle:
            _feed(handle, hashers, chunk)
    else:
        _feed(source, hashers, chunk)
    return {name: hasher.hexdigest() for name, hasher in hashers}


def file_sha256(source, chunk: int = FILE_CHUNK) -> str:
    """The sha256 (hex) of a file's bytes, streamed: :func:`file_digest` with sha256 alone."""
    return file_digest(source, ("sha256",), chunk)["sha256"]


def _feed(handle, hashers: list, chunk: int) -> None:
    for data in _buffered_chunks(handle, chunk):
        for _name, hasher in hashers:
            hasher.update(data)


_MD5_FLAG: bool | None = None


def _md5_accepts_flag() -> bool:
    """hashlib.md5(usedforsecurity=False) works on FIPS hosts (RHEL-likes); Python >= 3.9 has the flag."""
    global _MD5_FLAG
    if _MD5_FLAG is None:
        try:
            hashlib.md5(usedforsecurity=False)
            _MD5_FLAG = True
        except TypeError:
            _MD5_FLAG = False
    return _MD5_FLAG


def _new_md5():
    return hashlib.md5(usedforsecurity=False) if _md5_accepts_flag() else hashlib.md5()


def hash_small_file(path: str, buf: mmap.mmap | bytearray, direct: bool = False) -> tuple[Digests, FileStat]:
    """md5 and sha256 of a file expected to fit in ``buf``, and the fstat of the file read.

    One open, one fstat (of the file being read: the caller's ``before``), one read into
    ``buf``, hashed in this thread: with many small files the per-file costs limit, not the
    hashing. ``direct``: that read is an O_DIRECT one (``buf`` page-aligned: an mmap) of a
    block more than fstat's size, so a short read proves the end: the storage writes into
    ``buf``, and the kernel neither fills the page cache nor copies (0.5 CPU-s/GB less than a
    cold buffered read of 4-256 KiB files). Where O_DIRECT is refused, the read is buffered.
    When the read does not end where fstat said the file ends (it grew, shrank, or does not
    fit in ``buf``), the rest is read on through the page cache to the file's end, so every
    byte there is hashed once; the caller's stat after the read then tells a changed file.
    """
    md5, sha = _new_md5(), hashlib.sha256()
    view = memoryview(buf)
    fd, direct = open_once(path, direct)
    try:
        st = os.fstat(fd)
        n, asked = first_read(fd, view, st.st_size, direct)
        _update(md5, sha, view[:n], None)
        size = n
        if n != st.st_size or n == asked:  # not at the end fstat saw: read on, buffered, to the end
            if direct:
                drop_direct(fd)
            while n := os.preadv(fd, [view], size):
                _update(md5, sha, view[:n], None)
                size += n
    finally:
        os.close(fd)
    return Digests(size=size, md5=md5.hexdigest(), sha256=sha.hexdigest()), FileStat.of(st)


# --- many files: one reader per file, on the fast path's pool ---------------------------------


@dataclass(frozen=True)
class _ReadOutcome:
    digests: Digests | None
    before: FileStat | None
    after: FileStat | None
    started_ns: int
    error: str | None = None


class _ByteCounter:
    def __init__(self, total: int, progress: Progress | None):
        self.total = total
        self.done = 0
        self._progress = progress
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            done = self.done
        if self._progress is not None:
            self._progress(done, self.total)


def hash_many(
    paths: dict[str, str],
    workers: int | None = None,
    bufsize: int = DEFAULT_BUFSIZE,
    progress: Progress | None = None,
    sizes: dict[str, int] | None = None,
    direct: bool | None = None,
) -> dict[str, _ReadOutcome]:
    """Hash {key: path} in parallel, largest first, by a pool of ``workers`` reader threads
    (fast_read.read_all: the order, the tail, the extra readers of small files, the read-ahead).

    * A file of more than one buffer (by ``sizes``) is read by ``hash_file`` with an md5 lane
      of its reader's own, so one file keeps up to two cores hashing (md5 on one, sha256 on
      part of the other).
    * A file of at most one buffer is read in one read by ``hash_small_file`` (O_DIRECT unless
      ``direct`` is False) and hashed in its reader thread: no lane, no future per file.
    """
    sizes = sizes or {}
    order = sorted(paths, key=lambda k: -sizes.get(k, 0))
    counter = _ByteCounter(sum(sizes.get(k, 0) for k in order), progress)
    local = threading.local()
    lanes: list[ThreadPoolExecutor] = []
    results: dict[str, _ReadOutcome] = {}

    def read(k: str, small: bool) -> None:
        if small:
            results[k] = _read_small(paths[k], bufsize, counter, local, direct)
        else:
            results[k] = _read_one(paths[k], bufsize, counter, local, lanes, direct)

    try:
        read_all(paths, order, sizes, bufsize, workers or default_workers(len(order)), direct, read)
    finally:
        for lane in lanes:
            lane.shutdown(wait=True)
    return {k: results[k] for k in order}


def _read_one(
    path: str, bufsize: int, counter: _ByteCounter, local: threading.local, lanes: list | None = None,
    direct: bool | None = None,
) -> _ReadOutcome:
    """A large file by ``hash_file``, with this reader thread's buffers and md5 lane (made on its first file)."""
    buf = getattr(local, "buf", None)
    if buf is None or len(buf) != bufsize:
        buf = local.buf = bytearray(bufsize)
    lane = None
    if lanes is not None:
        lane = getattr(local, "lane", None)
        if lane is None:
            lane = local.lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-md5")
            lanes.append(lane)
    if direct is not False and HAVE_DIRECT and getattr(local, "direct", None) is None:
        local.direct = direct_buffers(bufsize)
    started = time.time_ns()
    try:
        named = os.stat(path)
        opened: list[os.stat_result] = []
        digests = hash_file(path, bufsize, counter.add, buf, lane, direct, getattr(local, "direct", None), opened)
        before = FileStat.of(opened[0] if opened else named)  # the descriptor read, as it was opened
        after = FileStat.of(os.stat(path))
    except OSError as exc:
        return _unreadable(started, exc)
    return _ReadOutcome(digests, before, after, started)


def _read_small(
    path: str, bufsize: int, counter: _ByteCounter, local: threading.local, direct: bool | None
) -> _ReadOutcome:
    """A file of at most one buffer by ``hash_small_file``, into this reader thread's page-aligned buffer."""
    buf = getattr(local, "small", None)
    if buf is None or len(buf) != aligned(bufsize):
        buf = local.small = mmap.mmap(-1, aligned(bufsize))
    started = time.time_ns()
    try:
        digests, before = hash_small_file(path, buf, direct is not False)
        after = FileStat.of(os.stat(path))
    except OSError as exc:
        return _unreadable(started, exc)
    counter.add(digests.size)
    return _ReadOutcome(digests, before, after, started)


def _unreadable(started_ns: int, exc: OSError) -> _ReadOutcome:
    return _ReadOutcome(None, None, None, started_ns, error=f"cannot read: {exc.strerror or exc}")


# --- tree listing ----------------------------------------------------------------------------


def scan_tree(root: str) -> tuple[list[str], list[str]]:
    """(regular files, anything else: symlinks, devices, fifos) under root as sorted relative posix
    paths. Nothing is followed: a symlink is reported, never read through (lstat only)."""
    files: list[str] = []
    odd: list[str] = []

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                rel = prefix + entry.name
                if entry.is_symlink():
                    odd.append(rel)
                elif entry.is_dir(follow_symlinks=False):
                    walk(entry.path, rel + "/")
                elif entry.is_file(follow_symlinks=False):
                    files.append(rel)
                else:
                    odd.append(rel)

    try:
        walk(root, "")
    except OSError as exc:
        raise VerifyError(f"{exc.filename or root}: cannot list: {exc.strerror or exc}") from None
    return sorted(files), sorted(odd)


def foreign_links(root: str, rels: list[str], linked_from: tuple | list = ()) -> list[str]:
    """The files among ``rels`` (every regular file under root, relative, as :func:`scan_tree` lists them)
    that are hard links to a file with a name outside root: more links (``st_nlink``) than names of the same
    file (``st_dev``, ``st_ino``) under root. A file at the same relative path under a ``linked_from`` root
    that is the same file counts as inside: a verified file hard-linked from the node's bundle (one copy per
    node), or from the version it replaces. An entry ``(directory, prefix)`` maps the other way: a file at
    ``<prefix><rest>`` under root counts as inside when ``<directory>/<rest>`` is the same file (the bundle's
    ``models/<name>/`` and a model version staged from it by hard links, :func:`linked_trees`). One lstat per
    file (and per entry that names it); nothing is read."""
    stats: dict[str, os.stat_result] = {}
    for rel in rels:
        try:
            stats[rel] = os.lstat(os.path.join(root, rel))
        except OSError:
            continue
    names: dict[tuple[int, int], int] = {}
    for st in stats.values():
        names[(st.st_dev, st.st_ino)] = names.get((st.st_dev, st.st_ino), 0) + 1
    foreign = []
    for rel, st in stats.items():
        if st.st_nlink <= 1:
            continue
        inside = names[(st.st_dev, st.st_ino)]
        for other in linked_from:
            directory, prefix = (other, "") if isinstance(other, str) else other
            if not rel.startswith(prefix):
                continue
            try:
                twin = os.lstat(os.path.join(directory, rel[len(prefix):]))
            except OSError:
                continue
            if (twin.st_dev, twin.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(twin.st_mode):
                inside += 1
        if st.st_nlink > inside:
            foreign.append(rel)
    return sorted(foreign)


def linked_trees(models_root: str) -> list[tuple[str, str]]:
    """``linked_from`` entries for a bundle on a node whose models are staged by hard links: every version
    directory ``<models_root>/<name>/versions/<v>`` with the prefix ``models/<name>/`` under which the
    bundle holds that model's files. A models root that does not exist gives none."""
    out = []
    try:
        names = sorted(os.listdir(models_root))
    except OSError:
        return out
    for name in names:
        versions = os.path.join(models_root, name, "versions")
        try:
            found = sorted(os.listdir(versions))
        except OSError:
            continue
        out += [(os.path.join(versions, v), f"models/{name}/") for v in found
                if os.path.isdir(os.path.join(versions, v)) and not os.path.islink(os.path.join(versions, v))]
    return out


def list_files(root: str, ignore: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Regular files (symlinks to files included) under root, as sorted relative posix paths."""
    return _present(root, *scan_tree(root), ignore)


def _present(root: str, files: list[str], odd: list[str], ignore: set[str] | frozenset[str]) -> list[str]:
    found = files + [rel for rel in odd if os.path.isfile(os.path.join(root, rel))]
    return sorted(rel for rel in found if rel not in ignore and not _is_stamp_temp(rel))


def _outside(root: str, rels: set[str], regular: list[str], foreign: Callable[[], list[str]]) -> set[str]:
    """Of ``rels`` (files verify_tree reports on, links followed), those that are a file outside root: reached
    through a symlink to outside, or a hard link with a name outside (``foreign``, called only when needed)."""
    inside = set(regular)
    out = set()
    via_link = {}
    for rel in rels - inside:
        real = os.path.realpath(os.path.join(root, rel))
        target = os.path.relpath(real, root).replace(os.sep, "/")
        if target == ".." or target.startswith("../") or target not in inside:
            out.add(rel)
        else:
            via_link[rel] = target
    candidates = rels & inside | set(via_link.values())
    multi = {rel for rel in candidates if _nlink(os.path.join(root, rel)) > 1}
    if multi:
        linked = set(foreign())
        out |= {rel for rel in rels & inside if rel in linked}
        out |= {rel for rel, target in via_link.items() if target in linked}
    return out


def _nlink(path: str) -> int:
    try:
        return os.lstat(path).st_nlink
    except OSError:
        return 1


def _hide(result: FileResult) -> FileResult:
    """``result`` without what the file holds (digests), for a file outside the root (:data:`HIDDEN_OUTSIDE`)."""
    if result.status == STATUS_MISMATCH:
        message = f"{', '.join(result.mismatched)} mismatch; {HIDDEN_OUTSIDE}"
    elif result.status == STATUS_ERROR and result.actual is not None:
        message = f"{result.message.split(';')[0]}; {HIDDEN_OUTSIDE}"
    else:
        message = result.message
    return FileResult(result.path, result.status, result.source, result.expected, None, result.mismatched, message)


def _is_stamp_temp(rel: str) -> bool:
    return os.path.basename(rel).startswith(STAMP_FILE_NAME + ".")


def digest_tree(
    root: str,
    workers: int | None = None,
    bufsize: int = DEFAULT_BUFSIZE,
    progress: Progress | None = None,
    ignore: set[str] | frozenset[str] = frozenset(),
    identities: dict[str, os.stat_result] | None = None,
) -> dict[str, Digests]:
    """{relative path: Digests} of every file under root (for writing manifests). ``identities``: {relative
    path: lstat} of the files a check found (module_utils/paths.py ``tree_files``): a file not among them, or
    one whose descriptor read is not that file, is a VerifyError and nothing is returned."""
    root = _check_root(root)
    rels = list_files(root, set(ignore) | {STAMP_FILE_NAME})
    if identities is not None:
        _same_files(root, {rel: None for rel in rels}, identities)
    paths = {rel: os.path.join(root, rel) for rel in rels}
    sizes = {rel: os.stat(p).st_size for rel, p in paths.items()}
    outcomes = hash_many(paths, workers, bufsize, progress, sizes)
    if identities is not None:
        _same_files(root, {rel: outcome.before for rel, outcome in outcomes.items()}, identities)
    result = {}
    for rel in rels:
        outcome = outcomes[rel]
        if outcome.digests is None:
            raise VerifyError(f"{paths[rel]}: {outcome.error}")
        result[rel] = outcome.digests
    return result


def _same_files(root: str, seen: dict[str, FileStat | None], identities: dict[str, os.stat_result]) -> None:
    """VerifyError unless each file ``seen`` ({rel: the stat of what was read, None: not read yet}) is the file
    ``identities`` holds for it (device and inode): a file swapped after the check is never reported."""
    changed = [rel for rel, st in sorted(seen.items()) if rel not in identities
               or (st is not None and (st.dev, st.ino) != (identities[rel].st_dev, identities[rel].st_ino))]
    if changed:
        raise VerifyError(f"{root}: {', '.join(changed[:5])}: not the file checked before it was read (added, "
                          "replaced or linked meanwhile; nothing of it is shown); run again once the tree is quiet")


def _check_root(root: str) -> str:
    real = os.path.realpath(root)
    if not os.path.isdir(real):
        raise VerifyError(f"{root}: not a directory; pass the directory that the checksums describe "
                          "(a model, a bundle)")
    return real


# --- stamps ----------------------------------------------------------------------------------


def default_stamps_path(root: str) -> str:
    return os.path.join(root, STAMP_FILE_NAME)


def load_stamps(stamps_path: str, root: str) -> tuple[dict[str, dict], str | None]:
    """Stamps for this root; anything unreadable counts as no stamps (returned with a warning)."""
    try:
        with open(stamps_path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        return {}, f"{stamps_path}: ignoring unreadable stamp file ({exc}); files will be read"
    if not isinstance(data, dict) or data.get("format") != STAMP_FORMAT or data.get("root") != root:
        return {}, None
    files = data.get("files")
    return (files if isinstance(files, dict) else {}), None


def atomic_write_text(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically: temp file in the same directory, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_stamps(stamps_path: str, root: str, stamps: dict[str, dict]) -> None:
    doc = {"format": STAMP_FORMAT, "root": root, "files": dict(sorted(stamps.items()))}
    atomic_write_text(stamps_path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def make_stamp(st: FileStat, digests: Digests) -> dict:
    return {
        "size": st.size,
        "mtime_ns": st.mtime_ns,
        "ctime_ns": st.ctime_ns,
        "ino": st.ino,
        "dev": st.dev,
        "md5": digests.md5,
        "sha256": digests.sha256,
    }


def stamp_vouches(stamp: dict | None, st: FileStat, expected: Expected) -> bool:
    """True only if nothing about the file or the expectation changed since the stamp."""
    if not isinstance(stamp, dict):
        return False
    for key in ("size", "mtime_ns", "ctime_ns", "ino", "dev"):
        if stamp.get(key) != getattr(st, key):
            return False
    if expected.size is not None and expected.size != st.size:
        return False
    declared = [alg for alg in ALGORITHMS if expected.digest(alg)]
    return bool(declared) and all(stamp.get(alg) == expected.digest(alg) for alg in declared)


def is_racy(st: FileStat, started_ns: int) -> bool:
    """Changed so close to the read that a later edit could keep the same timestamps."""
    coarse = st.ctime_ns % 1_000_000_000 == 0 and st.mtime_ns % 1_000_000_000 == 0
    margin = COARSE_RACY_MARGIN_NS if coarse else RACY_MARGIN_NS
    return max(st.ctime_ns, st.mtime_ns) >= started_ns - margin


# --- verification ----------------------------------------------------------------------------


def _compare(exp: Expected, digests: Digests) -> tuple[tuple[str, ...], str]:
    bad = []
    parts = []
    if exp.size is not None and exp.size != digests.size:
        bad.append("size")
        parts.append(f"size expected {exp.size}, actual {digests.size}")
    for alg in ALGORITHMS:
        want = exp.digest(alg)
        have = getattr(digests, alg)
        if want is not None and want != have:
            bad.append(alg)
            parts.append(f"{alg} expected {want}, actual {have}")
    return tuple(bad), "; ".join(parts)


def _result_from_read(rel: str, exp: Expected, outcome: _ReadOutcome) -> FileResult:
    expected = exp.as_dict()
    if outcome.digests is None:
        return FileResult(rel, STATUS_ERROR, "read", expected, None, (), outcome.error or "cannot read")
    actual = outcome.digests.as_dict()
    if outcome.before != outcome.after:
        return FileResult(
            rel,
            STATUS_ERROR,
            "read",
            expected,
            actual,
            (),
            "file changed while it was being read; run the verification again",
        )
    bad, text = _compare(exp, outcome.digests)
    if bad:
        return FileResult(rel, STATUS_MISMATCH, "read", expected, actual, bad, text)
    return FileResult(rel, STATUS_OK, "read", expected, actual)


def verify_tree(
    root: str,
    expected: dict[str, Expected],
    stamps_path: str | None = None,
    full: bool = False,
    workers: int | None = None,
    allow_extra: bool = False,
    write_stamps: bool = True,
    ignore: set[str] | frozenset[str] = frozenset(),
    progress: Progress | None = None,
    bufsize: int = DEFAULT_BUFSIZE,
    direct: bool | None = None,
    links: str = "follow",
    listed_in: str = "the checksum list",
    read: bool = True,
    linked_from: tuple | list = (),
    identities: dict[str, os.stat_result] | None = None,
) -> Report:
    """Verify every expected file under root; report ok/mismatch/missing/extra/error per file.

    stamps_path None disables stamps. write_stamps False is check mode: nothing is written,
    but ``stamps_changed`` still says whether a real run would write them. ``direct``: read
    with O_DIRECT (True), through the page cache (False), or by file size (None, see hash_file).
    ``links``: ``follow`` symlinks (a model directory may link to its blobs), or ``refuse`` them:
    every symlink or special file under root is an error, never read through, and so is a hard link
    to a file with a name outside root (a bundle; :func:`foreign_links`, ``linked_from``: roots whose
    file at the same relative path counts as inside). Followed, a file outside root (through a symlink
    or a hard link) is checked, but its digests are never reported (:data:`HIDDEN_OUTSIDE`).
    ``listed_in`` names the expectation in the message of an extra file.
    ``read`` False reads no file: one that no stamp vouches for is an error (NOT_VOUCHED), so the
    report proves from stamps alone that a run would read nothing (a stage's fast path).
    ``identities``: {relative path: lstat} of the files a check found (module_utils/paths.py ``tree_files``):
    a file stat'ed or read that is not the one checked is a VerifyError (nothing reported, no stamp written).
    """
    if links not in LINKS:
        raise VerifyError(f"links must be one of {', '.join(LINKS)}, not {links!r}")
    t0 = time.perf_counter()
    root = _check_root(root)
    tree = _Listing.of(root, links, linked_from)
    warnings: list[str] = []
    old_stamps: dict[str, dict] = {}
    if stamps_path:
        old_stamps, warning = load_stamps(stamps_path, root)
        warnings += [warning] if warning else []
    ignore_set = _ignored(root, ignore, stamps_path)
    plan = _Plan(tree.refused(expected, ignore_set))
    plan.look(root, expected, tree.regular, old_stamps, full)
    if identities is not None:
        _same_files(root, dict(plan.seen), identities)
    if not read:
        plan.unread(expected)
        write_stamps = False
    outcomes = hash_many(plan.to_read, workers, bufsize, progress, plan.sizes, direct)
    if identities is not None:
        _same_files(root, {rel: outcome.before for rel, outcome in outcomes.items()}, identities)
    bytes_read = plan.read(expected, outcomes)
    results = plan.results
    for rel in tree.present(ignore_set):
        if rel not in expected:
            results[rel] = _not_read(rel, None, STATUS_EXTRA, f"not in {listed_in} (unexpected extra file)")
    if links == "follow":
        for rel in _outside(root, set(results), tree.files, lambda: foreign_links(root, tree.files, linked_from)):
            results[rel] = _hide(results[rel])
    stamps_changed = bool(stamps_path) and plan.new_stamps != old_stamps
    stamps_written = stamps_changed and write_stamps and _write_stamps(stamps_path, root, plan.new_stamps, warnings)
    return Report(root=root, results=tuple(results[k] for k in sorted(results)), allow_extra=allow_extra,
                  bytes_read=bytes_read, bytes_skipped=plan.bytes_skipped, seconds=time.perf_counter() - t0,
                  workers=workers or default_workers(len(plan.to_read)), stamps_path=stamps_path,
                  stamps_changed=stamps_changed, stamps_written=stamps_written, warnings=tuple(warnings))


@dataclass(frozen=True)
class _Listing:
    """What is under a root: regular files, anything else (``odd``), and with links refused, the hard links to a
    file outside it (``foreign``) and the files that count (``regular``; None: links followed, all of them)."""

    root: str
    files: list[str]
    odd: list[str]
    foreign: list[str]
    regular: set[str] | None

    @classmethod
    def of(cls, root: str, links: str, linked_from: tuple[str, ...] | list[str]) -> _Listing:
        files, odd = scan_tree(root)
        if links != "refuse":
            return cls(root, files, odd, [], None)
        foreign = foreign_links(root, files, linked_from)
        return cls(root, files, odd, foreign, set(files) - set(foreign))

    def refused(self, expected: dict[str, Expected], ignore: set[str]) -> dict[str, FileResult]:
        """Links refused (none when followed): each an error, never read."""
        results = {}
        for rel in self.odd if self.regular is not None else ():
            results[rel] = _not_read(rel, expected.get(rel), STATUS_ERROR, REFUSED_LINK)
        for rel in self.foreign:
            if rel not in ignore:
                results[rel] = _not_read(rel, expected.get(rel), STATUS_ERROR, REFUSED_HARDLINK)
        return results

    def present(self, ignore: set[str]) -> list[str]:
        """The files there, as the expectation must list them (``ignore`` and stamp temporaries left out)."""
        if self.regular is None:
            return _present(self.root, self.files, self.odd, ignore)
        return sorted(rel for rel in self.regular if rel not in ignore and not _is_stamp_temp(rel))


def _not_read(rel: str, exp: Expected | None, status: str, message: str) -> FileResult:
    return FileResult(rel, status, None, exp.as_dict() if exp else None, None, (), message)


def _ignored(root: str, ignore: set[str] | frozenset[str], stamps_path: str | None) -> set[str]:
    """``ignore`` and the stamp file, where it is under root."""
    ignore_set = set(ignore)
    if stamps_path:
        ignore_set.add(os.path.relpath(os.path.realpath(stamps_path), root).replace(os.sep, "/"))
    return ignore_set


class _Plan:
    """verify_tree's results as they come: those known without reading, then the files read."""

    def __init__(self, results: dict[str, FileResult]):
        self.results = results
        self.new_stamps: dict[str, dict] = {}
        self.to_read: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        self.seen: dict[str, FileStat] = {}  # the stat of each expected file found
        self.bytes_skipped = 0

    def look(self, root: str, expected: dict[str, Expected], regular: set[str] | None, old_stamps: dict[str, dict],
             full: bool) -> None:
        """Each expected file not decided yet: missing, not a regular file, vouched for by its stamp, or to read."""
        for rel, exp in sorted(expected.items()):
            if rel in self.results:
                continue
            path = os.path.join(root, rel)
            found = _stat_expected(rel, exp, path, regular)
            if isinstance(found, FileResult):
                self.results[rel] = found
                continue
            st = self.seen[rel] = FileStat.of(found)
            stamp = old_stamps.get(rel)
            if not full and stamp_vouches(stamp, st, exp):
                actual = {"size": st.size, "md5": stamp["md5"], "sha256": stamp["sha256"]}
                self.results[rel] = FileResult(rel, STATUS_OK, "stamp", exp.as_dict(), actual)
                self.new_stamps[rel] = stamp
                self.bytes_skipped += st.size
            else:
                self.to_read[rel] = path
                self.sizes[rel] = st.size

    def unread(self, expected: dict[str, Expected]) -> None:
        """Read nothing: each file to read is one no stamp vouches for."""
        for rel in self.to_read:
            self.results[rel] = _not_read(rel, expected[rel], STATUS_ERROR, NOT_VOUCHED)
        self.to_read = {}

    def read(self, expected: dict[str, Expected], outcomes: dict[str, _ReadOutcome]) -> int:
        """The files read, compared and stamped (unless changed too recently: is_racy); the bytes read."""
        bytes_read = 0
        for rel, outcome in outcomes.items():
            result = self.results[rel] = _result_from_read(rel, expected[rel], outcome)
            if outcome.digests is not None:
                bytes_read += outcome.digests.size
            if result.status == STATUS_OK and outcome.after is not None and outcome.digests is not None:
                if not is_racy(outcome.after, outcome.started_ns):
                    self.new_stamps[rel] = make_stamp(outcome.after, outcome.digests)
        return bytes_read


def _stat_expected(rel: str, exp: Expected, path: str, regular: set[str] | None) -> os.stat_result | FileResult:
    """The stat of an expected file, or its result when it cannot be read: missing, or not a regular file."""
    if regular is not None and rel not in regular:  # under a refused link, or not there at all
        return _not_read(rel, exp, STATUS_MISSING, "missing")
    try:
        raw = os.stat(path)
    except FileNotFoundError:
        return _not_read(rel, exp, STATUS_MISSING, "missing")
    except OSError as exc:
        return _not_read(rel, exp, STATUS_ERROR, f"cannot stat: {exc.strerror}")
    if not stat.S_ISREG(raw.st_mode):  # what os.path.isfile says, from the same stat
        return _not_read(rel, exp, STATUS_ERROR, NOT_REGULAR)
    return raw


def _write_stamps(stamps_path: str, root: str, stamps: dict[str, dict], warnings: list[str]) -> bool:
    """Save the stamps; False, with a warning, where they cannot be written."""
    try:
        save_stamps(stamps_path, root, stamps)
    except OSError as exc:
        warnings.append(
            f"{stamps_path}: cannot write stamps ({exc.strerror}); the next run will read "
            "every file again. Set a writable stamp path outside the model directory."
        )
        return False
    return True
