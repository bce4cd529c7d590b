"""Engine wheelhouses for the nodes' platform, not the build machine's (bundle spec ``pip`` entries).

A pip set is resolved once per target (platform tags and Python), downloaded, gated and proven:

1. **vendor**: packages the index does not carry (torch's ``+cpu`` build for x86_64, sgl-kernel-npu) come from
   ``vendor_dir``, each with the ``<wheel>.sha256`` its source publishes beside it, and the spec names each one,
   where it comes from and why; a missing one, or one its side file does not vouch for, is refused by name.
2. **build**: sdists the engines' guides build themselves (vLLM's platform-neutral build,
   ``VLLM_TARGET_DEVICE=empty``; SGLang's NPU build from ``pyproject_other.toml``) become wheels here, pinned by
   sha256, built once into the cache; a built wheel must be ``none-any``, or hold no native code and be given the
   nodes' platform tag (``platform``: vLLM 0.23's empty build is pure Python but tagged for the build machine,
   because its optional Rust frontend is declared); one with native code for the build machine is refused.
3. **resolve** with uv for the target (``uv pip compile --python-platform``): pip evaluates environment
   markers against the machine it runs on even with ``--platform`` (pypa/pip#11664; seen here:
   ``pip download --platform manylinux_2_28_aarch64 torch==2.7.1`` on x86_64 asks for
   ``nvidia-cuda-nvrtc-cu12``, which torch pins only for ``platform_machine == "x86_64"``). A ``leave_out``
   package (a requirement of a requirement, named with the reason) is excluded from the resolution
   (``uv --excludes``): the node installs the lock with ``--no-deps`` and ``pip check`` names that one gap.
4. **gate**: the resolved torch, torch-npu and vLLM of an ``engine`` set are judged by the compatibility table
   (module_utils/compat.py) against the engine release and each CANN the bundle carries; a set the gate would
   refuse on the nodes is refused here.
5. **download** the locked wheels with pip (``--no-deps``, the target's tags), then **prove** the wheelhouse alone
   installs for the target: ``uv pip install --dry-run --no-index`` resolves the same pins from it, and
   ``pip install --dry-run --no-index --no-deps --platform`` accepts every locked wheel.

``requirements.lock`` (what the engines role installs with ``pip install --no-index --no-deps``) is the union
of the targets' locks; a pin that not every target has carries a marker (``platform_machine``,
``python_version``), which pip evaluates correctly on the node itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import reprlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256

from atlasctl.errors import EnvironmentProblem, UsageError

LOCK = "requirements.lock"
_TAG = re.compile(r"(?:manylinux_(\d+)_(\d+)|manylinux(2014|2010|1)|linux)_(x86_64|aarch64)")  # fullmatch
_LEGACY = {"2014": 17, "2010": 12, "1": 5}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)$")
_TARGET_FIX = "write e.g. {platform: [manylinux_2_28_aarch64], python: '3.11'}"


def canonical(name: str) -> str:
    """PEP 503 name: ``Torch_NPU`` -> ``torch-npu``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclasses.dataclass(frozen=True)
class Target:
    """A node platform: the wheel platform tags it takes and its Python (``3.11``)."""
    tags: tuple[str, ...]
    python: str

    @property
    def arch(self) -> str:
        return _TAG.fullmatch(self.tags[0]).group(4)

    @property
    def glibc(self) -> int:
        """The newest manylinux glibc minor the tags name (manylinux2014 is 2.17)."""
        minors = []
        for tag in self.tags:
            m = _TAG.fullmatch(tag)
            minors.append(int(m.group(2)) if m.group(2) else _LEGACY.get(m.group(3) or "", 17))
        return max(minors)

    @property
    def uv_platform(self) -> str:
        return f"{self.arch}-manylinux_2_{self.glibc}"

    def pip_tags(self) -> list[str]:
        """Every tag such a node takes, newest first (pip matches tags exactly; uv takes all of these)."""
        tags = [f"manylinux_2_{minor}_{self.arch}" for minor in range(self.glibc, 16, -1)]
        tags += [f"manylinux2014_{self.arch}", f"linux_{self.arch}"]
        return list(dict.fromkeys([*self.tags, *tags]))

    def platform_args(self) -> list[str]:
        """pip's ``--python-version V --platform T ...`` for this target."""
        return ["--python-version", self.python, *[a for tag in self.pip_tags() for a in ("--platform", tag)]]

    @property
    def label(self) -> str:
        return f"{'/'.join(self.tags)} / Python {self.python}"

    @property
    def key(self) -> str:
        return f"{self.uv_platform}-py{self.python}"


def parse_target(where: str, target: object) -> Target:
    """One check of a target mapping for every spec key that has targets (pip sets, the controller kit)."""
    platform = target.get("platform") if isinstance(target, dict) else None
    tags = [platform] if isinstance(platform, str) else platform
    python = target.get("python") if isinstance(target, dict) else None
    if (not isinstance(tags, list) or not tags or not all(isinstance(t, str) and t for t in tags)
            or not isinstance(python, str) or not re.fullmatch(r"3\.\d+", python)):
        raise UsageError(f"{where}: target {reprlib.repr(target)} needs platform (a wheel platform tag or a list "
                         "of them) and python (a string, e.g. '3.11')", fix=_TARGET_FIX)
    bad = [t for t in tags if not _TAG.fullmatch(t)]
    if bad:
        raise UsageError(f"{where}: platform tag {bad[0]!r} is not a Linux x86_64/aarch64 wheel tag",
                         fix="use tags like manylinux_2_28_aarch64, manylinux2014_x86_64 or linux_aarch64")
    if len({_TAG.fullmatch(t).group(4) for t in tags}) != 1:
        raise UsageError(f"{where}: target {reprlib.repr(target)} mixes architectures",
                         fix="write one target per architecture")
    return Target(tuple(tags), python)


def parse_targets(where: str, targets: object) -> list[Target]:
    if not isinstance(targets, list) or not targets:
        raise UsageError(f"{where}: needs targets, the nodes' platform and Python", fix=f"targets: [{_TARGET_FIX[9:]}]")
    return [parse_target(where, t) for t in targets]


# --- the spec entry --------------------------------------------------------------------------------

_ENTRY_KEYS = {"set", "requirements", "targets", "find_links", "no_index", "index_url", "engine", "build",
               "vendor_dir", "vendor", "leave_out"}


@dataclasses.dataclass(frozen=True)
class Build:
    """An sdist built into a platform-neutral wheel: ``sdist`` (URL, or a file name in vendor_dir), its
    ``sha256``, ``env`` for the build, ``pyproject`` (a file of the sdist used as its pyproject.toml),
    ``isolation`` (pip's build isolation, on unless false), and ``platform``: the nodes' platform tag a wheel
    with no native code is given when its build tags it for the build machine."""
    sdist: str
    sha256: str
    env: tuple[tuple[str, str], ...] = ()
    pyproject: str = ""
    isolation: bool = True
    platform: str = ""

    @property
    def key(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Vendor:
    """A package the index does not carry: its wheel is in vendor_dir. ``version`` (optional) is the one
    wanted; ``arch`` narrows it to the targets of one architecture; ``source`` says where an operator gets it."""
    name: str
    source: str
    version: str = ""
    arch: str = ""


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """A requirement of a requirement the set does not carry, on purpose: ``reason`` says why."""
    name: str
    reason: str


@dataclasses.dataclass(frozen=True)
class PipSet:
    name: str
    requirements: tuple[str, ...]
    targets: tuple[Target, ...]
    find_links: tuple[str, ...] = ()
    no_index: bool = False
    index_url: str = ""
    engine: tuple[str, str] | None = None
    builds: tuple[Build, ...] = ()
    vendor_dir: str = ""
    vendor: tuple[Vendor, ...] = ()
    leave_out: tuple[LeftOut, ...] = ()


def parse_entry(entry: object) -> PipSet:
    """A spec ``pip`` entry, every key checked; UsageError names the set, the key and the fix."""
    if not isinstance(entry, dict):
        raise UsageError(f"pip entry {reprlib.repr(entry)} must be a mapping",
                         fix="write e.g. {set: x, requirements: [...], targets: [...]}")
    name, reqs = entry.get("set"), entry.get("requirements")
    where = f"pip entry {name!r}"
    if not name or not isinstance(reqs, list) or not reqs or not all(isinstance(r, str) and r for r in reqs):
        raise UsageError(f"pip entry {reprlib.repr(entry)}: needs set, requirements (a list of strings) and targets",
                         fix="write e.g. {set: x, requirements: [pkg==1.0], "
                             "targets: [{platform: manylinux2014_aarch64, python: '3.11'}]}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}",
                         fix=f"the keys of a pip entry are {', '.join(sorted(_ENTRY_KEYS))}")
    targets = parse_targets(where, entry.get("targets"))
    engine = entry.get("engine")
    if engine is not None and not (isinstance(engine, dict) and set(engine) == {"name", "version"}
                                   and all(isinstance(v, str) and v for v in engine.values())):
        raise UsageError(f"{where}: engine {reprlib.repr(engine)} must be {{name, version}}",
                         fix="write e.g. engine: {name: vllm-ascend, version: '0.11.0'}")
    builds = tuple(_parse_build(where, b) for b in _list(where, entry, "build"))
    vendor = tuple(_parse_vendor(where, v) for v in _list(where, entry, "vendor"))
    vendor_dir = entry.get("vendor_dir", "")
    if not isinstance(vendor_dir, str) or ((vendor or any("://" not in b.sdist for b in builds)) and not vendor_dir):
        raise UsageError(f"{where}: vendor packages and sdists by file name need vendor_dir, the directory they are in",
                         fix="set vendor_dir: /srv/atlas-vendor/wheels (or give the sdist's URL)")
    links = _list(where, entry, "find_links")
    if not all(isinstance(link, str) for link in links):
        raise UsageError(f"{where}: find_links must be a list of directories or URLs")
    leave_out = tuple(_parse_leave_out(where, item, reqs) for item in _list(where, entry, "leave_out"))
    return PipSet(str(name), tuple(reqs), tuple(targets), tuple(links), bool(entry.get("no_index")),
                  str(entry.get("index_url") or ""), (engine["name"], engine["version"]) if engine else None,
                  builds, vendor_dir, vendor, leave_out)


def _list(where: str, entry: dict, key: str) -> list:
    value = entry.get(key, [])
    if not isinstance(value, list):
        raise UsageError(f"{where}: {key} must be a list, not {reprlib.repr(value)}")
    return value


def _parse_build(where: str, item: object) -> Build:
    fix = ("write e.g. build: [{sdist: https://files.pythonhosted.org/.../vllm-0.11.0.tar.gz, sha256: <64 hex>, "
           "env: {VLLM_TARGET_DEVICE: empty}}]")
    if not isinstance(item, dict) or set(item) - {"sdist", "sha256", "env", "pyproject", "isolation", "platform"}:
        raise UsageError(f"{where}: build item {reprlib.repr(item)} has keys sdist, sha256, env, pyproject, isolation, "
                         "platform", fix=fix)
    sdist, sha, env = item.get("sdist"), str(item.get("sha256", "")).lower(), item.get("env", {})
    if not isinstance(sdist, str) or not sdist.endswith((".tar.gz", ".zip")):
        raise UsageError(f"{where}: build sdist {sdist!r} must be the URL or file name of a .tar.gz or .zip", fix=fix)
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise UsageError(f"{where}: build {sdist}: sha256 must be the sdist's 64-hex sha256 (an sdist is only built "
                         "when it is the one pinned)", fix="take it from the index's page of the file, or sha256sum")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str | int) for k, v in env.items()):
        raise UsageError(f"{where}: build {sdist}: env must map names to strings", fix=fix)
    pyproject = item.get("pyproject", "")
    if not isinstance(pyproject, str) or "/" in pyproject or pyproject in ("..", "."):
        raise UsageError(f"{where}: build {sdist}: pyproject names a file at the top of the sdist, not {pyproject!r}")
    platform = item.get("platform", "")
    if not isinstance(platform, str) or (platform and not all(_TAG.fullmatch(t) for t in platform.split("."))):
        raise UsageError(f"{where}: build {sdist}: platform {platform!r} is not a Linux x86_64/aarch64 wheel tag",
                         fix="write e.g. platform: manylinux_2_34_aarch64 (the nodes' tag)")
    return Build(sdist, sha, tuple(sorted((k, str(v)) for k, v in env.items())), pyproject,
                 bool(item.get("isolation", True)), platform)


def _parse_vendor(where: str, item: object) -> Vendor:
    fix = ("write e.g. vendor: [{name: torch, version: 2.7.1+cpu, arch: x86_64, "
           "source: 'https://download.pytorch.org/whl/cpu/torch/ (torch-npu 2.7.1 needs it on x86_64)'}]")
    if (not isinstance(item, dict) or set(item) - {"name", "version", "source", "arch"}
            or not all(isinstance(item.get(k), str) and item.get(k) for k in ("name", "source"))
            or not isinstance(item.get("version", ""), str)):
        raise UsageError(f"{where}: vendor item {reprlib.repr(item)} needs name and source (where an operator "
                         "downloads it and why it is not from the index), and may name a version", fix=fix)
    if item.get("arch", "") not in ("", "x86_64", "aarch64"):
        raise UsageError(f"{where}: vendor {item['name']}: arch is x86_64 or aarch64, not {item['arch']!r}", fix=fix)
    return Vendor(item["name"], item["source"], item.get("version", ""), item.get("arch", ""))


def _parse_leave_out(where: str, item: object, requirements: list[str]) -> LeftOut:
    fix = "write e.g. leave_out: [{name: arctic-inference, reason: 'an sdist with C++ extensions, used only by ...'}]"
    if (not isinstance(item, dict) or set(item) != {"name", "reason"}
            or not all(isinstance(v, str) and v for v in item.values())):
        raise UsageError(f"{where}: leave_out item {reprlib.repr(item)} needs name and reason (why the set does "
                         "not carry it)", fix=fix)
    named = [r for r in requirements
             if canonical(re.split(r"[\s\[;<>=!~@]", r, maxsplit=1)[0]) == canonical(item["name"])]
    if named:
        raise UsageError(f"{where}: leave_out {item['name']} is also a requirement ({named[0]})",
                         fix="leave out only what a requirement requires, or drop the requirement")
    return LeftOut(item["name"], item["reason"])


# --- the steps -------------------------------------------------------------------------------------


def _run(argv: list[str], what: str, fix: str, env: dict | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run(argv, text=True, capture_output=True, check=False, input=stdin,
                          env={**os.environ, **env} if env else None)
    if proc.returncode != 0:
        detail = "\n".join(line for line in (proc.stderr or proc.stdout).strip().splitlines()
                           if not line.startswith("WARNING: Location"))
        raise UsageError(f"{what}: {detail[-900:]}", fix=fix)
    return proc.stdout


def uv() -> list[str]:
    try:
        import uv as _uv  # noqa: F401  (the uv package of the build machine's environment)
    except ImportError:
        raise EnvironmentProblem("resolving a pip set for the nodes' platform needs uv on the build machine",
                                 fix="pip install uv (requirements.txt pins it; make venv installs it)") from None
    return [sys.executable, "-m", "uv"]


def fetch_sdist(build: Build, vendor_dir: str, cache: Path) -> Path:
    """The pinned sdist: from vendor_dir, or downloaded once into the cache; its sha256 checked every time."""
    if "://" in build.sdist:
        path = cache / "sdists" / build.sha256 / build.sdist.rsplit("/", 1)[-1]
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".part")
            try:
                with urllib.request.urlopen(build.sdist, timeout=120) as response, open(tmp, "wb") as out:
                    shutil.copyfileobj(response, out)
            except OSError as exc:
                raise UsageError(f"sdist {build.sdist} did not download: {exc}",
                                 fix="check the URL, or put the file in vendor_dir and name it by file name") from None
            os.replace(tmp, path)
    else:
        path = Path(vendor_dir) / build.sdist
        if not path.is_file():
            raise UsageError(f"sdist {build.sdist} is not in vendor_dir {vendor_dir}",
                             fix=f"download it into {vendor_dir}")
    digest = file_sha256(path)
    if digest != build.sha256:
        raise UsageError(f"sdist {path}: sha256 {digest} is not the pinned {build.sha256}",
                         fix="download the file again, or pin the sha256 its publisher lists")
    return path


def build_wheel(build: Build, vendor_dir: str, cache: Path) -> Path:
    """The sdist built into one platform-neutral wheel, once (cache/built-wheels/<key>/)."""
    kept = cache / "built-wheels" / build.key
    done = sorted(kept.glob("*.whl"))
    if done:
        return done[0]
    sdist = fetch_sdist(build, vendor_dir, cache)
    with tempfile.TemporaryDirectory(prefix="atlas-sdist-") as tmp:
        src = unpack_sdist(sdist, Path(tmp) / "src")
        if build.pyproject:
            chosen = src / build.pyproject
            if not chosen.is_file():
                raise UsageError(f"sdist {sdist.name} has no {build.pyproject} at its top",
                                 fix="name a pyproject file the sdist carries (tar tzf the sdist)")
            shutil.copy2(chosen, src / "pyproject.toml")
        out = Path(tmp) / "out"
        argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check", "-w", str(out)]
        argv += [] if build.isolation else ["--no-build-isolation"]
        _run([*argv, str(src)], f"building {sdist.name}", "see the build's own install guide for what it needs",
             env=dict(build.env))
        [wheel] = out.glob("*.whl")
        if not wheel.name.endswith("-none-any.whl"):
            native = native_members(wheel)
            if native or not build.platform:
                held = f", holding native code ({', '.join(native[:3])})" if native else ""
                raise UsageError(f"{sdist.name} built {wheel.name}, a wheel for this build machine's platform{held}, "
                                 "not the nodes'", fix="build only platform-neutral packages here (e.g. vLLM with "
                                 "VLLM_TARGET_DEVICE=empty; a wheel with no native code is given the nodes' tag with "
                                 "platform:); put platform wheels in vendor_dir")
            wheel = retag(wheel, build.platform, Path(tmp) / "retagged")
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, kept / wheel.name)
    return kept / wheel.name


def native_members(wheel: Path) -> list[str]:
    """The wheel's members that are machine code: ELF files (shared objects, executables such as a Rust
    frontend's binary), whatever their name."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        found = []
        for info in archive.infolist():
            if info.is_dir():
                continue
            with archive.open(info) as member:
                if member.read(4) == b"\x7fELF":
                    found.append(info.filename)
        return found


def retag(wheel: Path, platform: str, dest: Path) -> Path:
    """A copy of the wheel in ``dest`` with its platform tag replaced by ``platform`` (possibly dotted): the
    file name, the ``Tag:`` lines of its WHEEL file and that file's RECORD line (what ``wheel tags
    --platform-tag`` does). The Python and ABI tags stay: the wheel is for the Python that built it."""
    import base64
    import zipfile

    parts = wheel.name[:-len(".whl")].split("-")
    pythons, abis = parts[-3].split("."), parts[-2].split(".")
    out = dest / ("-".join([*parts[:-1], platform]) + ".whl")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src:
        dist_info = next(n.split("/")[0] for n in src.namelist() if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n))
        wheel_file, record_file = f"{dist_info}/WHEEL", f"{dist_info}/RECORD"
        # WHEEL is a header block (RFC 822, pip reads it with email.parser): the tags go inside it, before the
        # blank line a build ends it with, never after (pip would find no Tag and call the wheel unsupported)
        headers = src.read(wheel_file).decode().rstrip("\n").splitlines()
        lines = [line for line in headers if not line.startswith("Tag:")]
        lines += [f"Tag: {py}-{abi}-{plat}" for py in pythons for abi in abis for plat in platform.split(".")]
        new_wheel = ("\n".join(lines) + "\n\n").encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(new_wheel).digest()).rstrip(b"=").decode()
        record = [f"{wheel_file},sha256={digest},{len(new_wheel)}" if line.startswith(f"{wheel_file},") else line
                  for line in src.read(record_file).decode().splitlines()]
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                data = new_wheel if info.filename == wheel_file else (
                    ("\n".join(record) + "\n").encode() if info.filename == record_file else src.read(info))
                dst.writestr(info, data)
    return out


def unpack_sdist(sdist: Path, dest: Path) -> Path:
    """The sdist unpacked under ``dest``: its one top directory (with pyproject.toml or setup.py)."""
    dest.mkdir(parents=True)
    if sdist.name.endswith(".zip"):
        import zipfile

        with zipfile.ZipFile(sdist) as archive:
            archive.extractall(dest)
    else:
        with tarfile.open(sdist) as archive:
            archive.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1 or not ((tops[0] / "pyproject.toml").is_file() or (tops[0] / "setup.py").is_file()):
        raise UsageError(f"{sdist.name} is not an sdist (one top directory with pyproject.toml or setup.py)")
    return tops[0]


def supported_tags(target: Target) -> frozenset:
    """Every wheel tag an interpreter of the target takes (packaging.tags, as pip and uv compute them):
    cp311-cp311, cp3x-abi3 for every older 3.x, py3-none, any, on each of the target's platform tags."""
    from packaging import tags

    version = tuple(int(n) for n in target.python.split("."))
    platforms = target.pip_tags()
    return frozenset([*tags.cpython_tags(version, platforms=platforms),
                      *tags.compatible_tags(version, f"cp{version[0]}{version[1]}", platforms)])


def wheel_fits(filename: str, target: Target) -> bool:
    """Whether a wheel file installs on the target (one of its tags is one the target takes)."""
    from packaging.utils import parse_wheel_filename

    try:
        tags = parse_wheel_filename(filename)[3]
    except ValueError:
        return False
    return not tags.isdisjoint(supported_tags(target))


def check_vendor(pipset: PipSet, target: Target) -> None:
    """Every vendor package of the target's architecture is in vendor_dir as a wheel that fits it, and the
    ``<wheel>.sha256`` beside it (its source's checksum, sha256sum's format) vouches for its bytes."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    folder = Path(pipset.vendor_dir)
    files = sorted(p.name for p in folder.glob("*.whl")) if folder.is_dir() else []
    for item in pipset.vendor:
        if item.arch and item.arch != target.arch:
            continue
        found = [f for f in files if canonicalize_name(parse_wheel_filename(f)[0]) == canonicalize_name(item.name)
                 and (not item.version or str(parse_wheel_filename(f)[1]) == item.version) and wheel_fits(f, target)]
        if not found:
            what = f"{item.name} {item.version}".strip()
            raise UsageError(f"pip set {pipset.name} for {target.label}: vendor package {what} is not in vendor_dir "
                             f"{folder} (no wheel for {target.arch}, Python {target.python}); it is not on the "
                             f"index: {item.source}",
                             fix=f"download its wheel and its .sha256 into {folder}, then build again")
        for name in found:
            side = folder / f"{name}.sha256"
            words = side.read_text(errors="replace").split() if side.is_file() else []
            if not words:
                raise UsageError(f"pip set {pipset.name}: vendor wheel {folder / name} has no {side.name} beside it: "
                                 f"nothing vouches for it ({item.source})",
                                 fix=f"download the sha256 its source publishes into {side} (sha256sum's format)")
            if file_sha256(folder / name) != words[0].lower():
                raise UsageError(f"pip set {pipset.name}: vendor wheel {folder / name}: sha256 "
                                 f"{file_sha256(folder / name)} is not {side.name}'s {words[0]}",
                                 fix=f"download it again: {item.source}")


def _source_args(pipset: PipSet, links: Iterable[str]) -> list[str]:
    """Where uv and pip look: the find-links directories, then no index or the set's index."""
    args = [a for link in links for a in ("--find-links", link)]
    if pipset.no_index:
        return [*args, "--no-index"]
    return [*args, "--index-url", pipset.index_url] if pipset.index_url else args


def pinned_to_built(requirements: Iterable[str], built: dict[str, Path], where: str) -> list[str]:
    """The requirements with each package built here pointed at its wheel (``name[extras] @ file://...``), so the
    index's wheel of the same name and version (SGLang's CUDA build, say) can never be taken instead."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import parse_wheel_filename

    out, used = [], set()
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise UsageError(f"{where}: requirement {text!r} is not a PEP 508 requirement: {exc}") from None
        wheel = built.get(canonical(req.name))
        if wheel is None:
            out.append(text)
            continue
        version = parse_wheel_filename(wheel.name)[1]
        if not req.specifier.contains(version, prereleases=True):
            raise UsageError(f"{where}: {text} is not what its build makes ({wheel.name})",
                             fix=f"pin {req.name}=={version}, or build the sdist that makes the pinned version")
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        out.append(f"{req.name}{extras} @ {wheel.resolve().as_uri()}" + (f" ; {req.marker}" if req.marker else ""))
        used.add(canonical(req.name))
    unused = sorted(set(built) - used)
    if unused:
        raise UsageError(f"{where}: built {', '.join(unused)} but no requirement names it",
                         fix="add the built package to requirements, or drop its build")
    return out


def _excludes(pipset: PipSet, folder: str) -> list[str]:
    """uv's ``--excludes <file>`` for the set's leave_out packages (none: no arguments)."""
    if not pipset.leave_out:
        return []
    path = Path(folder) / "leave-out.txt"
    path.write_text("".join(f"{item.name}\n" for item in pipset.leave_out))
    return ["--excludes", str(path)]


def resolve(pipset: PipSet, target: Target, links: Iterable[str], built: dict[str, Path] | None = None
            ) -> dict[str, str]:
    """canonical name -> version, the closure of the requirements for the target (uv, markers evaluated for
    the target), less the set's leave_out packages; packages built here are taken from their wheel only."""
    built = built or {}
    where = f"pip set {pipset.name} for {target.label}"
    with tempfile.TemporaryDirectory(prefix="atlas-resolve-") as tmp:
        argv = [*uv(), "pip", "compile", "-", "-q", "--no-header", "--no-annotate", "--no-build",
                "--python-version", target.python, "--python-platform", target.uv_platform,
                *_excludes(pipset, tmp), *_source_args(pipset, links)]
        out = _run(argv, f"{where}: no set of wheels satisfies the requirements",
                   "pin versions that publish wheels for that platform and Python, carry the missing ones in "
                   "vendor_dir (vendor:), or leave one out on purpose (leave_out:)",
                   stdin="\n".join(pinned_to_built(pipset.requirements, built, where)) + "\n")
    return parse_lock(out, f"uv's lock of {pipset.name}", built)


def parse_lock(text: str, where: str, built: dict[str, Path] | None = None) -> dict[str, str]:
    from packaging.utils import parse_wheel_filename

    pins = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        head = line.split(";")[0].strip()
        url = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*@\s*(\S+)$", head)
        if url and canonical(url.group(1)) in (built or {}):
            pins[canonical(url.group(1))] = str(parse_wheel_filename(built[canonical(url.group(1))].name)[1])
            continue
        m = _PIN.match(head)
        if not m:
            raise UsageError(f"{where}: {line!r} is not a name==version pin")
        pins[canonical(m.group(1))] = m.group(3)
    return pins


def download(pipset: PipSet, target: Target, pins: dict[str, str], dest: Path, links: Iterable[str]) -> None:
    if not pins:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".lock", delete=False) as lock:
        lock.write("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
    try:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", *target.platform_args(), "--dest", str(dest),
                *_source_args(pipset, links)]
        _run([*argv, "-r", lock.name], f"pip set {pipset.name} for {target.label}: pip could not download the lock",
             "check the index (or vendor_dir) carries each pinned wheel for the target")
    finally:
        os.unlink(lock.name)


def prove(pipset: PipSet, target: Target, pins: dict[str, str], wheelhouse: Path) -> None:
    """The wheelhouse alone installs the set for the target: uv resolves the same pins from it with no index,
    and pip accepts every locked wheel for the target's tags with no index."""
    what = f"pip set {pipset.name} for {target.label}: the wheelhouse does not install with no index"
    fix = "a wheel of the lock is missing for that platform: rebuild the bundle; report it if it persists"
    with tempfile.TemporaryDirectory(prefix="atlas-prove-") as tmp:
        proc = subprocess.run([*uv(), "pip", "install", "--dry-run", "--no-index", "--find-links", str(wheelhouse),
                               "--python-version", target.python, "--python-platform", target.uv_platform,
                               *_excludes(pipset, tmp), "--target", str(Path(tmp) / "uv"), "-r", "-"], text=True,
                              capture_output=True,
                              check=False, input="\n".join(pipset.requirements) + "\n")
        if proc.returncode != 0:
            raise UsageError(f"{what}: {(proc.stderr or proc.stdout).strip()[-900:]}", fix=fix)
        got = {canonical(m.group(1)): m.group(2)  # uv prints its plan, "+ name==version", on stderr
               for m in re.finditer(r"^\s*\+ ([A-Za-z0-9._-]+)==(\S+)", proc.stdout + proc.stderr, re.M)}
        if got != pins:
            diff = sorted(set(got.items()) ^ set(pins.items()))
            raise UsageError(f"{what}: it resolves to another set than the lock ({reprlib.repr(diff)})", fix=fix)
        lock = Path(tmp) / "target.lock"
        lock.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index", "--no-deps",
                "--only-binary=:all:", "--disable-pip-version-check", "--find-links", str(wheelhouse),
                *target.platform_args(), "--target", str(Path(tmp) / "pip")]
        _run([*argv, "-r", str(lock)], what, fix)


def gate(pipset: PipSet, target: Target, pins: dict[str, str], canns: Iterable[str]) -> None:
    """Refuse an engine set the compatibility gate would refuse (module_utils/compat.py): its torch, torch-npu
    and vLLM against the engine release's row, with each CANN the bundle carries (any one may pass)."""
    if pipset.engine is None:
        return
    from ansible_collections.atlas.serving.plugins.module_utils import compat

    from atlasctl.inputs import load_yaml

    path = Path(compat.default_table_path())
    table = compat.check_table(load_yaml(path, "compatibility table"))
    engine, version = pipset.engine
    if canonical(engine) in pins and pins[canonical(engine)].split("+")[0] != version:
        raise UsageError(f"pip set {pipset.name} for {target.label}: engine {engine} {version} resolved to "
                         f"{pins[canonical(engine)]}", fix=f"pin {engine}=={version} in its requirements")
    plan = {"engine": engine, "engine_version": version, "python": target.python,
            "torch": pins.get("torch", "").split("+")[0], "torch_npu": pins.get("torch-npu", ""),
            "triton_ascend": pins.get("triton-ascend", ""),
            "vllm": pins.get("vllm", "").split("+")[0] if engine != "vllm" else ""}
    verdicts = [compat.evaluate({**plan, "cann": c}, table) for c in canns] or [compat.evaluate_pins(plan, table)]
    if not any(v["ok"] for v in verdicts):
        problems = sorted({p for v in verdicts for p in v["problems"]})
        fixes = sorted({f for v in verdicts for f in v["fixes"]})
        raise UsageError(f"pip set {pipset.name} for {target.label}: the compatibility gate refuses it: "
                         + "; ".join(problems), fix="; or ".join(fixes))


def merged_lock(locks: dict[Target, dict[str, str]]) -> str:
    """One requirements.lock for every target: a pin all targets share is plain, any other carries the
    markers of the targets that have it."""
    pythons = {t.python for t in locks}
    lines = []
    for pin in sorted({(n, v) for pins in locks.values() for n, v in pins.items()}):
        having = [t for t, pins in locks.items() if pins.get(pin[0]) == pin[1]]
        text = f"{pin[0]}=={pin[1]}"
        if len(having) != len(locks):
            terms = []
            for t in having:
                term = f'platform_machine == "{t.arch}"'
                if len(pythons) > 1:
                    term = f'({term} and python_version == "{t.python}")'
                terms.append(term)
            text += " ; " + " or ".join(dict.fromkeys(terms))
        lines.append(text)
    return "\n".join(lines) + "\n"


def canns_of(huawei: Iterable[str]) -> list[str]:
    """The CANN releases a bundle carries, from Huawei's toolkit file names (Ascend-cann-toolkit_8.3.RC2_...)."""
    found = []
    for name in huawei:
        m = re.match(r"^Ascend-cann-toolkit_([0-9][0-9A-Za-z.]*?)_linux", str(name))
        if m and m.group(1) not in found:
            found.append(m.group(1))
    return found


def build_set(pipset: PipSet, out: Path, cache: Path, canns: Iterable[str] = ()) -> dict[str, int]:
    """Build wheels/<set>/ for every target; returns {"wheels": n, "bytes": b}."""
    canns = list(canns)
    dest = out / "wheels" / pipset.name
    staging = cache / "wheelsets" / hashlib.sha256(json.dumps(dataclasses.asdict(pipset), sort_keys=True,
                                                              default=str).encode()).hexdigest()[:16]
    from packaging.utils import canonicalize_name, parse_wheel_filename

    house = staging / "wheels"
    house.mkdir(parents=True, exist_ok=True)
    for target in pipset.targets:  # before any download or build: a missing vendor wheel is named at once
        check_vendor(pipset, target)
    built: dict[str, Path] = {}
    for build in pipset.builds:
        wheel = build_wheel(build, pipset.vendor_dir, cache)
        unfit = [t.label for t in pipset.targets if not wheel_fits(wheel.name, t)]
        if unfit:
            raise UsageError(f"pip set {pipset.name}: the built {wheel.name} does not install on {', '.join(unfit)}",
                             fix="build it with the targets' Python, and give it their platform tag (platform:)")
        shutil.copy2(wheel, house / wheel.name)  # into the wheelhouse as it is: never downloaded
        built[canonical(parse_wheel_filename(wheel.name)[0])] = house / wheel.name
    vendor = [pipset.vendor_dir] if pipset.vendor_dir and Path(pipset.vendor_dir).is_dir() else []
    links = [*pipset.find_links, *vendor]
    locks: dict[Target, dict[str, str]] = {}
    for target in pipset.targets:
        pins = resolve(pipset, target, links, built)
        gate(pipset, target, pins, canns)
        download(pipset, target, {n: v for n, v in pins.items() if n not in built}, house, links)
        locks[target] = pins
    wanted = set()
    for wheel in house.glob("*.whl"):
        name, version, _b, _t = parse_wheel_filename(wheel.name)
        if any(pins.get(canonicalize_name(name)) == str(version) and wheel_fits(wheel.name, t)
               for t, pins in locks.items()):
            wanted.add(wheel.name)
    final = staging / "final"  # exactly the wheels the bundle gets, proven before they go into it
    shutil.rmtree(final, ignore_errors=True)
    final.mkdir()
    for name in wanted:
        os.link(house / name, final / name)
    for target, pins in locks.items():
        prove(pipset, target, pins, final)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        if old.name not in wanted:
            old.unlink()
    size = 0
    for name in sorted(wanted):
        src, target_file = final / name, dest / name
        if not target_file.is_file() or target_file.stat().st_size != src.stat().st_size:
            shutil.copy2(src, target_file)
        size += src.stat().st_size
    (dest / "requirements.txt").write_text("\n".join(pipset.requirements) + "\n")
    (dest / LOCK).write_text(merged_lock(locks))
    return {"wheels": len(wanted), "bytes": size}
