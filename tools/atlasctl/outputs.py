"""Write the files a user asks atlasctl for into a directory the user names, never through a link.

A name in the directory may already be a symbolic link or a file someone else created (a shared
``/tmp``): opening it for writing would write wherever the link points, as the user running atlasctl.
So each file is created in a fresh private directory inside the target (mode 0700, made by this
process), with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and its final mode, and then renamed over the name: a
link or file that was there is replaced, never written through. Every step is relative to the target
directory opened once with ``O_NOFOLLOW``, so swapping the directory for a link midway changes nothing.
Problems are one UsageError naming the directory (exit code 2).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from atlasctl.errors import UsageError


def write_files(directory: Path, files: Iterable[tuple[str, str, int]], what: str = "--out") -> list[Path]:
    """Write each ``(name, text, mode)`` into ``directory`` (created if missing); the paths written."""
    files = list(files)
    fix = f"pass {what} a directory of your own (it is created if missing)"
    if directory.is_symlink():
        raise UsageError(f"{what} {directory} is a symbolic link", fix="pass the directory it points to itself")
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{what} {directory} is a file, not a directory", fix=fix)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
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
