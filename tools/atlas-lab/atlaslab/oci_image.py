"""An OCI image archive built offline from directories: no registry, no daemon, the standard library only.

One layer per :class:`Tree` (a directory and where its contents go in the image), an image config
(Env, Entrypoint, Cmd, WorkingDir, Labels) and the OCI image layout (``oci-layout``, ``index.json``,
``blobs/sha256/...``) packed in one tar: what ``podman load -i`` takes (an ``oci-archive``).

The bytes depend only on the input (names, contents, modes, numeric owners, integer mtimes, hard links):
the same trees and config give the same archive and the same manifest digest on any machine. That is
why the layers are **uncompressed** tars: a gzip stream's bytes depend on the zlib build (zlib-ng, a
different level or version), so a gzip layer's digest would not be reproducible across hosts, and gzip
on one core costs more time than it saves for an archive that is copied to nodes inside the (already
checksummed) bundle. Uncompressed, a layer's digest is also its diff_id.

File modification times are kept (as integer seconds): a virtualenv's ``.pyc`` files are checked
against their source's mtime, and resetting mtimes would make every import recompile. Extended
attributes (file capabilities) and sockets are not carried; device nodes are, except under the
``skip_contents`` directories (``dev``, ``proc``, ``sys``, ``run``, ``tmp`` of a root filesystem:
the runtime mounts its own).

Each layer is generated twice: once only to hash it (nothing is stored), then into the archive, where
its digest is checked again, so a source tree that changes during the build is an error rather than a
manifest that lies. Usage::

    image = build(out, [Tree(rootfs, skip_contents=ROOTFS_SKIP), Tree(venv, "/opt/atlas/engines/vllm")],
                  ImageConfig(env={"PATH": "..."}, cmd=("python3",)), ref_name="atlas/vllm:0.32.0")
    image.manifest_digest  # "sha256:..."; after `podman load`, run it as `podman run <name>@<digest>`
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import stat
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
REF_NAME = "org.opencontainers.image.ref.name"
LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'
ROOTFS_SKIP = ("dev", "proc", "sys", "run", "tmp")
EPOCH = "1970-01-01T00:00:00Z"
BLOCK = 512
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class ImageError(Exception):
    """An archive that does not validate, or a source that changed while the image was built."""


@dataclass(frozen=True)
class Tree:
    """A directory whose contents become one layer at ``dest`` in the image."""

    source: Path
    dest: str = "/"
    skip_contents: tuple[str, ...] = ()  # directories (relative to source) kept empty in the image


@dataclass(frozen=True)
class ImageConfig:
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    user: str = ""
    architecture: str = ""  # OCI name (amd64, arm64); empty: this machine's
    created: str = EPOCH


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int


@dataclass(frozen=True)
class BuiltImage:
    path: Path
    manifest_digest: str
    config_digest: str
    layers: tuple[Blob, ...]
    ref_name: str | None
    size: int  # of the archive


def oci_arch(machine: str | None = None) -> str:
    machine = machine or platform.machine()
    return _ARCH.get(machine, machine)


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Sink(io.RawIOBase):
    """A write-only stream that hashes and counts what it is given and passes it on (or drops it)."""

    def __init__(self, target: BinaryIO | None = None) -> None:
        self.sha = hashlib.sha256()
        self.size = 0
        self.target = target

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha.update(data)
        self.size += len(data)
        if self.target is not None:
            self.target.write(data)
        return len(data)

    @property
    def digest(self) -> str:
        return "sha256:" + self.sha.hexdigest()


def _walk(root: Path, skip: set[str], rel: str = "") -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative path, path, lstat) of everything under ``root``, depth first, names sorted."""
    with os.scandir(root / rel if rel else root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rpath = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        yield rpath, Path(entry.path), st
        if stat.S_ISDIR(st.st_mode) and rpath not in skip:
            yield from _walk(root, skip, rpath)


def _info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = int(st.st_mtime)
    return info


def _dir_info(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uname, info.gname = tarfile.DIRTYPE, 0o755, 0, "", ""
    return info


def _write_layer(tree: Tree, out: BinaryIO) -> None:
    """The layer's tar, written to ``out``; the bytes depend only on the tree's contents and metadata."""
    dest = PurePosixPath("/", tree.dest)
    prefix = str(dest.relative_to("/"))
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        if prefix != ".":
            for parent in reversed(dest.parents[:-1]):  # opt, opt/atlas, ... above the tree
                tar.addfile(_dir_info(str(parent.relative_to("/"))))
            top = _info(prefix, os.stat(tree.source))
            top.type = tarfile.DIRTYPE
            tar.addfile(top)
        links: dict[tuple[int, int], str] = {}
        for rel, path, st in _walk(tree.source, set(tree.skip_contents)):
            name = rel if prefix == "." else f"{prefix}/{rel}"
            info = _info(name, st)
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                info.type = tarfile.DIRTYPE
            elif stat.S_ISLNK(mode):
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            elif stat.S_ISREG(mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in links:
                    info.type, info.linkname = tarfile.LNKTYPE, links[key]
                else:
                    links[key] = name
                    info.size = st.st_size
                    with open(path, "rb") as src:
                        tar.addfile(info, src)
                    continue
            elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
                info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            elif stat.S_ISFIFO(mode):
                info.type = tarfile.FIFOTYPE
            else:
                continue  # a socket: not representable in a tar
            tar.addfile(info)


def layer_blob(tree: Tree) -> Blob:
    """Digest and size of the tree's layer, computed without storing it."""
    sink = _Sink()
    _write_layer(tree, sink)  # type: ignore[arg-type]
    return Blob(sink.digest, sink.size)


def image_config(config: ImageConfig, layers: Sequence[Blob], trees: Sequence[Tree]) -> dict[str, object]:
    run: dict[str, object] = {}
    if config.env:
        run["Env"] = [f"{k}={v}" for k, v in config.env.items()]
    if config.entrypoint:
        run["Entrypoint"] = list(config.entrypoint)
    if config.cmd:
        run["Cmd"] = list(config.cmd)
    if config.working_dir:
        run["WorkingDir"] = config.working_dir
    if config.labels:
        run["Labels"] = dict(config.labels)
    if config.user:
        run["User"] = config.user
    return {
        "created": config.created,
        "architecture": config.architecture or oci_arch(),
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [layer.digest for layer in layers]},
        "history": [{"created": config.created, "created_by": f"atlaslab.oci_image: {PurePosixPath('/', t.dest)}"}
                    for t in trees],
    }


def _tar_member(out: BinaryIO, name: str, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = size, 0o644, 0, "", ""
    out.write(info.tobuf(format=tarfile.PAX_FORMAT))  # PAX: a layer over 8 GiB


def _pad(out: BinaryIO, size: int) -> None:
    if size % BLOCK:
        out.write(b"\0" * (BLOCK - size % BLOCK))


def _blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


def build(out: Path, trees: Sequence[Tree], config: ImageConfig, ref_name: str | None = None) -> BuiltImage:
    """Write the OCI archive to ``out`` (atomically) and describe it; ``ref_name`` names it in index.json."""
    if not trees:
        raise ImageError("an image needs at least one tree")
    layers = [layer_blob(tree) for tree in trees]
    config_bytes = canonical_json(image_config(config, layers, trees))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": {"mediaType": MEDIA_CONFIG, "digest": digest_of(config_bytes), "size": len(config_bytes)},
        "layers": [{"mediaType": MEDIA_LAYER, "digest": b.digest, "size": b.size} for b in layers],
    }
    manifest_bytes = canonical_json(manifest)
    entry: dict[str, object] = {"mediaType": MEDIA_MANIFEST, "digest": digest_of(manifest_bytes),
                                "size": len(manifest_bytes)}
    if ref_name:
        entry["annotations"] = {REF_NAME: ref_name}
    index_bytes = canonical_json({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [entry]})
    partial = out.with_name(out.name + ".partial")
    try:
        with open(partial, "wb") as f:
            small = [("oci-layout", LAYOUT), ("index.json", index_bytes),
                     (_blob_name(digest_of(manifest_bytes)), manifest_bytes),
                     (_blob_name(digest_of(config_bytes)), config_bytes)]
            for name, data in small:
                _tar_member(f, name, len(data))
                f.write(data)
                _pad(f, len(data))
            for tree, blob in zip(trees, layers, strict=True):
                _tar_member(f, _blob_name(blob.digest), blob.size)
                sink = _Sink(f)
                _write_layer(tree, sink)  # type: ignore[arg-type]
                if (sink.digest, sink.size) != (blob.digest, blob.size):
                    raise ImageError(f"{tree.source} changed while the image was built; build it again")
                _pad(f, blob.size)
            f.write(b"\0" * (2 * BLOCK))
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return BuiltImage(out, digest_of(manifest_bytes), digest_of(config_bytes), tuple(layers), ref_name,
                      out.stat().st_size)


def _check_blob(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo], desc: Mapping[str, object]) -> bytes | None:
    """Verify the blob named by a descriptor (digest, size); return its bytes when it is small (JSON)."""
    digest, size = str(desc.get("digest", "")), desc.get("size")
    if not digest.startswith("sha256:") or len(digest) != 71:
        raise ImageError(f"bad digest {digest!r}")
    member = members.get(_blob_name(digest))
    if member is None:
        raise ImageError(f"blob {digest} is missing")
    if member.size != size:
        raise ImageError(f"blob {digest}: size {member.size}, descriptor says {size}")
    src = tar.extractfile(member)
    assert src is not None
    sha, keep = hashlib.sha256(), member.size <= 4 * 1024 * 1024
    chunks = []
    while chunk := src.read(1 << 20):
        sha.update(chunk)
        if keep:
            chunks.append(chunk)
    if "sha256:" + sha.hexdigest() != digest:
        raise ImageError(f"blob {digest}: content does not match its digest")
    return b"".join(chunks) if keep else None


def verify(archive: Path) -> BuiltImage:
    """Validate an OCI archive: oci-layout, index.json -> manifest -> config and layers (digests, sizes)."""
    with tarfile.open(archive, "r:") as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        for name in ("oci-layout", "index.json"):
            if name not in members:
                raise ImageError(f"{archive}: no {name}")
        layout = json.loads(tar.extractfile(members["oci-layout"]).read())  # type: ignore[union-attr]
        if layout.get("imageLayoutVersion") != "1.0.0":
            raise ImageError(f"{archive}: oci-layout {layout}")
        index = json.loads(tar.extractfile(members["index.json"]).read())  # type: ignore[union-attr]
        entries = index.get("manifests") or []
        if index.get("schemaVersion") != 2 or len(entries) != 1 or entries[0].get("mediaType") != MEDIA_MANIFEST:
            raise ImageError(f"{archive}: index.json must list one image manifest")
        manifest = json.loads(_check_blob(tar, members, entries[0]) or b"{}")
        if manifest.get("schemaVersion") != 2 or manifest.get("config", {}).get("mediaType") != MEDIA_CONFIG:
            raise ImageError(f"{archive}: not an OCI image manifest")
        config = json.loads(_check_blob(tar, members, manifest["config"]) or b"{}")
        layers = []
        for desc in manifest.get("layers", []):
            if desc.get("mediaType") != MEDIA_LAYER:
                raise ImageError(f"{archive}: layer media type {desc.get('mediaType')}")
            _check_blob(tar, members, desc)
            layers.append(Blob(desc["digest"], desc["size"]))
        if config.get("rootfs", {}).get("diff_ids") != [b.digest for b in layers]:
            raise ImageError(f"{archive}: config rootfs.diff_ids do not match the layers")
    return BuiltImage(archive, entries[0]["digest"], manifest["config"]["digest"], tuple(layers),
                      (entries[0].get("annotations") or {}).get(REF_NAME), archive.stat().st_size)
