# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fast path of checksums.py: O_DIRECT reads, read-ahead advice and the pool of reader threads.

checksums.py hashes a file through the page cache with one reused buffer (the portable reader, any
filesystem); it takes what is here wherever the kernel and the filesystem allow it:

* ``direct_chunks``: a file of at least ``DIRECT_MIN_SIZE`` is read with O_DIRECT by
  ``DIRECT_READERS`` prefetch threads (reads in flight) while the current buffer is hashed: the storage
  writes straight into the buffer, so the kernel neither fills the page cache nor copies the data.
  Measured on the project's 2-core machine, a cold buffered read costs 0.7 CPU-s/GB of kernel time and an
  O_DIRECT one 0.1, against 2.9 for md5+sha256: the buffered read alone would take a fifth of the
  hashing's CPU (docs/performance.md and DESIGN.md, "Fast paths"). Where O_DIRECT is refused (tmpfs, some
  overlay and network filesystems: EINVAL) or a read ends short of the block size, the generator returns
  the offset from which the portable reader reads the rest.
* ``open_once``, ``first_read``, ``drop_direct``: a file of at most one buffer is one O_DIRECT read into a
  page-aligned buffer, sized a block past the file's size, so a short read proves the end
  (checksums.hash_small_file).
* ``read_all``: the pool of reader threads, large files first, the tail of large files started beside the
  others, more readers for the small files once the large ones are taken, and files read through the page
  cache advised to the kernel (WILLNEED) a window ahead of the readers (``_Jobs``).

Standard library only: shipped to managed nodes by Ansible with checksums.py, which imports it, and loaded
before checksums.py by the controller kit's install.sh (templates/controller/install.sh).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import mmap
import os
import queue
import threading
from collections.abc import Callable

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

HAVE_DIRECT = hasattr(os, "O_DIRECT") and hasattr(os, "preadv")
_HAVE_WILLNEED = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")
_O_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_DIRECT_ALIGN = 4096  # O_DIRECT lengths: a multiple of the logical block size (512 or 4096)
_DONE = object()


def aligned(bufsize: int) -> int:
    """``bufsize`` rounded down to whole pages (at least one): what an O_DIRECT buffer holds."""
    return max(mmap.PAGESIZE, bufsize - bufsize % mmap.PAGESIZE)


def direct_buffers(bufsize: int) -> list[mmap.mmap]:
    """The page-aligned buffers one O_DIRECT read uses; a thread that reads many files keeps
    one set (fresh anonymous memory costs a page fault and a page of zeros per 4 KiB)."""
    return [mmap.mmap(-1, aligned(bufsize)) for _buffer in range(DIRECT_READERS * DIRECT_BUFFERS_PER_READER)]


# --- a large file: O_DIRECT reads in flight while the consumer hashes ------------------------


def direct_chunks(path: str, bufsize: int, buffers: list[mmap.mmap] | None = None):
    """Chunks of ``path`` read with O_DIRECT, the next ones read ahead by prefetch threads.

    Yields memoryviews into ``buffers`` (``direct_buffers(bufsize)``; fresh ones, freed at the end, when
    None); ``DIRECT_READERS`` reads are in flight; a buffer is read into again only after the consumer has
    asked for the chunk after it. The generator's return value (what ``yield from`` gives) is the offset from
    which the rest of the file is to be read through the page cache: where O_DIRECT was refused, a read ended
    off the block grid (the file's end, or a filesystem that returns less), or the size at open was reached.
    Returns None (no generator) when the file cannot be opened with O_DIRECT at all.
    """
    size = aligned(bufsize)
    if buffers is not None and (len(buffers) != DIRECT_READERS * DIRECT_BUFFERS_PER_READER
                                or any(len(b) != size for b in buffers)):  # fmt: skip
        raise ValueError(f"O_DIRECT buffers: got {len(buffers)} of {sorted({len(b) for b in buffers})} bytes; "
                         f"pass direct_buffers({size})")  # fmt: skip
    if not HAVE_DIRECT:
        return None
    try:
        fd = os.open(path, _O_RDONLY | os.O_DIRECT)
    except OSError:
        return None
    return _direct_gen(fd, size, buffers)


def _direct_gen(fd: int, bufsize: int, buffers: list[mmap.mmap] | None):
    owned = buffers is None
    prefetch = _Prefetch(fd, bufsize, direct_buffers(bufsize) if owned else buffers)
    try:
        return (yield from prefetch.chunks())
    finally:
        prefetch.close()
        os.close(fd)
        for m in prefetch.buffers if owned else ():
            try:
                m.close()
            except BufferError:  # a view the consumer still holds: freed with it
                pass


class _Prefetch:
    """``DIRECT_READERS`` threads reading one file with O_DIRECT ahead of its consumer.

    Reader k reads chunks k, k + R, k + 2R, ... into buffers of its own, so R reads are in flight while the
    consumer hashes; chunk i is taken from reader i % R, in order. A reader stops at the file's size at open,
    at a read error and at a short read, and says where (the consumer reads on from there, buffered)."""

    def __init__(self, fd: int, bufsize: int, buffers: list[mmap.mmap]):
        self.fd, self.bufsize, self.buffers = fd, bufsize, buffers
        try:
            self.end = os.fstat(fd).st_size
        except OSError:
            self.end = 0
        self.lanes = [(queue.Queue(), queue.Queue()) for _reader in range(DIRECT_READERS)]
        for i, b in enumerate(buffers):
            self.lanes[i % DIRECT_READERS][0].put(b)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,), name=f"verify-prefetch-{k}", daemon=True)
                        for k in range(DIRECT_READERS)]  # fmt: skip
        for thread in self.threads:
            thread.start()

    def _run(self, k: int) -> None:
        free, full = self.lanes[k]
        try:
            self._read(k, free, full)
        except BaseException as exc:  # noqa: BLE001 (handed to the consumer)
            full.put(("error", 0, exc))

    def _read(self, k: int, free: queue.Queue, full: queue.Queue) -> None:
        offset = k * self.bufsize
        while not self.stop.is_set():
            if offset >= self.end:  # past the size at open: what is there (normally nothing) is read buffered
                full.put(("fallback", offset, None))
                return
            b = free.get()
            if b is _DONE:
                return
            try:
                n = os.preadv(self.fd, [b], offset)
            except OSError as exc:
                full.put(("fallback", offset, exc))
                return
            full.put(("data", b, n))
            if n < self.bufsize:  # the end, or a short read off the block grid: the consumer goes on buffered
                return
            offset += DIRECT_READERS * self.bufsize

    def chunks(self):
        """The chunks in order; returns the offset from which the rest is to be read buffered."""
        offset = 0
        for free, full in itertools.cycle(self.lanes):
            kind, a, b = full.get()
            if kind == "error":
                raise b
            if kind == "fallback":
                return a
            if b:
                yield memoryview(a)[:b]
            offset += b
            if b < self.bufsize:  # a short read: the rest from here
                return offset
            free.put(a)
        return offset  # not reached: the lanes are cycled without end

    def close(self) -> None:
        self.stop.set()
        for free, _full in self.lanes:
            free.put(_DONE)
        for thread in self.threads:
            thread.join()


# --- a small file: one read -------------------------------------------------------------------


def open_once(path: str, direct: bool) -> tuple[int, bool]:
    """A descriptor of ``path`` for ``first_read``, and whether it reads with O_DIRECT: asked for with
    ``direct``, and where the filesystem refuses it (EINVAL), buffered."""
    fd = _open_direct(path) if direct else None
    if fd is None:
        return os.open(path, _O_RDONLY), False
    return fd, True


def _open_direct(path: str) -> int | None:
    if not HAVE_DIRECT:
        return None
    try:
        return os.open(path, _O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # this filesystem refuses O_DIRECT: read buffered
            return None
        raise


def drop_direct(fd: int) -> None:
    """Read ``fd`` through the page cache from now on."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)


def first_read(fd: int, view: memoryview, expected: int, direct: bool) -> tuple[int, int]:
    """(bytes read, bytes asked) of the first read from offset 0; with O_DIRECT, a block more than
    ``expected`` is asked (a short read proves the end), buffered where the alignment is refused."""
    if direct:
        asked = min(len(view), (expected // _DIRECT_ALIGN + 1) * _DIRECT_ALIGN)
        try:
            return os.preadv(fd, [view[:asked]], 0), asked
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: alignment refused here; anything else is the file's
                raise
            drop_direct(fd)
    return os.preadv(fd, [view], 0), len(view)


# --- many files: the pool of readers ----------------------------------------------------------


def read_all(paths: dict[str, str], order: list[str], sizes: dict[str, int], bufsize: int, workers: int,
             direct: bool | None, read: Callable[[str, bool], None]) -> None:
    """Call ``read(key, small)`` once for every key of ``order`` (largest first), on a pool of reader threads.

    * ``small``: the file (by ``sizes``) fits in one buffer. Once the large files are all taken,
      ``SMALL_READERS_PER_WORKER - 1`` more readers per worker join in: one cold small file is a round trip
      to the storage, during which its reader hashes nothing, so more reads must be in flight than there
      are cores.
    * Files read through the page cache are advised to the kernel a window ahead of the readers (``_Jobs``).
    * The tail: ``n_large % workers`` of the smallest large files do not wait for a free reader, they start
      at once beside the others, so equal shards end together (3 on 2 workers are read at once, 6 in pairs)
      rather than with one hashed alone at md5's rate. Small files come after the large ones, spread over
      every reader.
    The first exception a reader raises is raised here, once every reader has stopped.
    """
    _Pool(paths, order, sizes, bufsize, workers, direct, read).run()


class _Pool:
    def __init__(self, paths: dict[str, str], order: list[str], sizes: dict[str, int], bufsize: int,
                 workers: int, direct: bool | None, read: Callable[[str, bool], None]):
        self.paths, self.sizes, self.bufsize, self.direct, self.read = paths, sizes, bufsize, direct, read
        self.workers, self.single = workers, len(order) <= 1
        large = [k for k in order if not self.small(k)]
        self.apart = large[len(large) - len(large) % workers:] if workers > 1 and not self.single else []
        apart = set(self.apart)
        keys = [k for k in order if k not in apart]
        self.jobs = _Jobs(keys, sizes, self.buffered, len(large) - len(self.apart))
        self.helpers = min(len(keys) - self.jobs.small_from, (SMALL_READERS_PER_WORKER - 1) * workers)
        self.failures: list[BaseException] = []

    def small(self, k: str) -> bool:
        return 0 <= self.sizes.get(k, self.bufsize + 1) <= self.bufsize

    def buffered(self, k: str) -> bool:
        """Read through the page cache (advised ahead), not with O_DIRECT."""
        if self.small(k):
            return self.direct is False or not HAVE_DIRECT
        return self.direct is not True and self.sizes.get(k, DIRECT_MIN_SIZE) < DIRECT_MIN_SIZE

    def run(self) -> None:
        if self.single or self.workers <= 1 and self.helpers <= 0:
            self.work()
            return
        threads = [self._thread(self.read_one, k, name=f"verify-tail-{i}") for i, k in enumerate(self.apart)]
        threads += [self._thread(self.work, name=f"verify-{i}") for i in range(self.workers)]
        threads += [self._thread(self.work, True, name=f"verify-small-{i}") for i in range(max(0, self.helpers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self.failures:
            raise self.failures[0]

    def _thread(self, fn: Callable, *args, name: str) -> threading.Thread:
        return threading.Thread(target=self._guarded, args=(fn, *args), name=name, daemon=True)

    def _guarded(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            self.failures.append(exc)

    def read_one(self, k: str) -> None:
        self.read(k, self.small(k))

    def work(self, small_only: bool = False) -> None:
        if small_only:
            self.jobs.small_open.wait()
        while not self.failures:
            k, advise = self.jobs.take()
            for rel in advise:
                _will_need(self.paths[rel])
            if k is None:
                return
            self.read_one(k)


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
            return self.keys[i], self._advise(i)

    def _advise(self, i: int) -> list[str]:
        """The files that come within the window of file ``i`` now (called with the lock held)."""
        new = []
        while (self.advised < len(self.keys) and self.advised - i <= READAHEAD_FILES
               and self.ahead < READAHEAD_BYTES):  # fmt: skip
            j = self.advised
            self.advised += 1
            if self.sizes[j] >= 0:
                self.ahead += self.sizes[j]
                new.append(self.keys[j])
        return new
