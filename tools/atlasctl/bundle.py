"""Offline bundles: build one from a spec, describe it in manifest.json, verify it.

Layout and manifest format are fixed in DESIGN.md. The format (parse, render), the hashing
and the comparison are the collection's module_utils (manifest.py, checksums.py), the same
code the roles run on the nodes and the controller kit's install.sh runs before installing;
this module decides what is listed, with which source, and keeps the build's stat cache.
Building is incremental: a file whose size, mtime and inode did not change keeps its
manifest entry, so a rebuild over a 100 GB bundle hashes only what changed.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import hashlib
import importlib.metadata
import json
import os
import reprlib
import shutil
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ansible_collections.atlas.serving.plugins.module_utils import bundle_record as _RECORD
from ansible_collections.atlas.serving.plugins.module_utils import checksums as _CHECKSUMS
from ansible_collections.atlas.serving.plugins.module_utils import manifest as _FORMAT
from ansible_collections.atlas.serving.plugins.module_utils import oci_archive as _ARCHIVE
from ansible_collections.atlas.serving.plugins.module_utils import signature as _LAYOUT

from atlasctl.bundle_step import PlannedStep, check_no_foreign_links, scan_tree, some_paths
from atlasctl.errors import UsageError
from atlasctl.inputs import load_yaml, read_bytes, shown
from atlasctl.inputs import name as check_name

MANIFEST = _LAYOUT.MANIFEST_NAME
SIGNATURE = _LAYOUT.SIGNATURE_NAME  # GPG detached signature of manifest.json; required unless opted out
UNLISTED = _LAYOUT.UNLISTED  # the only files of a bundle its manifest does not list
_KEYS = {"name": str, "release": str, "arch": str, "models": list, "huawei_dir": str, "huawei": list, "pip": list,
         "suite": bool, "controller": dict, "sign": str, "sign_home": str, "images": list}
FORMAT = _FORMAT.MANIFEST_FORMAT
SOURCE_GROUP = "atlasctl.bundle_sources"  # entry points of other installed packages: a SourceKind each

@dataclasses.dataclass(frozen=True)
class SourceKind:
    """Spec keys another installed package adds to bundle specs (the lab adds its doubles of Huawei's
    packages and its engine wheelsets: atlaslab.bundle_doubles). The product never imports it: it is found by
    its entry point (group ``atlasctl.bundle_sources``).

    ``keys``: each spec key it adds and the type of its value; ``check(path, data)`` raises UsageError for a
    bad entry; ``steps(data, arch, cache)`` plans its steps; ``model_step(entry)`` plans a model entry it
    builds, or returns None when the entry is not its kind.
    """
    keys: Mapping[str, type]
    check: Callable[[Path, dict], None]
    steps: Callable[[dict, str, Path], list[PlannedStep]]
    model_step: Callable[[dict], PlannedStep | None]


@functools.cache
def source_kinds() -> tuple[SourceKind, ...]:
    found = []
    for point in sorted(importlib.metadata.entry_points(group=SOURCE_GROUP), key=lambda p: p.name):
        kind = point.load()
        if not isinstance(kind, SourceKind):
            raise UsageError(f"bundle source entry point {point.name} ({point.value}) is not a SourceKind",
                             fix=f"reinstall the package that provides {point.value}")
        found.append(kind)
    return tuple(found)


@dataclasses.dataclass(frozen=True)
class BundleSpec:
    name: str
    arch: str
    models: tuple[dict, ...]
    huawei_dir: str = ""
    huawei: tuple[str, ...] = ()
    huawei_sha256: Mapping[str, str] = dataclasses.field(default_factory=dict)  # the spec's pins, by file name
    pip: tuple[dict, ...] = ()
    suite: bool = False
    # The controller kit (bundle_sources.controller_steps); it carries the suite too.
    controller: Mapping[str, object] | None = None
    sign: str = ""
    sign_home: str = ""
    # Container images (bundle_sources.image_step): images/<name>.tar, each with its variant, cann, engine_release.
    images: tuple[dict, ...] = ()
    extra: Mapping[str, object] = dataclasses.field(default_factory=dict)  # keys of installed SourceKinds
    # The release id the manifest carries beside its build time (downgrade protection); default: name.
    release: str = ""

    @classmethod
    def load(cls, path: Path) -> BundleSpec:
        data = load_yaml(path, "bundle spec", fix="pass --spec with a bundle.yml (see docs/bundle-signing.md)")
        if not isinstance(data, dict):
            raise UsageError(f"bundle spec {path} must be a mapping with name, arch, huawei, pip, models")
        keys = dict(_KEYS)
        for kind in source_kinds():
            keys.update(kind.keys)
        unknown = set(data) - set(keys)
        if unknown:
            raise UsageError(f"bundle spec {path}: unknown key(s) {', '.join(sorted(map(repr, unknown)))}",
                             fix=f"the keys of a bundle spec are {', '.join(sorted(keys))}")
        for key, kind in keys.items():
            if key in data and not isinstance(data[key], kind):
                raise UsageError(f"bundle spec {path}: '{key}' must be a {kind.__name__}")
        _check_names(path, data)  # first: a name that would leave the bundle is refused as that
        check_name(data.get("name", path.stem), "bundle", f"bundle spec {shown(path)}: name")
        if "release" in data:
            check_name(data["release"], "bundle", f"bundle spec {shown(path)}: release")
        _check_entries(path, data)
        for kind in source_kinds():
            kind.check(path, data)
        if data.get("pip"):
            from atlasctl.wheelhouse import parse_entry

            for entry in data["pip"]:
                parse_entry(entry)
        if "controller" in data:
            from atlasctl.bundle_sources import check_controller

            check_controller(path, data["controller"])
        if data.get("images"):
            from atlasctl.bundle_sources import check_images

            check_images(path, data["images"])
        if data.get("arch", "x86_64") not in ("x86_64", "aarch64"):
            raise UsageError(f"bundle spec {path}: arch must be x86_64 or aarch64, not {data['arch']!r}")
        huawei = [_huawei_entry(path, index, entry) for index, entry in enumerate(data.get("huawei", []))]
        return cls(
            name=data.get("name", path.stem),
            arch=data.get("arch", "x86_64"),
            models=tuple(data.get("models", [])),
            huawei_dir=data.get("huawei_dir", ""),
            huawei=tuple(name for name, _pin in huawei),
            huawei_sha256={name: pin for name, pin in huawei if pin},
            pip=tuple(data.get("pip", [])),
            suite=data.get("suite", False),
            controller=data.get("controller"),
            sign=data.get("sign", ""),
            sign_home=data.get("sign_home", ""),
            images=tuple(data.get("images", [])),
            extra={k: v for k, v in data.items() if k not in _KEYS},
            release=_spec_release(path, data.get("release", data.get("name", path.stem))),
        )


HUAWEI_EXAMPLE = ("- Ascend-cann-toolkit_8.5.0_linux-aarch64.run (with its .sha256 beside it), or "
                  "- {name: Ascend-cann-toolkit_8.5.0_linux-aarch64.run, sha256: <64 hex>}")


def _huawei_entry(path: Path, index: int, entry: object) -> tuple[str, str | None]:
    """(file name, pinned sha256 or None) of a ``huawei`` entry: a name, or ``{name, sha256}``."""
    if isinstance(entry, dict):
        where = f"bundle spec {path}: huawei[{index}]"
        if set(entry) != {"name", "sha256"} or not isinstance(entry.get("name"), str):
            raise UsageError(f"{where}: a mapping entry is {{name, sha256}}, not {reprlib.repr(entry)}",
                             fix=f"write e.g. '{HUAWEI_EXAMPLE}'")
        try:
            return entry["name"], _FORMAT.normalize_digest(entry["sha256"], "sha256", where)
        except _FORMAT.ManifestError as exc:
            raise UsageError(str(exc), fix="pin the sha256 Huawei's download page gives for the package") from None
    return str(entry), None


def _spec_release(path: Path, value: str) -> str:
    try:
        return _RECORD.release_of({"release": value, "built": _RECORD.now_built()}, f"bundle spec {path}")["release"]
    except _RECORD.RecordError as exc:
        raise UsageError(str(exc), fix="name the release with letters, digits and . _ + -, e.g. release: "
                         "bank-2026.12.0") from None


def _check_entries(path: Path, data: dict) -> None:
    """List entries of the right kind: names are scalars (a Huawei package may be ``{name, sha256}``), models
    and pip entries mappings."""
    for index, entry in enumerate(data.get("huawei", [])):
        if isinstance(entry, dict):
            _huawei_entry(path, index, entry)
        elif not isinstance(entry, str | int | float) or isinstance(entry, bool):
            raise UsageError(f"bundle spec {path}: huawei[{index}] must be a string or {{name, sha256}}, not "
                             f"{reprlib.repr(entry)}", fix=f"write e.g. '{HUAWEI_EXAMPLE}'")
    for key, mapping, example in (
                                  ("models", True, "- {name: qwen2.5-7b-instruct, path: /srv/models/qwen}"),
                                  ("pip", True, "- {set: x, requirements: [...], targets: [...]}"),
                                  ("images", True, "- {name: vllm-ascend-0.11.0, archive: /srv/images/vllm.tar, "
                                                   "variant: 910b, cann: 8.3.RC2, engine_release: vllm-ascend-0.11.0}")
                                  ):
        for index, entry in enumerate(data.get(key, [])):
            ok = isinstance(entry, dict) if mapping else isinstance(entry, str | int | float) and not isinstance(
                entry, bool)
            if not ok:
                kind = "a mapping" if mapping else "a string"
                raise UsageError(f"bundle spec {path}: {key}[{index}] must be {kind}, not {reprlib.repr(entry)}",
                                 fix=f"write e.g. '{example}'")


# The kind of name (module_utils/names.py) each spec list's entries are; the others are plain file names.
NAME_KINDS = {"models": "model"}


def check_plain_names(path: Path, entries: Iterable[tuple[str, object]]) -> None:
    """Every name that becomes a path in the bundle is one plain name of its kind (module_utils/names.py):
    never ``..``, ``/``, a control character or a template; a number is taken as the text YAML read, and
    what is not text is left to the entry's type check."""
    for key, value in entries:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            continue  # not text: the entry's own type check names it
        check_name(str(value), NAME_KINDS.get(key, "file"), f"bundle spec {shown(path)}: {key} entry")


def _check_names(path: Path, data: dict) -> None:
    names = [("huawei", v.get("name") if isinstance(v, dict) else v) for v in data.get("huawei", [])]
    names += [("models", m.get("name")) for m in data.get("models", []) if isinstance(m, dict) and "name" in m]
    names += [("pip", e.get("set")) for e in data.get("pip", []) if isinstance(e, dict) and "set" in e]
    names += [("images", e.get("name")) for e in data.get("images", []) if isinstance(e, dict) and "name" in e]
    check_plain_names(path, names)


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
    if parts[0] == _FORMAT.IMAGE_DIR and len(parts) == 2 and parts[1].endswith(_FORMAT.IMAGE_SUFFIX):
        return _FORMAT.IMAGE_KIND, ""
    return "other", ""


LEGACY_STAT_CACHE = ".atlas-manifest-cache.json"  # in the bundle before it moved beside it


def stat_cache_path(root: Path) -> Path:
    """The build's (size, mtime_ns, inode) -> digests cache: beside the bundle, never inside it."""
    root = root.resolve()
    return root.with_name(f".{root.name}.atlas-manifest-cache.json")


def _zip_members(path: Path) -> list[dict]:
    """Each member of a zip the roles extract (7.0.RC1 kernels): path, size, sha256 of its bytes."""
    members = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            with archive.open(info) as handle:
                digest = _CHECKSUMS.file_sha256(handle)
            members.append({"path": info.filename, "size": info.file_size, "sha256": digest})
    return members


def _is_image(rel: str) -> bool:
    return _kind_and_version(rel)[0] == _FORMAT.IMAGE_KIND


def _image_id(root: Path, rel: str) -> str:
    try:
        return _ARCHIVE.image_id(str(root / rel))
    except _ARCHIVE.ImageArchiveError as exc:
        raise UsageError(f"bundle {root}: {exc}", fix="replace the archive by a `podman save`/`docker save` of one "
                         "image, or remove it and its `images:` entry") from None


def write_manifest(root: Path, name: str, *, workers: int | None = None,
                   sources: Iterable[tuple[str, str]] = (),
                   fields: Mapping[str, Mapping[str, str]] | None = None, release: str | None = None) -> dict:
    """Describe every file under root in manifest.json (atomically replaced), with the bundle's ``release``
    (default: ``name``) and ``built``, its build time (UTC; the previous manifest's when nothing else in it
    changed, so a rebuild of the same bundle writes the same bytes): what downgrade protection orders bundles
    by (module_utils/bundle_record.py).

    Every regular file is listed, dot-files included (only manifest.json and its signature are
    not); a symlink or other non-regular entry is refused with its path. A zip's members are
    recorded too (path, size, sha256), so what a role extracts is checked before it runs. A
    cache beside the bundle maps (size, mtime_ns, inode) -> digests, so unchanged files are not
    hashed again; the others are hashed by module_utils/checksums (md5 + sha256 in one read, in
    parallel, largest first). ``sources``: (fnmatch pattern, source) pairs; a file gets the source of the
    first pattern that matches it (``vendor``, ``download``, ``local-model``, ``local-image``, ``suite``,
    ``lab-double``), none when no step of this build owns it. An image archive (``images/<name>.tar``) gets its
    ``image_id`` (module_utils/oci_archive.py, kept in the cache like a zip's members) and the fields its step
    gives (``fields``: {path: {variant, cann, engine_release}}); one that no step describes is refused.
    """
    fields = {rel: dict(extra) for rel, extra in (fields or {}).items()}
    owners = list(sources)
    cache_file = stat_cache_path(root)
    legacy = root / LEGACY_STAT_CACHE
    if legacy.is_file() and not legacy.is_symlink():
        legacy.unlink()
    try:
        old = json.loads(cache_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        old = {}
    found, odd = scan_tree(root)
    if odd:
        raise UsageError(f"bundle {root}: not a regular file (symlink or special file): {some_paths(odd)}",
                         fix="a bundle holds regular files only: replace each link by the file it points to")
    check_no_foreign_links(root, found, f"bundle {root}")
    rels = [rel for rel in found if rel not in UNLISTED and rel != f".{MANIFEST}.tmp"]

    cache: dict[str, dict] = {}
    stats = {rel: (root / rel).lstat() for rel in rels}
    to_hash = {}
    for rel in rels:
        st = stats[rel]
        prev = old.get(rel)
        if prev and prev["stat"] == [st.st_size, st.st_mtime_ns, st.st_ino] and (
                "members" in prev or not rel.endswith(".zip")) and ("image_id" in prev or not _is_image(rel)):
            cache[rel] = prev
        else:
            to_hash[rel] = str(root / rel)
    outcomes = _CHECKSUMS.hash_many(to_hash, workers, sizes={rel: stats[rel].st_size for rel in to_hash})
    for rel, outcome in outcomes.items():
        if outcome.digests is None or outcome.before != outcome.after:
            why = outcome.error or "changed while it was being hashed"
            raise UsageError(f"bundle {root}: {rel}: {why}",
                             fix="let whatever writes into the bundle finish, then build again")
        after = outcome.after
        cache[rel] = {"stat": [after.size, after.mtime_ns, after.ino], "md5": outcome.digests.md5,
                      "sha256": outcome.digests.sha256}
        if rel.endswith(".zip"):
            cache[rel]["members"] = _zip_members(root / rel)
        if _is_image(rel):
            cache[rel]["image_id"] = _image_id(root, rel)
    undescribed = [rel for rel in rels if _is_image(rel)
                   and not all(fields.get(rel, {}).get(key) for key in _FORMAT.IMAGE_FIELDS if key != "image_id")]
    if undescribed:
        raise UsageError(f"bundle {root}: {', '.join(undescribed)}: an image archive that no `images:` entry of this "
                         "build describes (variant, cann, engine_release)",
                         fix="add its entry to the bundle spec's `images:`, or remove the archive from the bundle")

    def entry(rel: str) -> dict:
        known = cache[rel]
        kind, version = _kind_and_version(rel)
        out = {"path": rel, "size": known["stat"][0], "sha256": known["sha256"], "md5": known["md5"],
               "kind": kind, "version": version}
        source = next((src for pattern, src in owners if fnmatch.fnmatchcase(rel, pattern)), None)
        out |= {"source": source} if source else {}
        if _is_image(rel):
            out |= {"image_id": known["image_id"], **fields[rel]}
        return out | ({"members": known["members"]} if "members" in known else {})

    files = [entry(rel) for rel in rels]
    release = name if release is None else release
    document = _FORMAT.manifest_document(files, name, release, _RECORD.now_built())
    try:
        before = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = None
    unchanged = {key: value for key, value in document.items() if key != "built"}
    if isinstance(before, dict) and isinstance(before.get("built"), str) \
            and {key: value for key, value in before.items() if key != "built"} == unchanged:
        document["built"] = before["built"]
    cache_file.write_text(json.dumps(cache, sort_keys=True))
    tmp = root / f".{MANIFEST}.tmp"
    tmp.write_text(_FORMAT.render_manifest(files, name, document["release"], document["built"]))
    os.replace(tmp, root / MANIFEST)
    return document


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A bundle's manifest.json from ONE read of its bytes: those bytes, their detached signature (read once
    too; None when there is none), the document parsed from the same bytes and its entries
    ({path: Expected}). What ``bundle verify|push|sign`` check, sign and send is this, never the file read
    again (module_utils/signature.py checks the signature over ``raw``)."""
    root: Path
    raw: bytes
    signature: bytes | None
    data: dict
    expected: dict

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    @property
    def path(self) -> Path:
        return self.root / MANIFEST


def load(root: Path) -> Manifest:
    """manifest.json and manifest.json.asc of the bundle ``root``, each read once, the manifest checked by the
    collection's reading of a bundle manifest (module_utils/manifest.py ``parse_bundle_manifest``: format 1,
    every entry with path, size, sha256). Not a bundle, a damaged manifest, a signature that is not a file:
    a UsageError naming the path and the fix."""
    path = root / MANIFEST
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UsageError(f"bundle directory {root} {what}, so there is no {path}",
                         fix="name the directory `atlasctl bundle build` wrote")
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"{path} does not exist: {root} is not a bundle", fix="build one with `atlasctl bundle build`")
    raw = read_bytes(path, "bundle manifest", fix="rebuild the bundle with `atlasctl bundle build`, or copy it again")
    sig_path = root / SIGNATURE
    signature = None
    if sig_path.exists() or sig_path.is_symlink():
        signature = read_bytes(sig_path, "bundle signature",
                               fix=f"remove it and sign the bundle again (atlasctl bundle sign {root} --key ...)")
    try:
        data = _FORMAT.parse_json(raw.decode("utf-8"), str(path))
        expected = _FORMAT.parse_bundle_manifest(data, str(path))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): the bundle "
                         "is damaged", fix="rebuild it with `atlasctl bundle build`, or copy it again") from None
    except _FORMAT.ManifestError as exc:
        raise UsageError(f"{exc}: the bundle is damaged",
                         fix="rebuild it with `atlasctl bundle build`, or copy it again") from None
    return Manifest(root, raw, signature, data, expected)


def read_manifest(root: Path) -> dict:
    """manifest.json of a bundle, parsed and checked (:func:`load`)."""
    return load(root).data


@dataclasses.dataclass(frozen=True)
class BadFile:
    """A file of a bundle that is not what its manifest says: module_utils/checksums ``FileResult``'s
    ``problem`` (missing | unexpected | size | sha256 | md5 | symlink | unreadable) and ``summary``."""
    path: str
    problem: str
    expected: str = ""
    actual: str = ""
    message: str = ""

    @classmethod
    def of(cls, result) -> BadFile:
        problem = result.problem
        want, have = (result.expected or {}).get(problem), (result.actual or {}).get(problem)
        return cls(result.path, problem, "" if want is None else str(want), "" if have is None else str(have),
                   result.summary)

    def describe(self) -> str:
        return f"{self.path}: {self.message or self.problem}"


def verify_bundle(root: Path, *, workers: int | None = None, manifest: Manifest | None = None) -> list[BadFile]:
    """Check every file of a bundle against its manifest; return what is wrong (empty: all good).

    ``manifest``: the one read of manifest.json the caller checked the signature of (:func:`load`); without
    it the manifest is read here. The node's verifier (module_utils/checksums ``verify_tree``, md5 + sha256
    in one read, in parallel), with no stamps and links refused: files the manifest does not list are
    reported, dot-files included (manifest.json and its signature are the only exceptions); symlinks,
    special files and hard links to files outside the bundle are reported, never followed.
    """
    expected = (manifest or load(root)).expected  # not a bundle, or a damaged manifest: a UsageError naming it
    report = _CHECKSUMS.verify_tree(str(root), expected, stamps_path=None, workers=workers,
                                    ignore=set(UNLISTED), links="refuse", listed_in="the manifest")
    return [BadFile.of(r) for r in report.bad]


# --- building -------------------------------------------------------------------------------------


def _model_step(model: dict) -> PlannedStep:
    name = model.get("name")
    if name and model.get("path"):
        from atlasctl.bundle_sources import model_dir_step

        return model_dir_step(model)
    for kind in source_kinds():
        step = kind.model_step(model)
        if step is not None:
            return step
    raise UsageError(f"model entry {reprlib.repr(model)}: a model entry has a name and the path of a local model "
                     "directory", fix="write e.g. '- {name: qwen2.5-7b-instruct, path: /srv/models/qwen}'")


def plan_build(spec: BundleSpec, cache: Path) -> list[PlannedStep]:
    steps: list[PlannedStep] = []
    for kind in source_kinds():
        steps += kind.steps(dict(spec.extra), spec.arch, cache)
    steps += [_model_step(m) for m in spec.models]
    from atlasctl import bundle_sources

    if spec.huawei and not spec.huawei_dir:
        raise UsageError("bundle spec: huawei lists packages but huawei_dir is not set",
                         fix="set huawei_dir to the directory you downloaded Huawei's packages into")
    steps += [bundle_sources.huawei_step(Path(spec.huawei_dir), n, spec.huawei_sha256.get(n)) for n in spec.huawei]
    from atlasctl.wheelhouse import canns_of

    steps += [bundle_sources.pip_step(e, cache, tuple(canns_of(spec.huawei))) for e in spec.pip]
    steps += [bundle_sources.image_step(e) for e in spec.images]
    if spec.suite or spec.controller is not None:
        from atlasctl.paths import suite_root

        if spec.controller is not None:
            steps += bundle_sources.controller_steps(dict(spec.controller), suite_root(), cache)
        steps.append(bundle_sources.suite_step(suite_root()))
    return steps


def build_bundle(spec: BundleSpec, out: Path, cache: Path,
                 progress: Callable[[str], None] | None = None, *, sign_key: str = "",
                 sign_home: Path | None = None) -> dict:
    """Build (or refresh) a bundle in place; manifest.json is written last (each file with the source of the
    step that owns it), then signed when a key is named (``sign_key``/``sign_home``, else the spec's
    ``sign``/``sign_home``). A build that fails leaves nothing it created: a new or empty ``out`` is removed
    or emptied again, with the stat cache this run wrote beside it (a bundle refreshed in place keeps what it
    had, and its manifest, which no longer matches, tells what the failed refresh changed)."""
    steps = plan_build(spec, cache)
    created = _first_missing(out)  # what this run's mkdir -p creates
    empty = created is None and out.is_dir() and not out.is_symlink() and not any(out.iterdir())
    cache_file = stat_cache_path(out)
    had_cache = cache_file.exists() or cache_file.is_symlink()
    try:
        return _build(spec, steps, out, progress, sign_key, sign_home)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        elif empty:
            for entry in list(out.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        if (created is not None or empty) and not had_cache:
            cache_file.unlink(missing_ok=True)
        raise


def _first_missing(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist (what ``mkdir -p path`` creates), or None."""
    missing = None
    for each in (path, *path.parents):
        if each.exists() or each.is_symlink():
            break
        missing = each
    return missing


def _build(spec: BundleSpec, steps: list[PlannedStep], out: Path, progress: Callable[[str], None] | None,
           sign_key: str, sign_home: Path | None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for step in steps:
        if progress:
            progress(step.title)
        step.run(out)
    if progress:
        progress("manifest")
    (out / SIGNATURE).unlink(missing_ok=True)  # a signature of the previous manifest is never left beside it
    manifest = write_manifest(out, spec.name, sources=[(pattern, s.source) for s in steps for pattern in s.owns],
                              fields={path: extra for s in steps for path, extra in s.fields.items()},
                              release=spec.release or spec.name)
    key = sign_key or spec.sign
    home = sign_home or (Path(spec.sign_home) if spec.sign_home else None)
    if key:
        if progress:
            progress(f"sign with {key}")
        from atlasctl.bundle_sources import sign_manifest

        sign_manifest(out, key, home)
    return manifest


def verify_signature(bundle: Path | Manifest, *, keyring: Path | str | None, fingerprints: Iterable[str],
                     allow_unsigned: bool = False):
    """The signature of a bundle's manifest.json against pinned fingerprints (module_utils/signature.py), over
    the bytes of its one read (``bundle``: a :func:`load` result, or the bundle directory, then read here): a
    Verdict whose sha256 is of those bytes, or a SignatureError naming the file and the fix."""
    manifest = bundle if isinstance(bundle, Manifest) else load(bundle)
    return _LAYOUT.verify_manifest(manifest.raw, manifest.signature, keyring=str(keyring or ""),
                                   fingerprints=list(fingerprints), allow_unsigned=allow_unsigned,
                                   manifest_name=str(manifest.path), signature_name=str(manifest.root / SIGNATURE))


def iter_summary(manifest: dict) -> Iterable[tuple[str, int, int]]:
    """(kind, files, bytes) per kind."""
    kinds: dict[str, list[int]] = {}
    for f in manifest["files"]:
        k = kinds.setdefault(f["kind"], [0, 0])
        k[0] += 1
        k[1] += f["size"]
    for kind in sorted(kinds):
        yield kind, kinds[kind][0], kinds[kind][1]
