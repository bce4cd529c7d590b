"""One-pass md5+sha256 verification and stamps (module_utils/checksums.py, fast_read.py, manifest.py)."""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import shutil
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import checksums, fast_read, manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SHARDS = {
    "model-00001-of-00003.safetensors": 3_000_017,
    "model-00002-of-00003.safetensors": 2_500_001,
    "model-00003-of-00003.safetensors": 700_000,
    "config.json": 611,
    "tokenizer/tokenizer.json": 20_000,
}


def _write_model(root: Path) -> dict[str, object]:
    """Random shards; returns {rel: Expected} computed with hashlib independently of the code under test."""
    expected = {}
    for rel, size in SHARDS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        expected[rel] = manifest.Expected(
            path=rel, size=size, md5=hashlib.md5(data).hexdigest(), sha256=hashlib.sha256(data).hexdigest()
        )
    # Stamps are not written for files changed within the racy margin of their read.
    time.sleep(checksums.RACY_MARGIN_NS / 1e9 + 0.05)
    return expected


@pytest.fixture()
def model(tmp_path: Path) -> tuple[Path, dict, str]:
    root = tmp_path / "model"
    root.mkdir()
    expected = _write_model(root)
    return root, expected, str(tmp_path / "stamps.json")


def _by_path(report) -> dict:
    return {r.path: r for r in report.results}


def _flip_byte_keep_times(path: Path, offset: int) -> None:
    st = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


# --- hashing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 4095, 4 << 20, (4 << 20) + 3])
def test_hash_file_matches_hashlib(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    got = checksums.hash_file(str(path), bufsize=1 << 20)
    assert got == checksums.Digests(size, hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest())


def _digests(data: bytes):
    return checksums.Digests(len(data), hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest())


MIB = 1 << 20
GIB = 1 << 30


@pytest.mark.parametrize("direct", [True, False, None])
@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 3 * MIB, 3 * MIB + 3, 9 * MIB + 511])
def test_direct_and_buffered_reads_hash_every_byte_once(tmp_path: Path, size: int, direct) -> None:
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    lane = checksums.ThreadPoolExecutor(max_workers=1)
    try:
        for md5_lane in (None, lane):
            assert checksums.hash_file(str(path), bufsize=MIB, direct=direct, md5_lane=md5_lane) == _digests(data)
    finally:
        lane.shutdown()


def test_large_files_are_read_with_o_direct_small_ones_buffered(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = os.preadv
    monkeypatch.setattr(checksums.os, "preadv", lambda fd, bufs, off: calls.append(off) or real(fd, bufs, off))
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(os.urandom(checksums.DIRECT_MIN_SIZE + 5))
    small.write_bytes(os.urandom(checksums.DIRECT_MIN_SIZE - 1))
    checksums.hash_file(str(small), bufsize=MIB)
    assert calls == []
    assert checksums.hash_file(str(big), bufsize=MIB) == _digests(big.read_bytes())
    # every block read once, none past the end (the readers share the offsets: their order varies)
    assert sorted(calls) == [i * MIB for i in range(checksums.DIRECT_MIN_SIZE // MIB + 1)]


@pytest.mark.parametrize("how", ["refused at the first read", "short reads off the block grid", "read error"])
def test_direct_read_falls_back_to_buffered_from_where_it_stopped(tmp_path: Path, monkeypatch, how) -> None:
    data = os.urandom(5 * MIB + 17)
    path = tmp_path / "f"
    path.write_bytes(data)
    real = os.preadv

    def preadv(fd, bufs, off):
        if how == "refused at the first read":
            raise OSError(22, "Invalid argument")
        if how == "read error" and off >= 2 * MIB:
            raise OSError(5, "Input/output error")
        if how == "short reads off the block grid" and off >= MIB:
            return real(fd, [memoryview(bufs[0])[: MIB // 2]], off) and MIB // 2 - 100
        return real(fd, bufs, off)

    monkeypatch.setattr(checksums.os, "preadv", preadv)
    assert checksums.hash_file(str(path), bufsize=MIB, direct=True) == _digests(data)


def test_a_filesystem_without_o_direct_is_read_buffered(tmp_path: Path, monkeypatch) -> None:
    data = os.urandom(2 * MIB + 1)
    path = tmp_path / "f"
    path.write_bytes(data)
    real_open = os.open

    def no_direct(p, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(22, "Invalid argument")  # tmpfs
        return real_open(p, flags, *args)

    monkeypatch.setattr(checksums.os, "open", no_direct)
    assert checksums.hash_file(str(path), bufsize=MIB, direct=True) == _digests(data)


def test_an_abandoned_direct_read_leaves_no_thread_or_descriptor(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "f"
    path.write_bytes(os.urandom(6 * MIB))
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    chunks = fast_read.direct_chunks(str(path), MIB)
    assert len(next(chunks)) == MIB
    chunks.close()
    assert (threading.active_count(), len(os.listdir("/proc/self/fd"))) == (threads, fds)


def test_digest_tree_lists_every_file_once(model) -> None:
    root, expected, _ = model
    got = checksums.digest_tree(str(root), workers=2)
    assert sorted(got) == sorted(SHARDS)
    for rel, digests in got.items():
        assert (digests.md5, digests.sha256, digests.size) == (
            expected[rel].md5,
            expected[rel].sha256,
            expected[rel].size,
        )


# --- verification ----------------------------------------------------------------------------


def test_clean_tree_verifies_and_writes_stamps(model) -> None:
    root, expected, stamps = model
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps, workers=2)
    assert not report.failed, report.failure_message()
    assert report.count("ok") == len(SHARDS)
    assert report.bytes_read == sum(SHARDS.values())
    assert report.stamps_written and os.path.exists(stamps)


@pytest.mark.parametrize("rel", sorted(SHARDS))
@pytest.mark.parametrize("where", ["first", "last"])
def test_one_byte_change_caught_with_size_and_mtime_restored(model, rel: str, where: str) -> None:
    root, expected, stamps = model
    first = checksums.verify_tree(str(root), expected, stamps_path=stamps)
    assert not first.failed and first.stamps_written
    path = root / rel
    _flip_byte_keep_times(path, 0 if where == "first" else SHARDS[rel] - 1)

    report = checksums.verify_tree(str(root), expected, stamps_path=stamps)

    assert report.failed
    bad = _by_path(report)[rel]
    assert bad.status == "mismatch" and bad.source == "read"
    assert set(bad.mismatched) == {"md5", "sha256"}
    actual_data = path.read_bytes()
    message = report.failure_message()
    for digest in (
        expected[rel].md5,
        expected[rel].sha256,
        hashlib.md5(actual_data).hexdigest(),
        hashlib.sha256(actual_data).hexdigest(),
    ):
        assert digest in message
    assert rel in message
    others = [r for r in report.results if r.path != rel]
    assert all(r.status == "ok" and r.source == "stamp" for r in others)


def test_unchanged_tree_is_vouched_by_stamps_without_reading(model) -> None:
    root, expected, stamps = model
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    before = Path(stamps).read_bytes()
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps)
    assert not report.failed
    assert report.bytes_read == 0 and report.bytes_skipped == sum(SHARDS.values())
    assert all(r.source == "stamp" for r in report.results)
    assert not report.stamps_changed and not report.stamps_written
    assert Path(stamps).read_bytes() == before


def test_full_reads_everything_despite_stamps(model) -> None:
    root, expected, stamps = model
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps, full=True)
    assert report.bytes_read == sum(SHARDS.values()) and report.bytes_skipped == 0
    assert not report.stamps_changed


def _touch_content_same(path: Path) -> None:
    path.write_bytes(path.read_bytes())  # same bytes, new mtime and ctime


def _append_and_truncate(path: Path) -> None:
    st = path.stat()
    with open(path, "ab") as handle:
        handle.write(b"x")
    os.truncate(path, st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _replace_by_rename(path: Path) -> None:
    st = path.stat()
    tmp = path.with_name(path.name + ".new")
    shutil.copyfile(path, tmp)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    assert path.stat().st_ino != st.st_ino


def _chmod(path: Path) -> None:
    os.chmod(path, 0o600)


@pytest.mark.parametrize(
    "change",
    [_touch_content_same, _append_and_truncate, _replace_by_rename, _chmod],
    ids=["rewrite-same-bytes", "size-restored", "inode-replaced", "chmod-ctime"],
)
def test_stamp_ignored_after_any_change_to_the_file(model, change) -> None:
    root, expected, stamps = model
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    rel = "model-00002-of-00003.safetensors"
    change(root / rel)
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps)
    result = _by_path(report)[rel]
    assert result.source == "read", "a stamp vouched for a changed file"
    assert report.bytes_read == SHARDS[rel]


def test_stamp_ignored_when_the_expected_digest_changes(model) -> None:
    root, expected, stamps = model
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    rel = "config.json"
    changed = dict(expected)
    changed[rel] = manifest.Expected(rel, SHARDS[rel], md5=expected[rel].md5, sha256="0" * 64)
    report = checksums.verify_tree(str(root), changed, stamps_path=stamps)
    result = _by_path(report)[rel]
    assert result.status == "mismatch" and result.source == "read" and result.mismatched == ("sha256",)
    assert "sha256 expected " + "0" * 64 in result.message


def test_stamp_for_another_root_is_not_used(model, tmp_path: Path) -> None:
    root, expected, stamps = model
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    twin = tmp_path / "twin"
    shutil.copytree(root, twin)
    report = checksums.verify_tree(str(twin), expected, stamps_path=stamps)
    assert report.bytes_read == sum(SHARDS.values())


def test_racy_file_is_verified_but_not_stamped(tmp_path: Path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    data = os.urandom(1000)
    (root / "a.bin").write_bytes(data)  # read immediately: inside the racy margin
    exp = {"a.bin": manifest.Expected("a.bin", 1000, hashlib.md5(data).hexdigest(), None)}
    report = checksums.verify_tree(str(root), exp, stamps_path=str(tmp_path / "s.json"))
    assert not report.failed
    assert not report.stamps_changed


def test_missing_and_extra_files_are_reported(model) -> None:
    root, expected, stamps = model
    (root / "config.json").unlink()
    (root / "stray.bin").write_bytes(b"stray")
    (root / "tokenizer" / "extra.txt").write_bytes(b"x")
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps)
    results = _by_path(report)
    assert results["config.json"].status == "missing"
    assert results["stray.bin"].status == "extra"
    assert results["tokenizer/extra.txt"].status == "extra"
    assert report.failed
    assert "stray.bin" in report.failure_message() and "config.json" in report.failure_message()


def test_allow_extra_tolerates_extra_but_not_missing(model) -> None:
    root, expected, stamps = model
    (root / "stray.bin").write_bytes(b"stray")
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps, allow_extra=True)
    assert not report.failed and report.count("extra") == 1
    (root / "config.json").unlink()
    assert checksums.verify_tree(str(root), expected, stamps_path=stamps, allow_extra=True).failed


def test_stamp_file_inside_root_is_not_an_extra_file(model) -> None:
    root, expected, _ = model
    inside = str(root / checksums.STAMP_FILE_NAME)
    checksums.verify_tree(str(root), expected, stamps_path=inside)
    report = checksums.verify_tree(str(root), expected, stamps_path=inside)
    assert report.count("extra") == 0 and not report.failed


def test_check_mode_writes_nothing_but_says_it_would(model) -> None:
    root, expected, stamps = model
    listing = sorted(os.listdir(root))
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps, write_stamps=False)
    assert not report.failed
    assert report.stamps_changed and not report.stamps_written
    assert not os.path.exists(stamps)
    assert sorted(os.listdir(root)) == listing


def test_check_mode_still_fails_on_mismatch(model) -> None:
    root, expected, stamps = model
    _flip_byte_keep_times(root / "config.json", 10)
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps, write_stamps=False)
    assert report.failed and _by_path(report)["config.json"].status == "mismatch"
    assert not os.path.exists(stamps)


def test_corrupt_stamp_file_means_read_everything(model) -> None:
    root, expected, stamps = model
    Path(stamps).write_text("{not json")
    report = checksums.verify_tree(str(root), expected, stamps_path=stamps)
    assert report.bytes_read == sum(SHARDS.values()) and report.warnings
    assert json.loads(Path(stamps).read_text())["format"] == checksums.STAMP_FORMAT


def test_mismatched_file_loses_its_stamp(model) -> None:
    root, expected, stamps = model
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    _flip_byte_keep_times(root / "config.json", 0)
    checksums.verify_tree(str(root), expected, stamps_path=stamps)
    assert "config.json" not in json.loads(Path(stamps).read_text())["files"]


def test_size_declared_wrong_is_a_mismatch(model) -> None:
    root, expected, _ = model
    exp = dict(expected)
    exp["config.json"] = manifest.Expected("config.json", 612, expected["config.json"].md5, None)
    result = _by_path(checksums.verify_tree(str(root), exp))["config.json"]
    assert result.status == "mismatch" and result.mismatched == ("size",)


def test_root_that_is_not_a_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(checksums.VerifyError, match="not a directory"):
        checksums.verify_tree(str(tmp_path / "nope"), {})


def test_memory_is_bounded_by_buffers_not_file_size(tmp_path: Path) -> None:
    import tracemalloc

    root = tmp_path / "big"
    root.mkdir()
    with open(root / "big.bin", "wb") as handle:
        handle.truncate(64 << 20)  # sparse 64 MiB
    tracemalloc.start()
    checksums.digest_tree(str(root), workers=1, bufsize=1 << 20)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4 << 20


# --- the read pipeline: lanes, readers, buffers, scheduling ----------------------------------


class _CountingLane:
    """An md5 lane that counts its hand-offs (a one-thread executor's submit, run inline)."""

    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, fn, *args):
        from concurrent.futures import Future

        self.submitted += 1
        done: Future = Future()
        done.set_result(fn(*args))
        return done


@pytest.mark.parametrize("size, handoffs", [(0, 0), (4096, 0), (MIB, 0), (MIB + 1, 2), (3 * MIB, 3)])
@pytest.mark.parametrize("direct", [True, False])
def test_a_file_of_one_buffer_is_hashed_without_the_md5_lane(tmp_path: Path, size: int, handoffs: int, direct) -> None:
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    lane = _CountingLane()
    assert checksums.hash_file(str(path), bufsize=MIB, md5_lane=lane, direct=direct) == _digests(data)
    assert lane.submitted == handoffs


@pytest.mark.parametrize("size", [MIB, 2 * MIB, 5 * MIB])
def test_o_direct_reads_nothing_past_the_end_of_a_file_of_whole_buffers(tmp_path: Path, monkeypatch, size) -> None:
    calls = []
    real = os.preadv
    monkeypatch.setattr(checksums.os, "preadv", lambda fd, bufs, off: calls.append(off) or real(fd, bufs, off))
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert checksums.hash_file(str(path), bufsize=MIB, direct=True) == _digests(data)
    assert sorted(calls) == list(range(0, size, MIB))


@pytest.mark.parametrize("change", ["grows", "shrinks"])
def test_a_file_that_changes_size_during_an_o_direct_read_is_hashed_as_read(tmp_path: Path, monkeypatch, change):
    data = os.urandom(3 * MIB)
    path = tmp_path / "f"
    path.write_bytes(data)
    extra = os.urandom(MIB + 7)
    real = os.preadv
    changed = []
    lock = threading.Lock()  # the readers run in parallel: none reads before the change is complete

    def preadv(fd, bufs, off):
        with lock:
            if not changed:
                changed.append(off)
                if change == "grows":
                    with open(path, "ab") as handle:
                        handle.write(extra)
                else:
                    os.truncate(path, MIB + MIB // 2)
        return real(fd, bufs, off)

    monkeypatch.setattr(checksums.os, "preadv", preadv)
    final = data + extra if change == "grows" else data[: MIB + MIB // 2]
    # every byte there at the end is hashed once: past the size at open, the rest is read buffered
    assert checksums.hash_file(str(path), bufsize=MIB, direct=True) == _digests(final)


@pytest.mark.parametrize("size, direct", [(3 * MIB, True), (5000, None)], ids=["large, O_DIRECT", "small"])
def test_verify_tree_reports_a_file_that_changed_during_its_read(tmp_path: Path, monkeypatch, size, direct) -> None:
    root = tmp_path / "m"
    root.mkdir()
    data = os.urandom(size)
    (root / "a.bin").write_bytes(data)
    exp = {"a.bin": manifest.Expected("a.bin", len(data), hashlib.md5(data).hexdigest(), None)}
    real = os.preadv

    def preadv(fd, bufs, off):
        if off == 0:
            with open(root / "a.bin", "ab") as handle:
                handle.write(b"late")
        return real(fd, bufs, off)

    monkeypatch.setattr(checksums.os, "preadv", preadv)
    report = checksums.verify_tree(str(root), exp, bufsize=MIB, direct=direct)
    result = _by_path(report)["a.bin"]
    assert result.status == "error" and "changed while it was being read" in result.message


def test_direct_buffers_of_another_size_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(2 * MIB))
    with pytest.raises(ValueError, match=r"direct_buffers\(1048576\)"):
        checksums.hash_file(str(path), bufsize=MIB, direct=True, direct_buffers=checksums.direct_buffers(2 * MIB))


def test_o_direct_buffers_are_made_once_per_thread_not_per_file(tmp_path: Path, monkeypatch) -> None:
    made = []
    real = checksums.direct_buffers
    monkeypatch.setattr(checksums, "direct_buffers", lambda n: made.append(n) or real(n))
    files = {}
    for i in range(6):
        data = os.urandom(2 * MIB + i)
        (tmp_path / f"f{i}").write_bytes(data)
        files[f"f{i}"] = data
    outcomes = checksums.hash_many({k: str(tmp_path / k) for k in files}, workers=2, bufsize=MIB, direct=True)
    assert {k: o.digests for k, o in outcomes.items()} == {k: _digests(d) for k, d in files.items()}
    assert 1 <= len(made) <= 3  # one set per reader thread (workers + 1), whatever the number of files


def _concurrency_probe(monkeypatch, seen: list, barrier=None):
    lock = threading.Lock()
    running: set[str] = set()

    def fake(path, *args, **kwargs):
        with lock:
            running.add(path)
            seen.append(frozenset(running))
        try:
            if barrier is not None:
                barrier.wait()
            time.sleep(0.05)
            return checksums.Digests(0, "", "")
        finally:
            with lock:
                running.discard(path)

    monkeypatch.setattr(checksums, "hash_file", fake)


def test_the_last_file_starts_beside_the_others_not_after_them(tmp_path: Path, monkeypatch) -> None:
    seen: list = []
    # three files on two workers: all three must be read at once, or the barrier breaks
    _concurrency_probe(monkeypatch, seen, threading.Barrier(3, timeout=30))
    paths = {k: str(tmp_path / k) for k in "abc"}
    for p in paths.values():
        Path(p).write_bytes(b"")
    # sizes of more than one buffer (the files themselves are empty: hash_file is the probe's)
    outcomes = checksums.hash_many(paths, workers=2, sizes={"a": 3 * GIB, "b": 2 * GIB, "c": GIB})
    assert all(o.error is None for o in outcomes.values())
    assert max(len(s) for s in seen) == 3


def test_at_most_workers_files_are_read_at_once_before_the_last(tmp_path: Path, monkeypatch) -> None:
    seen: list = []
    _concurrency_probe(monkeypatch, seen)
    names = [f"f{i}" for i in range(7)]
    paths = {k: str(tmp_path / k) for k in names}
    for p in paths.values():
        Path(p).write_bytes(b"")
    checksums.hash_many(paths, workers=2, sizes={k: (10 - i) * GIB for i, k in enumerate(names)})
    last = paths["f6"]
    assert all(len(s - {last}) <= 2 for s in seen)
    assert len(seen) == 7


# --- small files: one read each, more readers, read-ahead --------------------------------------


def _count_preadv(monkeypatch) -> list:
    calls = []
    real = os.preadv
    monkeypatch.setattr(checksums.os, "preadv", lambda fd, bufs, off: calls.append(off) or real(fd, bufs, off))
    return calls


@pytest.mark.parametrize("direct", [None, False, True])
@pytest.mark.parametrize("size, reads", [(0, 1), (1, 1), (4095, 1), (4096, 1), (4097, 1), (MIB - 1, 1), (MIB, 2)])
def test_a_small_file_is_read_in_one_read_in_its_reader(tmp_path: Path, monkeypatch, size, reads, direct) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    monkeypatch.setattr(checksums, "hash_file", lambda *a, **k: pytest.fail("a small file went the large files' way"))
    calls = _count_preadv(monkeypatch)
    outcomes = checksums.hash_many({"f": str(tmp_path / "f")}, bufsize=MIB, sizes={"f": size}, direct=direct)
    assert outcomes["f"].digests == _digests(data) and outcomes["f"].before == outcomes["f"].after
    assert len(calls) == reads  # a full buffer (size == bufsize) cannot prove the end: one more read


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("change", ["grows", "shrinks", "larger than the buffer"])
def test_a_small_file_is_hashed_to_its_end_whatever_its_size_at_fstat(tmp_path: Path, monkeypatch, change, direct):
    path = tmp_path / "f"
    data = os.urandom(3 * MIB + 5 if change == "larger than the buffer" else 300_000)
    path.write_bytes(data)
    real = os.preadv
    done = []

    def preadv(fd, bufs, off):
        if not done:
            done.append(off)
            if change == "grows":
                with open(path, "ab") as handle:
                    handle.write(b"late")
            elif change == "shrinks":
                os.truncate(path, 1000)
        return real(fd, bufs, off)

    monkeypatch.setattr(checksums.os, "preadv", preadv)
    final = {"grows": data + b"late", "shrinks": data[:1000]}.get(change, data)
    digests, before = checksums.hash_small_file(str(path), mmap.mmap(-1, MIB), direct)
    assert digests == _digests(final)
    assert before.size == len(data)  # fstat's size, before the change: the caller's after-stat differs


@pytest.mark.parametrize("refused", ["open", "read"])
def test_a_small_file_is_read_buffered_where_o_direct_is_refused(tmp_path: Path, monkeypatch, refused) -> None:
    import errno

    data = os.urandom(70_000)
    (tmp_path / "f").write_bytes(data)
    real_open, real_preadv = os.open, os.preadv
    direct_fds = set()

    def fake_open(p, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            if refused == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
            fd = real_open(p, flags, *args)
            direct_fds.add(fd)
            return fd
        return real_open(p, flags, *args)

    def fake_preadv(fd, bufs, off):
        import fcntl

        if fd in direct_fds and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, off)

    monkeypatch.setattr(checksums.os, "open", fake_open)
    monkeypatch.setattr(checksums.os, "preadv", fake_preadv)
    digests, _ = checksums.hash_small_file(str(tmp_path / "f"), mmap.mmap(-1, MIB), True)
    assert digests == _digests(data)


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: os.mkfifo(p)], ids=["directory", "fifo"])
def test_an_expected_name_that_is_not_a_regular_file_is_an_error_and_never_opened(tmp_path: Path, make) -> None:
    root = tmp_path / "m"
    root.mkdir()
    make(root / "x")
    report = checksums.verify_tree(str(root), {"x": manifest.Expected("x", 1, "0" * 32, None)})
    assert _by_path(report)["x"].status == "error" and _by_path(report)["x"].message == checksums.NOT_REGULAR


def test_small_files_get_more_readers_once_the_large_files_are_all_taken(tmp_path: Path, monkeypatch) -> None:
    lock = threading.Lock()
    events: list[tuple[str, str]] = []
    workers = 2
    readers = checksums.SMALL_READERS_PER_WORKER * workers
    barrier = threading.Barrier(readers, timeout=30)  # breaks unless that many small files are read at once

    def fake_large(path, *args, **kwargs):
        with lock:
            events.append(("large", path))
        return checksums.Digests(0, "", "")

    def fake_small(path, buf, direct=False):
        with lock:
            events.append(("small", path))
        barrier.wait()
        return checksums.Digests(0, "", ""), checksums.FileStat.of(os.stat(path))

    # The order the files are taken in, recorded as they are taken (what the threads then append to events
    # runs unordered: a reader that took the last large file may append after another appended a small one).
    taken: list[str] = []
    take, take_lock = fast_read._Jobs.take, threading.Lock()

    def recording_take(jobs):
        with take_lock:
            key, advise = take(jobs)
            if key is not None:
                taken.append(key)
            return key, advise

    monkeypatch.setattr(fast_read._Jobs, "take", recording_take)
    monkeypatch.setattr(checksums, "hash_file", fake_large)
    monkeypatch.setattr(checksums, "hash_small_file", fake_small)
    names = [f"L{i}" for i in range(4)] + [f"s{i}" for i in range(2 * readers)]
    paths = {k: str(tmp_path / k) for k in names}
    for p in paths.values():
        Path(p).write_bytes(b"")
    sizes = {k: (GIB if k.startswith("L") else 1) for k in names}
    outcomes = checksums.hash_many(paths, workers=workers, sizes=sizes)
    assert all(o.error is None for o in outcomes.values())
    assert sorted(kind for kind, _ in events) == sorted(["large"] * 4 + ["small"] * 2 * readers)
    assert [k[0] for k in taken] == ["L"] * 4 + ["s"] * 2 * readers  # no small file before every large one is taken


@pytest.mark.parametrize("n_large, most_at_once", [(2, 2), (3, 3), (4, 2), (5, 3), (6, 2)])
def test_large_files_run_in_pairs_with_an_odd_one_started_beside_them(tmp_path: Path, monkeypatch, n_large,
                                                                       most_at_once) -> None:
    seen: list = []
    _concurrency_probe(monkeypatch, seen)
    names = [f"f{i}" for i in range(n_large)]
    paths = {k: str(tmp_path / k) for k in names}
    for p in paths.values():
        Path(p).write_bytes(b"")
    checksums.hash_many(paths, workers=2, sizes={k: GIB for k in names})
    assert max(len(s) for s in seen) <= most_at_once


def test_a_reader_thread_failure_is_raised_in_the_caller(tmp_path: Path, monkeypatch) -> None:
    def broken(path, *args, **kwargs):
        raise ValueError(f"broken reader for {path}")

    monkeypatch.setattr(checksums, "hash_file", broken)
    paths = {k: str(tmp_path / k) for k in "abc"}
    for p in paths.values():
        Path(p).write_bytes(b"")
    with pytest.raises(ValueError, match="broken reader"):
        checksums.hash_many(paths, workers=2, sizes={k: GIB for k in paths})


@pytest.mark.parametrize("files, ahead_bytes, buffered, takes", [
    # (sizes, READAHEAD_BYTES, which are read through the page cache, [(taken, advised), ...]); READAHEAD_FILES = 2
    ([1, 1, 1, 1, 1], 1 << 30, "abcde", [("a", ["b", "c"]), ("b", ["d"]), ("c", ["e"]), ("d", []), ("e", [])]),
    ([6, 6, 6, 6], 10, "abcd", [("a", ["b", "c"]), ("b", ["d"]), ("c", []), ("d", [])]),
    ([1, 1, 1, 1], 1 << 30, "bd", [("a", ["b"]), ("b", ["d"]), ("c", []), ("d", [])]),  # O_DIRECT ones: no advice
], ids=["files", "bytes", "direct"])
def test_the_read_ahead_window_advises_each_buffered_file_once(monkeypatch, files, ahead_bytes, buffered, takes):
    monkeypatch.setattr(fast_read, "READAHEAD_FILES", 2)
    monkeypatch.setattr(fast_read, "READAHEAD_BYTES", ahead_bytes)
    keys = "abcde"[: len(files)]
    jobs = fast_read._Jobs(list(keys), dict(zip(keys, files, strict=True)), lambda k: k in buffered, small_from=0)
    assert [jobs.take() for _ in takes] == takes
    assert jobs.take() == (None, [])


# --- file_digest: the one streaming digest of a file -------------------------------------------


def _hashlib(data: bytes, algorithms=("sha256",)) -> dict[str, str]:
    return {name: hashlib.new(name, data).hexdigest() for name in algorithms}


class _Spy(io.RawIOBase):
    """A binary file over bytes that records how much each read asked for."""

    def __init__(self, data: bytes):
        self._inner = io.BytesIO(data)
        self.asked: list[int] = []

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        self.asked.append(len(b))
        return self._inner.readinto(b)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 7])
def test_file_digest_of_a_file_larger_than_its_chunk_is_hashlib_of_the_whole(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    algorithms = ("md5", "sha256", "sha1")
    assert checksums.file_digest(path, algorithms, chunk=4096) == _hashlib(data, algorithms)
    assert checksums.file_digest(str(path), algorithms) == _hashlib(data, algorithms)
    assert checksums.file_sha256(os.fsencode(path), chunk=4096) == hashlib.sha256(data).hexdigest()


def test_file_digest_streams_never_the_whole_file_in_memory(tmp_path: Path) -> None:
    data = os.urandom(checksums.FILE_CHUNK * 5 + 123)
    spy = _Spy(data)
    assert checksums.file_sha256(spy) == hashlib.sha256(data).hexdigest()
    assert max(spy.asked) == checksums.FILE_CHUNK  # one reused buffer of a chunk, never the file's size
    assert len(spy.asked) == 7  # five full chunks, the rest, the end
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        assert checksums.file_sha256(path) == hashlib.sha256(data).hexdigest()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * checksums.FILE_CHUNK, peak


def test_file_digest_reads_an_open_descriptor_or_file_from_where_it_stands_and_leaves_it_open(
        tmp_path: Path) -> None:
    data = os.urandom(10_000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # what a caller that refuses links hashes
    try:
        os.lseek(fd, 100, os.SEEK_SET)
        assert checksums.file_sha256(fd, chunk=999) == hashlib.sha256(data[100:]).hexdigest()
        os.fstat(fd)  # still open
    finally:
        os.close(fd)
    with open(path, "rb") as handle:
        handle.seek(7)
        assert checksums.file_digest(handle, ("md5",)) == _hashlib(data[7:], ("md5",))
        assert not handle.closed
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("m/x.run", data)
    with zipfile.ZipFile(archive) as zf, zf.open("m/x.run") as member:  # no descriptor to advise
        assert checksums.file_sha256(member, chunk=1000) == hashlib.sha256(data).hexdigest()

    class ReadOnly:  # read() and nothing else
        def __init__(self):
            self._inner = io.BytesIO(data)

        def read(self, n: int) -> bytes:
            return self._inner.read(n)

    assert checksums.file_sha256(ReadOnly(), chunk=3000) == hashlib.sha256(data).hexdigest()


def test_file_digest_opens_a_path_as_open_does(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"x")
    (tmp_path / "link").symlink_to("target")
    assert checksums.file_sha256(tmp_path / "link") == hashlib.sha256(b"x").hexdigest()  # followed, as before
    with pytest.raises(FileNotFoundError):
        checksums.file_sha256(tmp_path / "missing")
    with pytest.raises(IsADirectoryError):
        checksums.file_sha256(tmp_path)
    with pytest.raises(ValueError, match="chunk"):
        checksums.file_sha256(tmp_path / "target", chunk=0)
    with pytest.raises(ValueError):
        checksums.file_digest(tmp_path / "target", ("no-such-hash",))
    with pytest.raises(ValueError, match="algorithm"):
        checksums.file_digest(tmp_path / "target", ())


def test_a_caller_that_refuses_links_keeps_refusing_them(tmp_path: Path) -> None:
    """installer_copy opens with O_NOFOLLOW and hashes the descriptor it opened: a link is still refused."""
    from ansible_collections.atlas.serving.plugins.module_utils import installer_copy

    (tmp_path / "real.run").write_bytes(b"payload")
    (tmp_path / "link.run").symlink_to("real.run")
    assert installer_copy.hash_path(str(tmp_path / "real.run")) == hashlib.sha256(b"payload").hexdigest()
    with pytest.raises(installer_copy.CopyError):
        installer_copy.hash_path(str(tmp_path / "link.run"))


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=20_000), chunk=st.integers(min_value=1, max_value=5_000),
       algorithms=st.lists(st.sampled_from(["md5", "sha256", "sha1", "sha512"]), min_size=1, max_size=3, unique=True))
def test_file_digest_is_hashlib_of_the_whole_for_any_contents_and_chunk(tmp_path: Path, data: bytes, chunk: int,
                                                                         algorithms: list[str]) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    want = _hashlib(data, algorithms)
    assert checksums.file_digest(path, algorithms, chunk) == want
    assert checksums.file_digest(io.BytesIO(data), algorithms, chunk) == want
    with open(path, "rb") as handle:
        assert checksums.file_digest(handle.fileno(), algorithms, chunk) == want
