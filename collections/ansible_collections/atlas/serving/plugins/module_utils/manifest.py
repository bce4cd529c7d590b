# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Expected checksums of a directory tree: parse and render the formats vendors ship.

Formats read:

* ``md5sum`` / ``sha256sum`` output (GNU coreutils): ``<hex>  <name>`` (text mode),
  ``<hex> *<name>`` (binary mode), a leading ``\\`` when the name is escaped
  (``\\\\``, ``\\n``, ``\\r``), and the BSD/``--tag`` form ``SHA256 (<name>) = <hex>``.
* The bundle ``manifest.json`` (DESIGN.md): ``{"format": 1, "files": [{"path", "size",
  "sha256", "md5", ...}]}``, optionally restricted to a subdirectory ``prefix``.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass

from ansible_collections.atlas.serving.plugins.module_utils.signature import check_trusted_sha256

ALGORITHMS = ("md5", "sha256")
HEX_LENGTHS = {"md5": 32, "sha256": 64}
MANIFEST_FORMAT = 1
_HEX = re.compile(r"^[0-9a-fA-F]+$")
_TAG_LINE = re.compile(r"^(?P<alg>MD5|SHA256) \((?P<name>.*)\) = (?P<hex>[0-9a-fA-F]+)$")


class ManifestError(ValueError):
    """An expected-checksums input that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Expected:
    """What one file must be. ``None`` means "not declared by any source"."""

    path: str
    size: int | None = None
    md5: str | None = None
    sha256: str | None = None

    def digest(self, algorithm: str) -> str | None:
        return getattr(self, algorithm)

    def as_dict(self) -> dict:
        return {"size": self.size, "md5": self.md5, "sha256": self.sha256}


def normalize_relpath(name: str, where: str) -> str:
    """``./a//b`` -> ``a/b``; refuse absolute names and names that leave the root."""
    if not name:
        raise ManifestError(f"{where}: empty file name")
    if name.startswith("/"):
        raise ManifestError(
            f"{where}: absolute path {name!r}; checksum files must name paths relative to the model root"
        )
    norm = posixpath.normpath(name)
    if norm == "." or norm == ".." or norm.startswith("../"):
        raise ManifestError(f"{where}: path {name!r} is outside the root")
    return norm


def normalize_digest(value: object, algorithm: str, where: str) -> str:
    """Lower-case hex of the right length; accepts an ``<algorithm>:`` prefix as get_url does."""
    if not isinstance(value, str):
        raise ManifestError(f"{where}: {algorithm} must be a hex string, got {value!r}")
    text = value.strip()
    if ":" in text:
        alg, _sep, text = text.partition(":")
        if alg.lower() != algorithm:
            raise ManifestError(f"{where}: digest {value!r} is labelled {alg!r}, expected {algorithm}")
    if len(text) != HEX_LENGTHS[algorithm] or not _HEX.match(text):
        raise ManifestError(f"{where}: {algorithm} digest {value!r} is not {HEX_LENGTHS[algorithm]} hex characters")
    return text.lower()


def unescape_name(name: str, where: str) -> str:
    """Undo coreutils escaping (used when the line starts with a backslash)."""
    out = []
    i = 0
    while i < len(name):
        ch = name[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = name[i + 1 : i + 2]
        mapping = {"\\": "\\", "n": "\n", "r": "\r"}
        if nxt not in mapping:
            raise ManifestError(f"{where}: bad escape '\\{nxt}' in file name {name!r}")
        out.append(mapping[nxt])
        i += 2
    return "".join(out)


def escape_name(name: str) -> tuple[str, bool]:
    """Escape a name as coreutils does; returns (name, escaped?)."""
    if not any(c in name for c in "\\\n\r"):
        return name, False
    return name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r"), True


def guess_algorithm(path: str, text: str) -> str:
    """From the file name (md5sums.txt, SHA256SUMS, x.sha256) or else the first digest's length."""
    base = os.path.basename(path).lower()
    for alg in ALGORITHMS:
        if alg in base:
            return alg
    for line in text.splitlines():
        line = line.strip().lstrip("\\")
        if not line or line.startswith("#"):
            continue
        tag = _TAG_LINE.match(line)
        if tag:
            return tag.group("alg").lower()
        head = line.split(None, 1)[0]
        for alg, length in HEX_LENGTHS.items():
            if len(head) == length:
                return alg
        break
    raise ManifestError(
        f"{path}: cannot tell whether this is an md5 or sha256 list; name it md5sums.txt or "
        "sha256sums.txt, or pass the algorithm"
    )


def _parse_sums_line(line: str, algorithm: str, where: str) -> tuple[str, str]:
    tag = _TAG_LINE.match(line)
    if tag:
        if tag.group("alg").lower() != algorithm:
            raise ManifestError(f"{where}: {tag.group('alg')} line in a {algorithm} list")
        return tag.group("name"), normalize_digest(tag.group("hex"), algorithm, where)
    escaped = line.startswith("\\")
    if escaped:
        line = line[1:]
    hexlen = HEX_LENGTHS[algorithm]
    digest, rest = line[:hexlen], line[hexlen:]
    if len(rest) < 2 or rest[0] not in " \t":
        raise ManifestError(f"{where}: not a '{algorithm}sum' line: {line!r}")
    # coreutils writes two characters: ' ' + (' ' text | '*' binary); accept one space too.
    name = rest[2:] if rest[1] in " *" else rest[1:]
    if escaped:
        name = unescape_name(name, where)
    return name, normalize_digest(digest, algorithm, where)


def parse_sums(text: str, algorithm: str, source: str = "<sums>") -> dict[str, str]:
    """Parse md5sum/sha256sum output into {relative path: hex digest}."""
    if algorithm not in ALGORITHMS:
        raise ManifestError(f"{source}: unknown algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")
    result: dict[str, str] = {}
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") and not raw.startswith("\\") else raw
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{source}:{number}"
        name, digest = _parse_sums_line(line, algorithm, where)
        rel = normalize_relpath(name, where)
        if rel in result and result[rel] != digest:
            raise ManifestError(f"{where}: {rel} is listed twice with different {algorithm} digests")
        result[rel] = digest
    return result


def load_sums_file(path: str, algorithm: str | None = None) -> dict[str, str]:
    text = read_text(path)
    alg = algorithm or guess_algorithm(path, text)
    return parse_sums(text, alg, source=path)


def _strip_prefix(path: str, prefix: str) -> str | None:
    if not prefix:
        return path
    if path.startswith(prefix + "/"):
        return path[len(prefix) + 1 :]
    return None


class _LongNumber:
    """A JSON integer too long for int() (Python refuses > 4300 digits); reported, never used."""

    def __init__(self, digits: str):
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {len(self.digits)}-digit number"


def _parse_int(text: str) -> object:
    return int(text) if len(text) <= 64 else _LongNumber(text)


def parse_json(text: str, source: str) -> object:
    """JSON text -> data; every way it can fail is a ManifestError naming ``source``."""
    try:
        return json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise ManifestError(f"{source}: JSON nested too deeply to be a manifest") from None
    except ValueError as exc:
        raise ManifestError(f"{source}: invalid JSON: {exc}") from None


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_manifest(
    data: object, prefix: str = "", source: str = "<manifest>", required: tuple[str, ...] = (),
    *, bundle: bool = False,
) -> dict[str, Expected]:
    """The bundle manifest ({"files": [...]}) -> {path relative to prefix: Expected}.

    ``required`` names entry fields that must be present (``size``, ``sha256``, ``md5``); model lists
    may give either digest. ``bundle``: a bundle's own manifest.json (DESIGN.md), as
    :func:`parse_bundle_manifest` reads it: ``format`` stated, every path written as the bundle holds
    it (``a/b``, never ``./a`` or ``a//b``), and an empty bundle allowed.
    A path listed twice is refused: which of its entries would be checked?
    """
    if not isinstance(data, dict) or not isinstance(data.get("files"), list):
        got = type(data).__name__ if not isinstance(data, dict) else "an object without a 'files' list"
        raise ManifestError(f"{source}: not a manifest: expected an object with a 'files' list, got {got}")
    fmt = data.get("format")
    if (bundle or "format" in data) and (isinstance(fmt, bool) or not isinstance(fmt, int) or fmt != MANIFEST_FORMAT):
        raise ManifestError(f"{source}: unsupported manifest format {data.get('format')!r} "
                            f"(expected {MANIFEST_FORMAT})")
    norm_prefix = posixpath.normpath(prefix.strip("/")) if prefix.strip("/") else ""
    result: dict[str, Expected] = {}
    seen: dict[str, int] = {}
    for index, entry in enumerate(data["files"]):
        where = f"{source}: files[{index}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where}: each entry must be an object with 'path', 'size' and digests, "
                                f"got {type(entry).__name__}")
        if not isinstance(entry.get("path"), str):
            raise ManifestError(f"{where}: each entry needs a 'path' string")
        full = normalize_relpath(entry["path"], where)
        if bundle and full != entry["path"]:
            raise ManifestError(f"{where}: path {entry['path']!r} is not written as the bundle holds it "
                                f"({full!r}); rebuild the bundle with `atlasctl bundle build`")
        if full in seen:
            raise ManifestError(f"{where}: {full} is listed twice (also files[{seen[full]}])")
        seen[full] = index
        for key in required:
            if entry.get(key) is None:
                raise ManifestError(f"{where} ({full}): no '{key}' given")
        size = entry.get("size")
        if size is not None and not _is_size(size):
            raise ManifestError(f"{where} ({full}): size must be a non-negative integer, got {size!r}")
        digests = {
            alg: normalize_digest(entry[alg], alg, f"{where} ({full})")
            for alg in ALGORITHMS
            if entry.get(alg) is not None
        }
        if not digests:
            raise ManifestError(f"{where} ({full}): no md5 or sha256 given")
        rel = _strip_prefix(full, norm_prefix)
        if rel is None:
            continue
        result[rel] = Expected(path=rel, size=size, **digests)
    if not result and not (bundle and not norm_prefix):
        hint = f" under prefix {norm_prefix!r}" if norm_prefix else ""
        raise ManifestError(f"{source}: no files{hint}; check the manifest path and prefix")
    return result


def load_manifest(path: str, prefix: str = "", required: tuple[str, ...] = ()) -> dict[str, Expected]:
    return parse_manifest(parse_json(read_text(path), path), prefix=prefix, source=path, required=required)


BUNDLE_REQUIRED = ("size", "sha256")


def parse_bundle_manifest(data: object, source: str, prefix: str = "") -> dict[str, Expected]:
    """A bundle's manifest.json, parsed JSON -> {path relative to prefix: Expected}: the one reading of
    it for ``atlasctl bundle build|verify|push``, the roles (filter ``manifest_sha256``) and the
    controller kit's install.sh. Format 1 stated; every entry with a path as the bundle holds it, its
    size and its sha256 (md5 too when the build wrote one); each path once."""
    return parse_manifest(data, prefix=prefix, source=source, required=BUNDLE_REQUIRED, bundle=True)


def sha256_index(data: object, source: str) -> dict[str, str]:
    """A bundle's manifest.json, parsed JSON -> {path: sha256}, with each recorded zip member as
    ``<zip>!<member>`` (what a role checks an extracted file against)."""
    index = {rel: exp.sha256 for rel, exp in parse_bundle_manifest(data, source).items()}
    for number, entry in enumerate(data["files"]):
        members = entry.get("members")
        if members is None:
            continue
        where = f"{source}: files[{number}] ({entry['path']}) members"
        if not isinstance(members, list):
            raise ManifestError(f"{where}: must be a list of {{path, size, sha256}}")
        for m, member in enumerate(members):
            if not isinstance(member, dict) or not isinstance(member.get("path"), str) or not member["path"]:
                raise ManifestError(f"{where}[{m}]: each member needs a 'path' string")
            index[f"{entry['path']}!{member['path']}"] = normalize_digest(member.get("sha256"), "sha256",
                                                                          f"{where}[{m}]")
    return index


IMAGE_DIR = "images"
IMAGE_KIND = "image"
IMAGE_SUFFIX = ".tar"
IMAGE_VARIANTS = ("910b", "a3")  # the chip family an image's CANN kernels are built for (docs/containers.md)
IMAGE_FIELDS = ("image_id", "variant", "cann", "engine_release")
_IMAGE_ID = re.compile(r"[0-9a-f]{64}")  # fullmatch


def is_image_id(value: object) -> bool:
    """64 lower-case hex digits: an image id as Podman prints it (``podman inspect --format {{.Id}}``), the sha256
    of the image's config (module_utils/oci_archive.py reads it from an archive)."""
    return isinstance(value, str) and bool(_IMAGE_ID.fullmatch(value))


def bundle_images(data: object, source: str) -> dict[str, dict]:
    """A bundle's manifest.json, parsed JSON -> {image name: {name, path, size, sha256, image_id, variant, cann,
    engine_release}}: every entry of kind ``image`` (``images/<name>.tar``), each field checked. The one
    reading of a bundle's images for preflight, the engines stage and ``atlasctl bundle``."""
    listed = parse_bundle_manifest(data, source)
    images: dict[str, dict] = {}
    for number, entry in enumerate(data["files"]):
        if entry.get("kind") != IMAGE_KIND:
            continue
        path = entry["path"]
        where = f"{source}: files[{number}] ({path})"
        folder, _sep, base = path.partition("/")
        if folder != IMAGE_DIR or "/" in base or not base.endswith(IMAGE_SUFFIX) or base == IMAGE_SUFFIX:
            raise ManifestError(f"{where}: an image is listed as {IMAGE_DIR}/<name>{IMAGE_SUFFIX}")
        missing = [key for key in IMAGE_FIELDS if not isinstance(entry.get(key), str) or not entry[key]]
        if missing:
            raise ManifestError(f"{where}: an image entry needs {', '.join(missing)}; rebuild the bundle with its "
                                "`images:` spec entry (atlasctl bundle build)")
        if not is_image_id(entry["image_id"]):
            raise ManifestError(f"{where}: image_id {entry['image_id']!r} is not 64 hex digits (the image config's "
                                "sha256)")
        if entry["variant"] not in IMAGE_VARIANTS:
            raise ManifestError(f"{where}: variant {entry['variant']!r} is not one of {', '.join(IMAGE_VARIANTS)}")
        name = base[: -len(IMAGE_SUFFIX)]
        images[name] = {"name": name, "path": path, "size": listed[path].size, "sha256": listed[path].sha256,
                        **{key: entry[key] for key in IMAGE_FIELDS}}
    return images


def bundle_image(data: object, name: str, source: str) -> dict:
    """The image ``name`` of a bundle's manifest.json (parsed), as :func:`bundle_images` reads it, or a
    ManifestError naming the images the bundle has."""
    images = bundle_images(data, source)
    if name not in images:
        have = ", ".join(sorted(images)) or "none"
        raise ManifestError(f"{source} lists no image {name!r} ({IMAGE_DIR}/{name}{IMAGE_SUFFIX}); the bundle's "
                            f"images: {have}. Set serving_image to one of them, or add the image to the bundle spec's "
                            "`images:` and rebuild the bundle")
    return images[name]


def merge_expected(
    *sources: dict[str, Expected], digest_maps: dict[str, dict[str, str]] | None = None
) -> dict[str, Expected]:
    """Combine several sources; the same file with two different digests is an error."""
    merged: dict[str, dict] = {}
    items: list[tuple[str, str, object]] = []
    for source in sources:
        for rel, exp in source.items():
            for key, value in exp.as_dict().items():
                items.append((rel, key, value))
    for alg, mapping in (digest_maps or {}).items():
        for rel, digest in mapping.items():
            items.append((rel, alg, digest))
    for rel, key, value in items:
        slot = merged.setdefault(rel, {})
        if value is None:
            continue
        if slot.get(key) not in (None, value):
            raise ManifestError(f"{rel}: the checksum sources disagree on {key}: {slot[key]} vs {value}")
        slot[key] = value
    return {rel: Expected(path=rel, **fields) for rel, fields in sorted(merged.items())}


def load_expected(paths: list[str], prefix: str = "", trusted: dict[str, str] | None = None) -> dict[str, Expected]:
    """Load any mix of manifest.json and md5sum/sha256sum files, auto-detected by content.

    ``prefix`` selects entries of JSON manifests (which describe a whole bundle); md5sum/sha256sum
    lists are read as relative to the verified directory, as ``md5sum -c`` would. ``trusted``
    ({path: sha256}): those files must be exactly the bytes whose signature was verified.
    """
    if not paths:
        raise ManifestError("no checksum source given; pass a manifest.json or md5sums.txt/sha256sums.txt")
    manifests: list[dict[str, Expected]] = []
    digest_maps: dict[str, dict[str, str]] = {}
    for path in paths:
        text = read_text(path, (trusted or {}).get(path))
        if text.lstrip().startswith(("{", "[")):
            manifests.append(parse_manifest(parse_json(text, path), prefix=prefix, source=path))
            continue
        alg = guess_algorithm(path, text)
        parsed = parse_sums(text, alg, source=path)
        for rel, digest in parsed.items():
            slot = digest_maps.setdefault(alg, {})
            if slot.get(rel, digest) != digest:
                raise ManifestError(f"{path}: {rel} has a different {alg} in another list")
            slot[rel] = digest
    return merge_expected(*manifests, digest_maps=digest_maps)


def expected_fingerprint(expected: dict[str, Expected]) -> str:
    """A stable text of the expectation (used in reports, not for security)."""
    return json.dumps({k: v.as_dict() for k, v in sorted(expected.items())}, sort_keys=True)


def render_sums(entries: list[tuple[str, str]], binary: bool = False) -> str:
    """[(relative path, hex)] -> exact md5sum/sha256sum output, sorted by path."""
    lines = []
    marker = "*" if binary else " "
    for rel, digest in sorted(entries):
        name, escaped = escape_name(rel)
        lead = "\\" if escaped else ""
        lines.append(f"{lead}{digest} {marker}{name}")
    return "".join(line + "\n" for line in lines)


def manifest_document(entries: list[dict], name: str | None = None, release: str | None = None,
                      built: str | None = None) -> dict:
    """[{path, size, md5, sha256, ...}] -> the manifest (format 1), entries sorted by path. A bundle's also
    carries its ``release`` and ``built`` (UTC build time), which its signature then covers
    (module_utils/bundle_record.py: downgrade protection)."""
    document = {"format": MANIFEST_FORMAT, "name": name, "files": sorted(entries, key=lambda e: e["path"])}
    return document | ({"release": release, "built": built} if release is not None else {})


def render_manifest(entries: list[dict], name: str | None = None, release: str | None = None,
                    built: str | None = None) -> str:
    """[{path, size, md5, sha256, ...}] -> manifest.json text: the one writer of the format (bundles,
    ``atlasctl models manifest --format json``). Keys sorted at every level, so the same entries give
    the same bytes (the bytes a signature covers)."""
    return json.dumps(manifest_document(entries, name, release, built), indent=1, sort_keys=True) + "\n"


def read_text(path: str, trusted_sha256: str | None = None) -> str:
    """The file as text. With ``trusted_sha256``, the bytes read must have that sha256 (the
    manifest whose signature was verified): the check is on the very bytes then parsed."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        if trusted_sha256 is not None:
            problem = check_trusted_sha256(hashlib.sha256(data).hexdigest(), trusted_sha256, path)
            if problem:
                raise ManifestError(problem)
        return data.decode("utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(f"{path}: checksum file not found") from exc
    except IsADirectoryError as exc:
        raise ManifestError(f"{path}: is a directory, not a checksum file") from exc
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ManifestError(f"{path}: not UTF-8 text (byte 0x{byte:02x} at offset {exc.start})") from exc
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from exc
