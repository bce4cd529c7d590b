"""Tiny container image archives for the tests, built here byte by byte: an OCI image layout in a tar
(what `podman save --format oci-archive` writes) and a `docker save` tar (legacy layout, and Docker 25's with
an OCI layout beside manifest.json). Each returns the archive's path and its image id, computed here from the
config bytes (the sha256 Podman shows as the image's Id)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _config(layer: bytes, seed: str) -> bytes:
    return _json({"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
                  "config": {"Cmd": ["/bin/sh"], "Labels": {"seed": seed}},
                  "rootfs": {"type": "layers", "diff_ids": ["sha256:" + _sha(layer)]}})


def _write(path: Path, members: list[tuple[str, bytes]], gzip: bool = False) -> None:
    with tarfile.open(path, "w:gz" if gzip else "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def oci_archive(path: Path, seed: str = "a", *, images: int = 1, nested: bool = False, tamper: str = "",
                gzip: bool = False) -> tuple[Path, str]:
    """An OCI layout tar; ``images`` manifests in index.json; ``nested``: index.json -> an index -> the manifest
    (docker save since 25); ``tamper``: ``config`` (its bytes no longer match their digest) or ``no-config``."""
    members: list[tuple[str, bytes]] = [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')]
    entries, first_id = [], ""
    for n in range(images):
        layer = _layer({"bin/engine": f"#!/bin/sh\necho {seed}{n}\n".encode()})
        config = _config(layer, f"{seed}{n}")
        manifest = _json({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                          "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                     "digest": "sha256:" + _sha(config), "size": len(config)},
                          "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                      "digest": "sha256:" + _sha(layer), "size": len(layer)}]})
        first_id = first_id or _sha(config)
        stored = config + b" " if tamper == "config" else config
        if tamper != "no-config":
            members.append((f"blobs/sha256/{_sha(config)}", stored))
        members += [(f"blobs/sha256/{_sha(manifest)}", manifest), (f"blobs/sha256/{_sha(layer)}", layer)]
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "digest": "sha256:" + _sha(manifest), "size": len(manifest)})
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
    if nested:
        inner = _json(index)
        members.append((f"blobs/sha256/{_sha(inner)}", inner))
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": "application/vnd.oci.image.index.v1+json",
                                "digest": "sha256:" + _sha(inner), "size": len(inner)}]}
    members.append(("index.json", _json(index)))
    _write(path, members, gzip=gzip)
    return path, first_id


def docker_archive(path: Path, seed: str = "d", *, blobs_layout: bool = False, images: int = 1,
                   tamper: bool = False) -> tuple[Path, str]:
    """A `docker save` tar: manifest.json [{Config: <hex>.json, RepoTags, Layers}] (``blobs_layout``: Docker 25's,
    Config blobs/sha256/<hex> with an OCI layout beside it); ``tamper``: the config's bytes changed."""
    members: list[tuple[str, bytes]] = []
    listing, first_id = [], ""
    for n in range(images):
        layer = _layer({"bin/engine": f"#!/bin/sh\necho {seed}{n}\n".encode()})
        config = _config(layer, f"{seed}{n}")
        cid, lid = _sha(config), _sha(layer)
        first_id = first_id or cid
        config_name = f"blobs/sha256/{cid}" if blobs_layout else f"{cid}.json"
        layer_name = f"blobs/sha256/{lid}" if blobs_layout else f"{lid}/layer.tar"
        members += [(config_name, config + (b" " if tamper else b"")), (layer_name, layer)]
        listing.append({"Config": config_name, "RepoTags": [f"localhost/test/{seed}{n}:latest"],
                        "Layers": [layer_name]})
    members.append(("manifest.json", _json(listing)))
    _write(path, members)
    return path, first_id
