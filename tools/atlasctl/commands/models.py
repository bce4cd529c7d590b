"""`atlasctl models`: write and verify model checksums (md5 + sha256 in one read).

    atlasctl models manifest DIR [--format sums|json] [--out PATH] [--prefix P]
    atlasctl models verify DIR [--manifest F ...] [--prefix P] [--full] [--allow-extra]
                               [--stamps PATH | --no-stamps] [--check] [--workers N] [--json]

The work is done by the collection's module_utils (the same code as the
``atlas.serving.model_verify`` module); this file parses, calls and renders.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from ansible_collections.atlas.serving.plugins.module_utils import checksums, manifest, paths

from atlasctl import exitcodes, outputs
from atlasctl.errors import UsageError
from atlasctl.inputs import name as check_name
from atlasctl.inputs import plain_text, shown, whole_number

SUMS_FILES = {"md5": "md5sums.txt", "sha256": "sha256sums.txt"}
MANIFEST_FILE = "manifest.json"
DEFAULT_SOURCES = (MANIFEST_FILE, SUMS_FILES["md5"], SUMS_FILES["sha256"])
# Hashing threads: the default is one per usable core, at most 8 (checksums.default_workers). Each takes up to
# about 48 MiB of buffers (checksums' module docstring: (2 x workers - 1) x (2 + 2 x 2) x 4 MiB), so 64 stays
# within a few GiB.
MAX_WORKERS = 64


def check_workers(workers: int | None) -> int | None:
    """--workers: None (the default) or a whole number from 1 to MAX_WORKERS."""
    if workers is None:
        return None
    return whole_number(workers, "--workers", 1, MAX_WORKERS,
                        fix=f"leave --workers out (one thread per core, at most 8) or pass 1 to {MAX_WORKERS}")


PREFIX_FIX = "pass the model's directory as the bundle manifest lists it, e.g. --prefix models/qwen2.5-72b"


def check_prefix(prefix: str) -> str:
    """--prefix: a relative path inside the bundle (``models/qwen``), each part a plain file name
    (module_utils/names.py): an absolute path, a trailing '/', '.', '..', an empty part or a control
    character is refused (exit 2), never rewritten."""
    if not prefix:
        return ""
    plain_text(prefix, "--prefix", PREFIX_FIX)
    if prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        raise UsageError(f"--prefix {prefix!r}: must be a relative path inside the bundle, without a leading "
                         "or trailing '/' or an empty part", fix=PREFIX_FIX)
    for part in prefix.split("/"):
        if part in (".", ".."):
            raise UsageError(f"--prefix {prefix!r}: must be a path inside the bundle (no '.' or '..' parts)",
                             fix=PREFIX_FIX)
        check_name(part, "file", f"--prefix {prefix!r}: part")
    return prefix


def _check_out(fmt: str, out: str | None) -> None:
    """--out before any hashing: a directory for the sums (made when missing), a file for JSON."""
    if not out or out == "-":
        return
    if fmt == "sums" and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"models manifest --out {shown(out)} is a file; with --format sums it names the directory for "
                         f"{SUMS_FILES['md5']} and {SUMS_FILES['sha256']}", fix="pass a directory")
    if fmt == "json" and os.path.isdir(out):
        raise UsageError(f"models manifest --out {shown(out)} is a directory; with --format json it names the file to "
                         "write", fix=f"pass a file name, e.g. --out {shown(os.path.join(out, MANIFEST_FILE))}")


# --- library ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestResult:
    root: str
    format: str
    written: tuple[str, ...]
    files: int
    bytes: int
    seconds: float

    def as_dict(self) -> dict:
        return {
            "root": self.root,
            "format": self.format,
            "written": list(self.written),
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
        }


def default_sources(root: str) -> list[str]:
    return [os.path.join(root, name) for name in DEFAULT_SOURCES if os.path.isfile(os.path.join(root, name))]


def _inside(root: str, path: str) -> str | None:
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")
    return None if rel.startswith("../") else rel


def write_manifest(
    root: str,
    fmt: str = "sums",
    out: str | None = None,
    prefix: str = "",
    workers: int | None = None,
    progress=None,
) -> ManifestResult:
    """Hash every file under root once; write md5sums.txt + sha256sums.txt, or a JSON manifest."""
    t0 = time.perf_counter()
    workers, pre = check_workers(workers), check_prefix(prefix)
    _check_out(fmt, out)
    if fmt == "sums":
        out_dir = out or root
        targets = [os.path.join(out_dir, SUMS_FILES[alg]) for alg in ("md5", "sha256")]
    else:
        targets = [out or os.path.join(root, MANIFEST_FILE)]
    ignore = {rel for rel in (_inside(root, t) for t in targets if t != "-") if rel}
    ignore |= set(DEFAULT_SOURCES)
    files = tree_files(root, "models manifest")
    for target in targets:
        if target != "-":
            writable_parent(target)
    digests = _digest(root, workers, progress, ignore, files)
    if fmt == "sums":
        for alg, target in zip(("md5", "sha256"), targets, strict=True):
            sums = manifest.render_sums([(rel, getattr(d, alg)) for rel, d in digests.items()])
            _write(target, sums)
    else:
        entries = [{"path": f"{pre}/{rel}" if pre else rel, **d.as_dict()} for rel, d in digests.items()]
        text = manifest.render_manifest(entries, name=os.path.basename(os.path.realpath(root)))
        if targets[0] == "-":
            sys.stdout.write(text)
        else:
            _write(targets[0], text)
    return ManifestResult(
        root,
        fmt,
        tuple(t for t in targets if t != "-"),
        len(digests),
        sum(d.size for d in digests.values()),
        time.perf_counter() - t0,
    )


TREE_FIX = ("give the model directory its own regular files (copy, not link: cp -L, or rsync without -l/-H) "
            "and name it by a path without symbolic links")


def tree_files(root: str, what: str) -> dict[str, os.stat_result]:
    """{relative path: lstat} of every file under ``root`` (module_utils/paths.py ``tree_files``): ``root`` and
    every directory on the way to it free of symbolic links, no symbolic link, special file or hard link to a
    file outside it under it; else one UsageError (exit 2), before anything is read or written."""
    if not os.path.isdir(root):
        state = "is not a directory" if os.path.exists(root) else "does not exist"
        raise UsageError(f"{what}: model directory {shown(root)} {state}",
                         fix="pass the directory that holds the model files (config.json, *.safetensors)")
    try:
        return paths.tree_files(root)
    except paths.UnsafePath as exc:
        raise UsageError(f"{what}: refusing {exc}", fix=TREE_FIX) from None


def writable_parent(path: str) -> None:
    """The directory ``path`` is written in, made when missing, with no symbolic link on the way to it
    (module_utils/paths.py ``open_dir``); else one UsageError (exit 2)."""
    try:
        os.close(paths.open_dir(os.path.dirname(os.path.abspath(path)), create=True))
    except paths.UnsafePath as exc:
        raise UsageError(f"models manifest --out {shown(path)}: refusing {exc}",
                         fix="pass an --out whose directories are not symbolic links") from None
    except OSError as exc:
        raise UsageError(f"models manifest: cannot create the directory of {shown(path)}: {exc.strerror or exc}",
                         fix="pass an --out this user can write") from None


def check_stamps(stamps_path: str, given: bool) -> None:
    """The stamp file vouches for files it lets go unread: it must be this user's or root's alone (module_utils/
    paths.py ``private_file_problems``), else one UsageError (exit 2)."""
    problems = paths.private_file_problems(stamps_path)
    if problems:
        what = f"--stamps {shown(stamps_path)}" if given else f"the stamp file {shown(stamps_path)}"
        raise UsageError(f"models verify {what}: refusing a stamp file others can write or swap: "
                         f"{'; '.join(problems)}", fix="pass --stamps FILE in a directory of your own (mode 0700, "
                         "no symbolic link on the way), or --no-stamps")


def _write(path: str, text: str) -> None:
    try:
        checksums.atomic_write_text(path, text)
    except OSError as exc:
        raise UsageError(f"models manifest: cannot write {shown(path)}: {exc.strerror or exc}",
                         fix="pass an --out this user can write") from None


def _digest(root, workers, progress, ignore, identities):
    try:
        return checksums.digest_tree(root, workers=workers, progress=progress, ignore=ignore, identities=identities)
    except checksums.VerifyError as exc:
        raise UsageError(str(exc)) from exc


def verify_model(
    root: str,
    sources: list[str] | None = None,
    prefix: str = "",
    full: bool = False,
    allow_extra: bool = False,
    stamps: str | None = "",
    check: bool = False,
    workers: int | None = None,
    progress=None,
):
    """Verify root against its checksum sources. stamps "" = default path, None = no stamps."""
    workers, prefix = check_workers(workers), check_prefix(prefix)
    files = tree_files(root, "models verify")
    sources = sources or default_sources(root)
    if not sources:
        raise UsageError(
            f"{root}: no checksum list given and none of {', '.join(DEFAULT_SOURCES)} is there",
            fix="pass --manifest FILE (a manifest.json or md5sum/sha256sum output)",
        )
    try:
        expected = manifest.load_expected(sources, prefix=prefix)
    except manifest.ManifestError as exc:
        raise UsageError(str(exc), fix="pass checksum lists in md5sum/sha256sum or manifest.json format") from exc
    stamps_path = checksums.default_stamps_path(root) if stamps == "" else stamps
    if stamps_path:
        check_stamps(stamps_path, given=bool(stamps))
    ignore = {rel for rel in (_inside(root, s) for s in sources) if rel}
    try:
        return checksums.verify_tree(
            root,
            expected,
            stamps_path=stamps_path,
            full=full,
            workers=workers,
            allow_extra=allow_extra,
            write_stamps=not check,
            ignore=ignore,
            progress=progress,
            links="refuse",
            identities=files,
        )
    except checksums.VerifyError as exc:
        raise UsageError(str(exc)) from exc


# --- rendering -------------------------------------------------------------------------------


class TtyProgress:
    """`\\r`-updated bytes/rate line on stderr, only when stderr is a terminal; at most 5 updates/s."""

    def __init__(self, label: str, stream: TextIO | None = None):
        self.label = outputs.safe(label)  # a path: its control characters shown, not obeyed
        self.stream = stream or outputs.raw_stream(sys.stderr)  # its own \r and erase-line, not escaped
        self.enabled = self.stream.isatty()
        self.t0 = time.monotonic()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.2 and done < total):
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-6)
        eta = (total - done) / rate if rate > 0 else 0
        pct = 100 * done / total if total else 100
        self.stream.write(
            f"\r{self.label}: {_gb(done)} / {_gb(total)} ({pct:3.0f}%)  {rate / 1e6:7.1f} MB/s  ETA {eta:5.0f}s "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def render_verify(report, check: bool, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for result in report.results:
        if result.status == "ok":
            continue
        tolerated = result.status == "extra" and report.allow_extra
        word = "EXTRA (allowed)" if tolerated else result.status.upper()
        out.write(f"{word:10} {result.path}: {result.message}\n")
    totals = report.totals()
    verdict = "FAILED" if report.failed else "OK"
    out.write(
        f"{verdict}: {totals['ok']}/{totals['files'] - totals['extra']} files ok in {report.root}; "
        f"read {_gb(report.bytes_read)} in {totals['seconds']:.1f} s ({totals['mb_per_s']:.0f} MB/s, "
        f"{totals['workers']} threads); {totals['from_stamps']} files ({_gb(report.bytes_skipped)}) "
        "vouched for by stamps\n"
    )
    if report.stamps_changed:
        did = "would write" if check else ("wrote" if report.stamps_written else "could not write")
        out.write(f"{did} stamps: {report.stamps_path}\n")
    for warning in report.warnings:
        out.write(f"warning: {warning}\n")


# --- CLI -------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="write and verify model checksums (md5 + sha256, one read)")
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    mk = sub.add_parser("manifest", help="hash every file of DIR once; write md5sums.txt + sha256sums.txt or JSON")
    mk.add_argument("dir", metavar="DIR")
    mk.add_argument("--format", choices=("sums", "json"), default="sums")
    mk.add_argument(
        "--out",
        metavar="PATH",
        help="sums: directory for the two files (default DIR); json: file, '-' for stdout "
        f"(default DIR/{MANIFEST_FILE})",
    )
    mk.add_argument("--prefix", default="", help="json: prefix each path, e.g. models/qwen2.5-72b")
    mk.add_argument("--workers", type=int, default=None, help="hashing threads (default: usable cores)")
    mk.add_argument("--json", action="store_true", help="print the result as JSON")
    mk.set_defaults(func=run_manifest)

    vf = sub.add_parser("verify", help="verify DIR against md5sum/sha256sum lists or a manifest.json")
    vf.add_argument("dir", metavar="DIR")
    vf.add_argument(
        "--manifest",
        action="append",
        metavar="FILE",
        default=[],
        help=f"checksum list (repeatable; default: {', '.join(DEFAULT_SOURCES)} found in DIR)",
    )
    vf.add_argument("--prefix", default="", help="only manifest entries under this subdirectory, e.g. models/x")
    vf.add_argument("--full", action="store_true", help="read every file even if a stamp vouches for it")
    vf.add_argument("--allow-extra", action="store_true", help="files not in the list do not fail the check")
    group = vf.add_mutually_exclusive_group()
    group.add_argument(
        "--stamps", metavar="PATH", default="", help=f"stamp file (default DIR/{checksums.STAMP_FILE_NAME})"
    )
    group.add_argument("--no-stamps", action="store_true", help="neither read nor write stamps")
    vf.add_argument("--check", action="store_true", help="verify but write no stamps")
    vf.add_argument("--workers", type=int, default=None, help="hashing threads (default: usable cores)")
    vf.add_argument("--json", action="store_true", help="print the report as JSON")
    vf.set_defaults(func=run_verify)


def run_manifest(args: argparse.Namespace) -> int:
    progress = TtyProgress("hashing")
    try:
        result = write_manifest(args.dir, args.format, args.out, args.prefix, args.workers, progress)
    finally:
        progress.close()
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    elif "-" != args.out:
        rate = result.bytes / 1e6 / result.seconds if result.seconds else 0
        print(
            f"wrote {', '.join(result.written)}: {result.files} files, {_gb(result.bytes)} "
            f"in {result.seconds:.1f} s ({rate:.0f} MB/s)"
        )
    return exitcodes.OK


def run_verify(args: argparse.Namespace) -> int:
    progress = TtyProgress("verifying")
    stamps = None if args.no_stamps else args.stamps
    try:
        report = verify_model(
            args.dir,
            args.manifest,
            args.prefix,
            args.full,
            args.allow_extra,
            stamps,
            args.check,
            args.workers,
            progress,
        )
    finally:
        progress.close()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        render_verify(report, args.check)
    return exitcodes.FAILED if report.failed else exitcodes.OK
