# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One-pass md5 + sha256 verification of a directory tree, with verification stamps.

* Each file is read once, into reused buffers; md5 and sha256 are fed the same bytes.
* Files are hashed in parallel threads (hashlib releases the GIL on buffers >= 2 KiB).
* A file of at least ``DIRECT_MIN_SIZE`` is read with O_DIRECT, alone or beside others, by
  ``DIRECT_READERS`` prefetch threads (reads in flight) while the current buffer is hashed: the
  storage writes straight into the buffer, so the kernel neither fills the page cache nor
  copies the data. Measured on the project's 2-core machine, a cold buffered read costs
  0.7 CPU-s/GB of kernel time and an O_DIRECT one 0.1, against 2.9 for md5+sha256: the
  buffered read alone would take a fifth of the hashing's CPU (docs/performance.md and
  DESIGN.md, "Fast paths"). Where O_DIRECT is refused (tmpfs, some overlay and network filesystems:
  EINVAL) or a read ends short of the block size, the rest of the file is read buffered.
  Files between one buffer and ``DIRECT_MIN_SIZE`` are read buffered, advised to the kernel
  (WILLNEED) a window ahead of the readers.
* A file of at most one buffer is read in one O_DIRECT read into a page-aligned buffer of its
  reader (``hash_small_file``) and hashed in that thread: no md5 lane, no future per file, one
  open, one fstat, one read, one stat after. Once the large files are all taken, more readers
  join (``SMALL_READERS_PER_WORKER``): a cold small file is a round trip to the storage, and
  its reader hashes nothing meanwhile.
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

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import mmap
import os
import queue
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# Ansible ships module_utils under ansible_collections; atlasctl puts <repo>/collections on sys.path.
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ALGORITHMS, Expected

DEFAULT_BUFSIZE = 4 << 20
# O_DIRECT for files of at least this size (smaller ones: a buffered read costs little and
# a direct one a round trip to the storage per file); buffers in flight per file.
DIRECT_MIN_SIZE = 8 << 20
DIRECT_READERS = 2  # O_DIRECT reads in flight per file: one alone leaves the device idle between requests
DIRECT_BUFFERS_PER_READER = 2  # one being read into while the other is hashed
# Files read through the page cache are advised to the kernel (WILLNEED) this far ahead of the readers.
READAHEAD_FILES = 32
READAHEAD_BYTES = 32 << 20
# Readers of small files per hashing worker: a cold small file is a round trip to the storage.
SMALL_READERS_PER_WORKER = 2
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


# --- hashing ---------------------------------------------------------------------------------


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
) -> Digests:
    """md5 and sha256 of one file in a single sequential read.

    With ``md5_lane`` (a one-thread executor), md5 runs there over the same buffer while
    this thread runs sha256: both release the GIL on large buffers, so one file keeps two
    cores busy and the slower md5 no longer serialises behind sha256.

    ``direct``: read with O_DIRECT (None: for files of at least ``DIRECT_MIN_SIZE``);
    ``buf`` is then not used (O_DIRECT needs page-aligned buffers): ``direct_buffers``
    (from ``direct_buffers()``) are, or fresh ones for this file.
    """
    md5 = hashlib.md5(usedforsecurity=False) if _md5_accepts_flag() else hashlib.md5()
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        length = os.fstat(handle.fileno()).st_size
        if direct is None:
            direct = length >= DIRECT_MIN_SIZE
        if length <= bufsize:  # one buffer: a hand-off to the lane would cost more than it saves
            md5_lane = None
        chunks = _direct_chunks(path, bufsize, direct_buffers) if direct and _HAVE_DIRECT else None
        if chunks is None:
            chunks = _buffered_chunks(handle, bufsize, buf)
        for chunk in chunks:
            if md5_lane is not None:
                pending = md5_lane.submit(md5.update, chunk)
                sha.update(chunk)
                pending.result()
            else:
                md5.update(chunk)
                sha.update(chunk)
            n = len(chunk)
            size += n
            if on_bytes is not None:
                on_bytes(n)
    return Digests(size=size, md5=md5.hexdigest(), sha256=sha.hexdigest())


def _buffered_chunks(handle, bufsize: int, buf: bytearray | None = None, offset: int = 0):
    """Chunks of an open file from ``offset`` on, through one reused buffer (page cache)."""
    buffer = buf if buf is not None else bytearray(bufsize)
    view = memoryview(buffer)
    if offset:
        handle.seek(offset)
    _advise_sequential(handle.fileno())
    while True:
        n = handle.readinto(buffer)
        if not n:
            return
        yield view[:n]


_HAVE_DIRECT = hasattr(os, "O_DIRECT") and hasattr(os, "preadv")
_DONE = object()


def direct_buffers(bufsize: int) -> list[mmap.mmap]:
    """The page-aligned buffers one O_DIRECT read uses; a thread that reads many files keeps
    one set (fresh anonymous memory costs a page fault and a page of zeros per 4 KiB)."""
    size = max(mmap.PAGESIZE, bufsize - bufsize % mmap.PAGESIZE)
    return [mmap.mmap(-1, size) for _buffer in range(DIRECT_READERS * DIRECT_BUFFERS_PER_READER)]


def _direct_chunks(path: str, bufsize: int, buffers: list[mmap.mmap] | None = None):
    """Chunks of ``path`` read with O_DIRECT, the next ones read ahead by a prefetch thread.

    Yields memoryviews into ``buffers`` (``direct_buffers(bufsize)``; fresh ones, freed at
    the end, when None); ``DIRECT_READERS`` reads are in flight; a buffer is read into
    again only after the consumer has asked for the chunk after it. Where O_DIRECT is
    refused, or a read ends off the block grid (the file's end, or a filesystem that returns
    less), the remainder is read buffered from that offset: every byte is yielded once.
    Returns None (nothing yielded) when the file cannot be opened with O_DIRECT at all.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    return _direct_gen(fd, path, bufsize, buffers)


def _direct_gen(fd: int, path: str, bufsize: int, buffers: list[mmap.mmap] | None):
    bufsize = max(mmap.PAGESIZE, bufsize - bufsize % mmap.PAGESIZE)
    owned = buffers is None
    if buffers is None:
        buffers = direct_buffers(bufsize)
    elif len(buffers) != DIRECT_READERS * DIRECT_BUFFERS_PER_READER or any(len(b) != bufsize for b in buffers):
        raise ValueError(f"O_DIRECT buffers: got {len(buffers)} of {sorted({len(b) for b in buffers})} bytes; "
                         f"pass direct_buffers({bufsize})")  # fmt: skip
    try:
        end = os.fstat(fd).st_size
    except OSError:
        end = 0
    # Reader k reads chunks k, k + R, k + 2R, ... into buffers of its own, so R reads are in flight
    # while the consumer hashes; chunk i is taken from reader i % R, in order.
    lanes = [(queue.Queue(), queue.Queue()) for _reader in range(DIRECT_READERS)]
    for i, b in enumerate(buffers):
        lanes[i % DIRECT_READERS][0].put(b)
    stop = threading.Event()

    def prefetch(k: int) -> None:
        free, full = lanes[k]
        offset = k * bufsize
        try:
            while not stop.is_set():
                if offset >= end:  # past the size at open: what is there (normally nothing) is read buffered
                    full.put(("fallback", offset, None))
                    return
                b = free.get()
                if b is _DONE:
                    return
                try:
                    n = os.preadv(fd, [b], offset)
                except OSError as exc:
                    full.put(("fallback", offset, exc))
                    return
                full.put(("data", b, n))
                if n < bufsize:  # the end, or a short read off the block grid: the consumer goes on buffered
                    return
                offset += DIRECT_READERS * bufsize
        except BaseException as exc:  # noqa: BLE001 (handed to the consumer)
            full.put(("error", 0, exc))

    readers = [threading.Thread(target=prefetch, args=(k,), name=f"verify-prefetch-{k}", daemon=True)
               for k in range(DIRECT_READERS)]  # fmt: skip
    for reader in readers:
        reader.start()
    offset = 0
    try:
        for i in itertools.count():
            free, full = lanes[i % DIRECT_READERS]
            kind, a, b = full.get()
            if kind == "data":
                if b:
                    yield memoryview(a)[:b]
                offset += b
                if b == bufsize:
                    free.put(a)
                    continue
                a = offset  # a short read: the rest from here, buffered
            elif kind != "fallback":
                raise b
            with open(path, "rb", buffering=0) as handle:
                yield from _buffered_chunks(handle, bufsize, offset=a)
            return
    finally:
        stop.set()
        for free, _filled in lanes:
            free.put(_DONE)
        for reader in readers:
            reader.join()
        os.close(fd)
        for m in buffers if owned else ():
            try:
                m.close()
            except BufferError:  # a view the consumer still holds: freed with it
                pass


def _advise_sequential(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


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


def _read_one(
    path: str, bufsize: int, counter: _ByteCounter, local: threading.local, lanes: list | None = None,
    direct: bool | None = None,
) -> _ReadOutcome:
    buf = _thread_buffer(local, bufsize)
    lane = None
    if lanes is not None:
        lane = getattr(local, "lane", None)
        if lane is None:
            lane = local.lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-md5")
            lanes.append(lane)
    if direct is not False and _HAVE_DIRECT and getattr(local, "direct", None) is None:
        local.direct = direct_buffers(bufsize)
    started = time.time_ns()
    try:
        before = FileStat.of(os.stat(path))
        digests = hash_file(path, bufsize, counter.add, buf, lane, direct, getattr(local, "direct", None))
        after = FileStat.of(os.stat(path))
    except OSError as exc:
        return _ReadOutcome(None, None, None, started, error=f"cannot read: {exc.strerror or exc}")
    return _ReadOutcome(digests, before, after, started)


def _thread_buffer(local: threading.local, bufsize: int) -> bytearray:
    buf = getattr(local, "buf", None)
    if buf is None or len(buf) != bufsize:
        buf = local.buf = bytearray(bufsize)
    return buf


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
    md5 = hashlib.md5(usedforsecurity=False) if _md5_accepts_flag() else hashlib.md5()
    sha = hashlib.sha256()
    view = memoryview(buf)
    fd = _open_direct(path) if direct else None
    if fd is None:
        fd = os.open(path, _O_RDONLY)
        direct = False
    try:
        st = os.fstat(fd)
        n, asked = _first_read(fd, view, st.st_size, direct)
        md5.update(view[:n])
        sha.update(view[:n])
        size = n
        if n != st.st_size or n == asked:  # not at the end fstat saw: read on, buffered, to the end
            if direct:
                _drop_direct(fd)
            while n := os.preadv(fd, [view], size):
                md5.update(view[:n])
                sha.update(view[:n])
                size += n
    finally:
        os.close(fd)
    return Digests(size=size, md5=md5.hexdigest(), sha256=sha.hexdigest()), FileStat.of(st)


_O_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_DIRECT_ALIGN = 4096  # O_DIRECT lengths: a multiple of the logical block size (512 or 4096)


def _open_direct(path: str) -> int | None:
    if not _HAVE_DIRECT:
        return None
    try:
        return os.open(path, _O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # this filesystem refuses O_DIRECT: read buffered
            return None
        raise


def _drop_direct(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


def _first_read(fd: int, view: memoryview, expected: int, direct: bool) -> tuple[int, int]:
    """(bytes read, bytes asked) of the first read from offset 0."""
    if direct:
        asked = min(len(view), (expected // _DIRECT_ALIGN + 1) * _DIRECT_ALIGN)
        try:
            return os.preadv(fd, [view[:asked]], 0), asked
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: alignment refused here; anything else is the file's
                raise
            _drop_direct(fd)
    return os.preadv(fd, [view], 0), len(view)


def _small_buffer(local: threading.local, bufsize: int) -> mmap.mmap:
    """This thread's page-aligned buffer for small files, kept from file to file."""
    buf = getattr(local, "small", None)
    if buf is None or len(buf) != _aligned(bufsize):
        buf = local.small = mmap.mmap(-1, _aligned(bufsize))
    return buf


def _aligned(bufsize: int) -> int:
    return max(mmap.PAGESIZE, bufsize - bufsize % mmap.PAGESIZE)


def _read_small(
    path: str, bufsize: int, counter: _ByteCounter, local: threading.local, direct: bool | None
) -> _ReadOutcome:
    started = time.time_ns()
    try:
        digests, before = hash_small_file(path, _small_buffer(local, bufsize), direct is not False)
        after = FileStat.of(os.stat(path))
    except OSError as exc:
        return _ReadOutcome(None, None, None, started, error=f"cannot read: {exc.strerror or exc}")
    counter.add(digests.size)
    return _ReadOutcome(digests, before, after, started)


def _will_need(path: str) -> None:
    """Ask the kernel to start reading a whole file into the page cache (it returns at once)."""
    try:
        fd = os.open(path, _O_RDONLY)
    except OSError:
        return  # its own read reports it
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Jobs:
    """The files a pool of readers takes in order (large ones first), with a read-ahead window.

    Taking a file hands back the files that have just come within ``READAHEAD_FILES`` files
    and ``READAHEAD_BYTES`` bytes of it, among those read through the page cache: the taker
    advises them (POSIX_FADV_WILLNEED), so the storage reads them while this one is hashed.
    ``small_from``: the index of the first small file; ``small_open`` is set once it is taken
    (or at once when there are no large files), for the readers that read small files only."""

    def __init__(self, keys: list[str], sizes: dict[str, int], buffered: Callable[[str], bool], small_from: int):
        self.keys = keys
        self.sizes = [sizes.get(k, 0) if _HAVE_WILLNEED and buffered(k) else -1 for k in keys]
        self.small_from = small_from
        self.small_open = threading.Event()
        if small_from == 0:
            self.small_open.set()
        self.taken = 0
        self.advised = 0
        self.ahead = 0  # bytes advised and not taken yet
        self.lock = threading.Lock()

    def take(self) -> tuple[str | None, list[str]]:
        with self.lock:
            i = self.taken
            if i >= len(self.keys):
                self.small_open.set()
                return None, []
            self.taken = i + 1
            if i == self.small_from:
                self.small_open.set()
            if i < self.advised:
                self.ahead -= max(0, self.sizes[i])
            else:
                self.advised = i + 1  # being read now: no advice
            new = []
            while (self.advised < len(self.keys) and self.advised - i <= READAHEAD_FILES
                   and self.ahead < READAHEAD_BYTES):  # fmt: skip
                j = self.advised
                self.advised += 1
                if self.sizes[j] >= 0:
                    self.ahead += self.sizes[j]
                    new.append(self.keys[j])
            return self.keys[i], new


_HAVE_WILLNEED = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")


def hash_many(
    paths: dict[str, str],
    workers: int | None = None,
    bufsize: int = DEFAULT_BUFSIZE,
    progress: Progress | None = None,
    sizes: dict[str, int] | None = None,
    direct: bool | None = None,
) -> dict[str, _ReadOutcome]:
    """Hash {key: path} in parallel, largest first, by a pool of ``workers`` reader threads.

    * A file of more than one buffer (by ``sizes``) is read by ``hash_file`` with an md5 lane
      of its reader's own, so one file keeps up to two cores hashing (md5 on one, sha256 on
      part of the other).
    * A file of at most one buffer is read in one read by ``hash_small_file`` (O_DIRECT unless
      ``direct`` is False) and hashed in its reader thread: no lane, no future per file. Once
      the large files are all taken, ``SMALL_READERS_PER_WORKER - 1`` more readers per worker
      join in: one cold small file is a round trip to the storage, during which its reader
      hashes nothing, so more reads must be in flight than there are cores.
    * Files read through the page cache are advised to the kernel a window ahead of the
      readers (``_Jobs``).
    * The tail: ``n_large % workers`` of the smallest large files do not wait for a free
      reader, they start at once beside the others, so equal shards end together (3 on 2
      workers are read at once, 6 in pairs) rather than with one hashed alone at md5's rate.
      Small files come after the large ones, spread over every reader.
    """
    sizes = sizes or {}
    order = sorted(paths, key=lambda k: -sizes.get(k, 0))
    counter = _ByteCounter(sum(sizes.get(k, 0) for k in order), progress)
    nworkers = workers or default_workers(len(order))
    local = threading.local()
    lanes: list[ThreadPoolExecutor] = []
    results: dict[str, _ReadOutcome] = {}

    def small(k: str) -> bool:
        return 0 <= sizes.get(k, bufsize + 1) <= bufsize

    def buffered(k: str) -> bool:
        if small(k):
            return direct is False or not _HAVE_DIRECT
        return direct is not True and sizes.get(k, DIRECT_MIN_SIZE) < DIRECT_MIN_SIZE

    def read(k: str) -> None:
        if small(k):
            results[k] = _read_small(paths[k], bufsize, counter, local, direct)
        else:
            results[k] = _read_one(paths[k], bufsize, counter, local, lanes, direct)

    large = [k for k in order if not small(k)]
    extra = large[len(large) - len(large) % nworkers:] if nworkers > 1 and len(order) > 1 else []
    started_apart = set(extra)
    keys = [k for k in order if k not in started_apart]
    jobs = _Jobs(keys, sizes, buffered, len(large) - len(extra))
    failures: list[BaseException] = []

    def work(small_only: bool = False) -> None:
        if small_only:
            jobs.small_open.wait()
        while not failures:
            k, advise = jobs.take()
            for rel in advise:
                _will_need(paths[rel])
            if k is None:
                return
            read(k)

    def guarded(fn: Callable, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            failures.append(exc)

    helpers = min(len(keys) - jobs.small_from, (SMALL_READERS_PER_WORKER - 1) * nworkers)
    try:
        if len(order) <= 1 or nworkers <= 1 and helpers <= 0:
            work()
        else:
            threads = [threading.Thread(target=guarded, args=(read, k), name=f"verify-tail-{i}", daemon=True)
                       for i, k in enumerate(extra)]  # fmt: skip
            threads += [threading.Thread(target=guarded, args=(work,), name=f"verify-{i}", daemon=True)
                        for i in range(nworkers)]  # fmt: skip
            threads += [threading.Thread(target=guarded, args=(work, True), name=f"verify-small-{i}", daemon=True)
                        for i in range(max(0, helpers))]  # fmt: skip
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for lane in lanes:
            lane.shutdown(wait=True)
    if failures:
        raise failures[0]
    return {k: results[k] for k in order}


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
) -> dict[str, Digests]:
    """{relative path: Digests} of every file under root (for writing manifests)."""
    root = _check_root(root)
    rels = list_files(root, set(ignore) | {STAMP_FILE_NAME})
    paths = {rel: os.path.join(root, rel) for rel in rels}
    sizes = {rel: os.stat(p).st_size for rel, p in paths.items()}
    outcomes = hash_many(paths, workers, bufsize, progress, sizes)
    result = {}
    for rel in rels:
        outcome = outcomes[rel]
        if outcome.digests is None:
            raise VerifyError(f"{paths[rel]}: {outcome.error}")
        result[rel] = outcome.digests
    return result


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
    """
    if links not in LINKS:
        raise VerifyError(f"links must be one of {', '.join(LINKS)}, not {links!r}")
    t0 = time.perf_counter()
    root = _check_root(root)
    files, odd = scan_tree(root)
    regular: set[str] | None = None
    foreign: list[str] = []
    if links == "refuse":
        foreign = foreign_links(root, files, linked_from)
        regular = set(files) - set(foreign)
    warnings: list[str] = []
    old_stamps: dict[str, dict] = {}
    if stamps_path:
        old_stamps, warning = load_stamps(stamps_path, root)
        if warning:
            warnings.append(warning)

    ignore_set = set(ignore)
    if stamps_path:
        stamp_rel = os.path.relpath(os.path.realpath(stamps_path), root).replace(os.sep, "/")
        ignore_set.add(stamp_rel)
    results: dict[str, FileResult] = {}
    new_stamps: dict[str, dict] = {}
    to_read: dict[str, str] = {}
    sizes: dict[str, int] = {}
    bytes_skipped = 0

    for rel in odd if links == "refuse" else ():
        exp = expected.get(rel)
        results[rel] = FileResult(rel, STATUS_ERROR, None, exp.as_dict() if exp else None, None, (), REFUSED_LINK)
    for rel in foreign:
        if rel not in ignore_set:
            exp = expected.get(rel)
            results[rel] = FileResult(rel, STATUS_ERROR, None, exp.as_dict() if exp else None, None, (),
                                      REFUSED_HARDLINK)
    for rel, exp in sorted(expected.items()):
        path = os.path.join(root, rel)
        if rel in results:
            continue
        if regular is not None and rel not in regular:  # under a refused link, or not there at all
            results[rel] = FileResult(rel, STATUS_MISSING, None, exp.as_dict(), None, (), "missing")
            continue
        try:
            raw = os.stat(path)
        except FileNotFoundError:
            results[rel] = FileResult(rel, STATUS_MISSING, None, exp.as_dict(), None, (), "missing")
            continue
        except OSError as exc:
            results[rel] = FileResult(
                rel, STATUS_ERROR, None, exp.as_dict(), None, (), f"cannot stat: {exc.strerror}"
            )
            continue
        if not stat.S_ISREG(raw.st_mode):  # what os.path.isfile says, from the same stat
            results[rel] = FileResult(rel, STATUS_ERROR, None, exp.as_dict(), None, (), NOT_REGULAR)
            continue
        st = FileStat.of(raw)
        stamp = old_stamps.get(rel)
        if not full and stamp_vouches(stamp, st, exp):
            actual = {"size": st.size, "md5": stamp["md5"], "sha256": stamp["sha256"]}
            results[rel] = FileResult(rel, STATUS_OK, "stamp", exp.as_dict(), actual)
            new_stamps[rel] = stamp
            bytes_skipped += st.size
            continue
        to_read[rel] = path
        sizes[rel] = st.size

    if not read:
        for rel in to_read:
            results[rel] = FileResult(rel, STATUS_ERROR, None, expected[rel].as_dict(), None, (), NOT_VOUCHED)
        to_read = {}
        write_stamps = False
    outcomes = hash_many(to_read, workers, bufsize, progress, sizes, direct)
    bytes_read = 0
    for rel, outcome in outcomes.items():
        result = _result_from_read(rel, expected[rel], outcome)
        results[rel] = result
        if outcome.digests is not None:
            bytes_read += outcome.digests.size
        if result.status == STATUS_OK and outcome.after is not None and outcome.digests is not None:
            if not is_racy(outcome.after, outcome.started_ns):
                new_stamps[rel] = make_stamp(outcome.after, outcome.digests)

    present = _present(root, files, odd, ignore_set) if regular is None else sorted(
        rel for rel in regular if rel not in ignore_set and not _is_stamp_temp(rel))
    for rel in present:
        if rel not in expected:
            results[rel] = FileResult(
                rel, STATUS_EXTRA, None, None, None, (), f"not in {listed_in} (unexpected extra file)"
            )
    if links == "follow":
        for rel in _outside(root, set(results), files, lambda: foreign_links(root, files, linked_from)):
            results[rel] = _hide(results[rel])

    stamps_changed = bool(stamps_path) and new_stamps != old_stamps
    stamps_written = False
    if stamps_changed and write_stamps and stamps_path:
        try:
            save_stamps(stamps_path, root, new_stamps)
            stamps_written = True
        except OSError as exc:
            warnings.append(
                f"{stamps_path}: cannot write stamps ({exc.strerror}); the next run will read "
                "every file again. Set a writable stamp path outside the model directory."
            )

    return Report(
        root=root,
        results=tuple(results[k] for k in sorted(results)),
        allow_extra=allow_extra,
        bytes_read=bytes_read,
        bytes_skipped=bytes_skipped,
        seconds=time.perf_counter() - t0,
        workers=workers or default_workers(len(to_read)),
        stamps_path=stamps_path,
        stamps_changed=stamps_changed,
        stamps_written=stamps_written,
        warnings=tuple(warnings),
    )
