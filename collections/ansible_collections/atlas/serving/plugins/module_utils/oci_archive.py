# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image id of a container image archive: the sha256 of its config blob, read from the archive.

Two archive formats, both what ``podman load -i`` takes:

* an OCI image layout in a tar (``podman save --format oci-archive``, the lab's builder): ``oci-layout``,
  ``index.json`` -> the image manifest (a blob) -> ``config.digest``;
* a ``docker save`` / ``podman save --format docker-archive`` tar: ``manifest.json``, a list with one
  entry whose ``Config`` names the config file (``<hex>.json``, or ``blobs/sha256/<hex>`` from Docker 25 on).

The id is content-addressed: the config blob's bytes are hashed here and must match the digest the
archive names, so the id is what Podman shows as the image's ``Id`` after a load in either format (and
what ``podman run`` takes), whatever the archive's names or tags say. One image per archive: an archive
with several would leave which one runs to chance. The archive is an uncompressed tar (what ``docker
save`` and ``podman save`` write); only its headers and two small JSON blobs are read, so a 20 GB
archive is read in well under a second.

Standard library only: ``atlasctl bundle build`` records the id in the bundle manifest, and the
engines stage reads it again on the node before it loads the archive.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import tarfile

MEDIA_OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MEDIA_DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
_INDEXES = (MEDIA_OCI_INDEX, MEDIA_DOCKER_LIST)
_MANIFESTS = (MEDIA_OCI_MANIFEST, MEDIA_DOCKER_MANIFEST)
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")  # fullmatch
_HEX = re.compile(r"[0-9a-f]{64}")  # fullmatch
MAX_JSON = 4 * 1024 * 1024  # an index, a manifest or an image config: small JSON documents
FIX = "save the image again (`podman save -o NAME.tar IMAGE` or `docker save -o NAME.tar IMAGE`) and rebuild the bundle"


class ImageArchiveError(ValueError):
    """The archive is not a single image in a format ``podman load`` reads; the message names it."""


class _Archive:
    def __init__(self, path):
        self.path = path
        try:
            self.tar = tarfile.open(path, mode="r:")  # noqa: SIM115 - closed by close()
        except FileNotFoundError:
            raise ImageArchiveError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise ImageArchiveError(f"{path}: is a directory, not an image archive") from None
        except (tarfile.TarError, OSError) as exc:
            raise ImageArchiveError(f"{path}: not an uncompressed tar archive ({exc}); an image archive is what "
                                    "`podman save` or `docker save` writes (decompress it first, e.g. gunzip)"
                                    ) from None
        self.members = {}
        try:
            for member in self.tar.getmembers():
                if member.isfile():
                    self.members[posixpath.normpath(member.name.lstrip("/"))] = member
        except (tarfile.TarError, OSError) as exc:
            self.tar.close()
            raise ImageArchiveError(f"{path}: damaged tar archive ({exc})") from None

    def close(self):
        self.tar.close()

    def read(self, name, what):
        member = self.members.get(posixpath.normpath(name))
        if member is None:
            raise ImageArchiveError(f"{self.path}: {what} {name!r} is not in the archive; {FIX}")
        if member.size > MAX_JSON:
            raise ImageArchiveError(f"{self.path}: {what} {name!r} is {member.size} bytes, too large for JSON")
        handle = self.tar.extractfile(member)
        if handle is None:
            raise ImageArchiveError(f"{self.path}: cannot read {name!r}")
        return handle.read()

    def json(self, name, what):
        data = self.read(name, what)
        try:
            return json.loads(data.decode("utf-8")), data
        except (UnicodeDecodeError, ValueError) as exc:
            raise ImageArchiveError(f"{self.path}: {what} {name!r} is not JSON ({exc}); {FIX}") from None


def _blob_name(digest, path, what):
    match = _DIGEST.fullmatch(str(digest))
    if not match:
        raise ImageArchiveError(f"{path}: {what} digest {digest!r} is not sha256:<64 hex>; {FIX}")
    return "blobs/sha256/" + match.group(1), match.group(1)


def _checked(archive, name, claimed_hex, what):
    """The blob's bytes; their sha256 must be the digest the archive names."""
    data = archive.read(name, what)
    actual = hashlib.sha256(data).hexdigest()
    if actual != claimed_hex:
        raise ImageArchiveError(f"{archive.path}: {what} {name!r} has sha256 {actual}, but the archive names it "
                                f"{claimed_hex}: the archive is damaged; {FIX}")
    return data


def _oci_config(archive):
    index, _raw = archive.json("index.json", "OCI index")
    seen = 0
    while True:
        entries = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(entries, list) or len(entries) != 1 or not isinstance(entries[0], dict):
            count = len(entries) if isinstance(entries, list) else 0
            raise ImageArchiveError(f"{archive.path}: the OCI index lists {count} manifests; an archive in the "
                                    f"bundle holds exactly one image (save one image per archive)")
        entry = entries[0]
        name, hexd = _blob_name(entry.get("digest"), archive.path, "manifest")
        document = json.loads(_checked(archive, name, hexd, "manifest").decode("utf-8"))
        media = entry.get("mediaType") or document.get("mediaType")
        if media in _INDEXES and seen < 2:  # a nested index (docker save since 25): follow it
            index, seen = document, seen + 1
            continue
        if media not in _MANIFESTS and "config" not in document:
            raise ImageArchiveError(f"{archive.path}: the OCI index points at {media!r}, not an image manifest")
        config = document.get("config") if isinstance(document, dict) else None
        if not isinstance(config, dict):
            raise ImageArchiveError(f"{archive.path}: the image manifest has no config descriptor; {FIX}")
        name, hexd = _blob_name(config.get("digest"), archive.path, "config")
        _checked(archive, name, hexd, "image config")
        return hexd


def _docker_config(archive):
    manifest, _raw = archive.json("manifest.json", "docker-save manifest")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        count = len(manifest) if isinstance(manifest, list) else 0
        raise ImageArchiveError(f"{archive.path}: manifest.json lists {count} images; an archive in the bundle "
                                "holds exactly one image (save one image per archive)")
    config = manifest[0].get("Config")
    if not isinstance(config, str) or not config:
        raise ImageArchiveError(f"{archive.path}: manifest.json names no Config; {FIX}")
    stem = posixpath.basename(config).removesuffix(".json")
    if not _HEX.fullmatch(stem):
        raise ImageArchiveError(f"{archive.path}: manifest.json Config {config!r} is not named by its sha256; {FIX}")
    _checked(archive, config, stem, "image config")
    return stem


def image_id(path):
    """The image id (64 hex, the sha256 of the image config) of the archive at ``path``, or
    ImageArchiveError naming the archive, what is wrong and the fix."""
    archive = _Archive(path)
    try:
        if "index.json" in archive.members and "oci-layout" in archive.members:
            return _oci_config(archive)
        if "manifest.json" in archive.members:
            return _docker_config(archive)
        raise ImageArchiveError(f"{path}: neither an OCI image layout (oci-layout, index.json) nor a docker-save "
                                f"archive (manifest.json); {FIX}")
    except (UnicodeDecodeError, ValueError, tarfile.TarError, OSError) as exc:
        if isinstance(exc, ImageArchiveError):
            raise
        raise ImageArchiveError(f"{path}: cannot read the image ({exc}); {FIX}") from None
    finally:
        archive.close()
