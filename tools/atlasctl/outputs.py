"""What atlasctl writes out: text for a terminal with its control characters made visible (``safe``), HTML
with them escaped too (``html_text``), and files into a directory the user names, never through a link.

Host names, paths, file content and engine replies are untrusted: a U+202E (right-to-left override), an
ANSI escape or a carriage return in one can make a printed table say something else than it holds. ``safe``
renders every character of the Unicode categories Cc, Cf, Cs, Zl and Zp as a visible ``\\uXXXX`` (a JSON
escape: JSON text stays JSON); ``escaping_streams`` routes everything the CLI prints through it (lines kept).

A directory the user names for files:

A name in the directory may already be a symbolic link or a file someone else created (a shared
``/tmp``): opening it for writing would write wherever the link points, as the user running atlasctl.
So each file is created in a fresh private directory inside the target (mode 0700, made by this
process), with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and its final mode, and then renamed over the name: a
link or file that was there is replaced, never written through. The target directory is reached (and made
where missing) one component at a time with ``O_NOFOLLOW``: a symbolic link anywhere in the path, parents
included, is refused. Every step is relative to that descriptor, so swapping a directory for a link midway
changes nothing.
Problems are one UsageError naming the directory (exit code 2).
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import secrets
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils import paths as _PATHS

from atlasctl.errors import UsageError

UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_CANDIDATE = re.compile(r"[^\x20-\x7e]")  # only these can be controls: printable ASCII never is
_LINE_CANDIDATE = re.compile(r"[^\x20-\x7e\n\t]")


def _escape(char: str) -> str:
    """``\\uXXXX`` (a UTF-16 pair beyond the BMP, as JSON writes it) for a control character, else the char."""
    if unicodedata.category(char) not in UNSAFE_CATEGORIES:
        return char
    code = ord(char)
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def safe(text: object) -> str:
    """``text`` for one line of a terminal: every control, format, surrogate and line/paragraph separator
    character (newline and tab too) escaped visibly, e.g. U+202E as ``\\u202e``, ESC as ``\\u001b``."""
    return _CANDIDATE.sub(lambda m: _escape(m.group()), str(text))


def safe_lines(text: object) -> str:
    """``text`` for a terminal, its newlines and tabs kept: every other control character escaped as ``safe``."""
    return _LINE_CANDIDATE.sub(lambda m: _escape(m.group()), str(text))


def safe_row(row: dict, keys: Iterable[str] | None = None) -> dict:
    """A table row with its cells (``keys``, else all) made ``safe``: a cell is one line of the table."""
    names = set(row if keys is None else keys)
    return {k: safe(v) if k in names and v is not None else v for k, v in row.items()}


def html_text(text: object) -> str:
    """``text`` for an HTML page: ``safe`` (a bidi override reorders a page as it does a terminal), then
    html.escape (quotes too)."""
    return html.escape(safe(text), quote=True)


class EscapingStream:
    """A text stream that writes through ``safe_lines``; everything else is the stream's (``raw``)."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(safe_lines(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


def raw_stream(stream):
    """The stream under an EscapingStream (for atlasctl's own terminal controls: a progress line's ``\\r``)."""
    return getattr(stream, "raw", stream)


@contextlib.contextmanager
def escaping_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr through ``safe_lines`` while the CLI runs; restored after."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(saved[0]), EscapingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def write_files(directory: Path, files: Iterable[tuple[str, str, int]], what: str = "--out") -> list[Path]:
    """Write each ``(name, text, mode)`` into ``directory`` (created if missing); the paths written."""
    files = list(files)
    fix = f"pass {what} a directory of your own (it is created if missing)"
    if directory.is_symlink():
        raise UsageError(f"{what} {directory} is a symbolic link", fix="pass the directory it points to itself")
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{what} {directory} is a file, not a directory", fix=fix)
    try:  # made and opened one directory at a time, never through a link (module_utils/paths.py open_dir)
        dir_fd = _PATHS.open_dir(str(directory), create=True)
    except _PATHS.UnsafePath as exc:
        raise UsageError(f"{what} {directory}: refusing {exc}",
                         fix="pass a path without symbolic links (the directory a link points to, by its own path)"
                         ) from None
    except OSError as exc:
        raise UsageError(f"{what} {directory}: cannot create or open it: {exc.strerror or exc}", fix=fix) from None
    staging = f".atlasctl-{secrets.token_hex(8)}"
    written: list[Path] = []
    name = ""
    try:
        os.mkdir(staging, 0o700, dir_fd=dir_fd)
        try:
            stage_fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                for name, text, mode in files:
                    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                                 dir_fd=stage_fd)
                    with os.fdopen(fd, "w", encoding="utf-8") as handle:
                        handle.write(text)
                        handle.flush()
                        os.fchmod(handle.fileno(), mode)  # the mode exactly, whatever the umask
                        os.fsync(handle.fileno())
                for name, _text, _mode in files:
                    os.rename(name, name, src_dir_fd=stage_fd, dst_dir_fd=dir_fd)
                    written.append(directory / name)
            finally:
                for leftover in os.listdir(stage_fd):
                    os.unlink(leftover, dir_fd=stage_fd)
                os.close(stage_fd)
        finally:
            os.rmdir(staging, dir_fd=dir_fd)
    except OSError as exc:
        where = f"{directory / name}" if name else f"{directory}"
        raise UsageError(f"{what} {directory}: cannot write {where}: {exc.strerror or exc}", fix=fix) from None
    finally:
        os.close(dir_fd)
    return written
