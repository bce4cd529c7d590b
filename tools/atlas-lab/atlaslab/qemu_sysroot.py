"""An aarch64 Debian 12 userland with CPython 3.11, run on this x86_64 machine under qemu-user: where the
wheelhouse benchmark installs an aarch64 wheel set with no index and imports it (nothing is installed on this
machine: Debian's .debs are fetched with apt-get into a private apt state and extracted with ``dpkg-deb -x``).

    sysroot/   the arm64 packages of PACKAGES, extracted (the interpreter: sysroot/usr/bin/python3.11)
    qemu/      Debian's qemu-user-static (amd64), extracted: qemu/usr/bin/qemu-aarch64-static
    debs/      the .debs, as apt-get download checked them against Debian's signed indexes

A finished sysroot is stamped with the hash of the package list, so a rerun does not reach the network.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

# One package a line, ``name`` (arm64) or ``name:arch`` (all: into the sysroot; amd64: this machine's);
# ``#`` starts a comment.
PACKAGES = """
# the interpreter and its standard library
python3.11-minimal
libpython3.11-minimal
libpython3.11-stdlib
python3.11
media-types:all
# the C libraries of CPython's own modules
libc6
libssl3
zlib1g
libffi8
libexpat1
libbz2-1.0
liblzma5
libsqlite3-0
libncursesw6
libtinfo6
libreadline8
libuuid1
libcrypt1
libdb5.3
libnsl2
libtirpc3
libgssapi-krb5-2
libkrb5-3
libk5crypto3
libkrb5support0
libcom-err2
libkeyutils1
# what the wheels' native code links from the system (torch, numpy: libstdc++, libgomp)
libgcc-s1
libstdc++6
libgomp1
libzstd1
# the emulator, for this machine
qemu-user-static:amd64
"""
SOURCES = ("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian "
           "bookworm bookworm-updates main\n"
           "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security "
           "bookworm-security main\n")
_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1
_ARCHES = ("arm64", "all", "amd64")


class SysrootError(RuntimeError):
    """The sysroot could not be made: the message names the step and what it said."""


def parse_packages(text: str) -> list[tuple[str, str]]:
    """(name, architecture) per line of a package list: ``name`` is arm64, ``name:all`` or ``name:amd64``
    names the architecture; blank lines and ``#`` comments are skipped. A bad name, an unknown architecture or a
    package named twice raises ValueError naming the line."""
    found: list[tuple[str, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, arch = line.partition(":")
        arch = arch or "arm64"
        if not _NAME.fullmatch(name) or arch not in _ARCHES:
            raise ValueError(f"package list line {number}: {raw.strip()!r} is not a Debian package name "
                             f"with an optional :{'/:'.join(_ARCHES)}")
        if any(n == name for n, _a in found):
            raise ValueError(f"package list line {number}: {name} is named twice")
        found.append((name, arch))
    return found


def apt_options(state: Path) -> list[str]:
    """apt-get options for a private apt (its own sources, lists, cache and empty dpkg status under ``state``),
    with arm64 beside this machine's amd64: nothing of the machine's own apt is read or changed."""
    return ["-o", f"Dir::State={state}/state", "-o", f"Dir::State::status={state}/status",
            "-o", f"Dir::Cache={state}/cache", "-o", f"Dir::Etc::SourceList={state}/sources.list",
            "-o", "Dir::Etc::SourceParts=/nonexistent", "-o", "APT::Architecture=amd64",
            "-o", "APT::Architectures::=amd64", "-o", "APT::Architectures::=arm64", "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=root", "-q"]


def _run(argv: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(argv, cwd=cwd, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SysrootError(f"{what}: {(proc.stderr or proc.stdout).strip()[-600:]}")


def ensure(cache: Path, packages: str = PACKAGES) -> tuple[Path, Path]:
    """(sysroot, qemu-aarch64-static) under ``cache``, made once per package list."""
    wanted = parse_packages(packages)
    cache = cache.resolve()  # apt takes a relative Dir:: path from /
    sysroot, qemu_root, debs = cache / "sysroot", cache / "qemu", cache / "debs"
    stamp = cache / "complete"
    digest = hashlib.sha256(packages.encode()).hexdigest()
    qemu = qemu_root / "usr/bin/qemu-aarch64-static"
    if stamp.is_file() and stamp.read_text().strip() == digest and qemu.is_file():
        return sysroot, qemu
    state = cache / "apt"
    for sub in ("state/lists/partial", "cache/archives/partial"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    (state / "status").touch()
    (state / "sources.list").write_text(SOURCES)
    _run(["apt-get", *apt_options(state), "update"], "apt-get update (Debian 12, arm64 and amd64)")
    debs.mkdir(parents=True, exist_ok=True)
    _run(["apt-get", *apt_options(state), "download", *[f"{n}:{a}" for n, a in wanted]],
         "apt-get download", cwd=debs)
    for root in (sysroot, qemu_root):
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
    for name, arch in wanted:
        [deb] = sorted(debs.glob(f"{name}_*_{arch}.deb"))[-1:] or [None]
        if deb is None:
            raise SysrootError(f"apt-get download left no {name}_*_{arch}.deb in {debs}")
        _run(["dpkg-deb", "-x", str(deb), str(qemu_root if arch == "amd64" else sysroot)], f"dpkg-deb -x {deb.name}")
    if not (sysroot / "usr/bin/python3.11").is_file() or not qemu.is_file():
        raise SysrootError(f"{sysroot}/usr/bin/python3.11 or {qemu} is missing after extraction")
    stamp.write_text(digest + "\n")
    return sysroot, qemu


def python(sysroot: Path, qemu: Path) -> list[str]:
    """The argv prefix that runs the sysroot's CPython 3.11 under qemu (its loader and libraries from it)."""
    return [str(qemu), "-L", str(sysroot), str(sysroot / "usr/bin/python3.11")]
