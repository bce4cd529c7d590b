"""The bundle spec's `images:` key: the archive copied to images/<name>.tar and listed in manifest.json like every
file (size, sha256, md5, source) with kind image, its image id read from the archive, variant, cann and
engine_release; verified by `bundle verify` like everything else; read back by module_utils/manifest.py's one
reader of image entries (preflight, the engines stage)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import manifest as fmt

from atlasctl import bundle
from atlasctl.errors import UsageError
from support.image_archives import docker_archive, oci_archive


def _spec(tmp_path: Path, text: str) -> bundle.BundleSpec:
    path = tmp_path / "bundle.yml"
    path.write_text(text)
    return bundle.BundleSpec.load(path)


@pytest.fixture
def archives(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "src").mkdir()
    return {"vllm": oci_archive(tmp_path / "src/vllm.tar", "v"), "sglang": docker_archive(tmp_path / "src/sg.tar", "s")}


def _images(archives) -> str:
    return f"""
name: site
images:
  - {{name: vllm-ascend-0.11.0, archive: {archives['vllm'][0]}, variant: 910b, cann: 8.3.RC2,
     engine_release: vllm-ascend-0.11.0}}
  - {{name: sglang-0.5.6-a3, archive: {archives['sglang'][0]}, variant: a3, cann: 8.5.0, engine_release: sglang-0.5.6}}
"""


def test_images_are_copied_listed_with_their_id_and_verified(tmp_path, archives):
    out = tmp_path / "out"
    manifest = bundle.build_bundle(_spec(tmp_path, _images(archives)), out, tmp_path / "cache")
    entries = {f["path"]: f for f in manifest["files"]}
    vllm = entries["images/vllm-ascend-0.11.0.tar"]
    data = (out / "images/vllm-ascend-0.11.0.tar").read_bytes()
    assert data == archives["vllm"][0].read_bytes()
    assert vllm["sha256"] == hashlib.sha256(data).hexdigest() and vllm["size"] == len(data)
    assert (vllm["kind"], vllm["source"], vllm["image_id"]) == ("image", "local-image", archives["vllm"][1])
    assert (vllm["variant"], vllm["cann"], vllm["engine_release"]) == ("910b", "8.3.RC2", "vllm-ascend-0.11.0")
    sg = entries["images/sglang-0.5.6-a3.tar"]
    assert (sg["image_id"], sg["variant"], sg["cann"]) == (archives["sglang"][1], "a3", "8.5.0")
    assert bundle.verify_bundle(out) == []

    images = fmt.bundle_images(json.loads((out / "manifest.json").read_text()), "manifest.json")
    assert sorted(images) == ["sglang-0.5.6-a3", "vllm-ascend-0.11.0"]
    assert images["vllm-ascend-0.11.0"] == {
        "name": "vllm-ascend-0.11.0", "path": "images/vllm-ascend-0.11.0.tar", "size": len(data),
        "sha256": vllm["sha256"], "image_id": archives["vllm"][1], "variant": "910b", "cann": "8.3.RC2",
        "engine_release": "vllm-ascend-0.11.0"}

    tampered = bytearray(data)
    tampered[-2000] ^= 1
    (out / "images/vllm-ascend-0.11.0.tar").write_bytes(bytes(tampered))
    assert [b.path for b in bundle.verify_bundle(out)] == ["images/vllm-ascend-0.11.0.tar"]


def test_a_rebuild_keeps_the_id_from_the_cache_and_reads_a_replaced_archive_again(tmp_path, archives, monkeypatch):
    out = tmp_path / "out"
    spec = _spec(tmp_path, _images(archives))
    bundle.build_bundle(spec, out, tmp_path / "cache")
    reads = []
    real = bundle._ARCHIVE.image_id
    monkeypatch.setattr(bundle._ARCHIVE, "image_id", lambda p: reads.append(p) or real(p))
    bundle.write_manifest(out, "site", fields={p: e for s in bundle.plan_build(spec, tmp_path / "cache")
                                               for p, e in s.fields.items()})
    assert reads == [], "an unchanged archive's id comes from the stat cache"
    oci_archive(archives["vllm"][0], "other")  # a new image under the same name
    manifest = bundle.build_bundle(spec, out, tmp_path / "cache")
    entry = next(f for f in manifest["files"] if f["path"] == "images/vllm-ascend-0.11.0.tar")
    assert entry["image_id"] == oci_archive(tmp_path / "again.tar", "other")[1] != archives["vllm"][1]


def test_an_archive_no_entry_describes_is_refused(tmp_path, archives):
    out = tmp_path / "out"
    bundle.build_bundle(_spec(tmp_path, _images(archives)), out, tmp_path / "cache")
    (out / "images/stray.tar").write_bytes(archives["vllm"][0].read_bytes())
    with pytest.raises(UsageError, match="images/stray.tar: an image archive that no `images:` entry"):
        bundle.build_bundle(_spec(tmp_path, _images(archives)), out, tmp_path / "cache")


def test_a_bad_archive_is_refused_before_it_is_copied(tmp_path):
    (tmp_path / "bad.tar").write_text("text")
    spec = _spec(tmp_path, f"images: [{{name: bad, archive: {tmp_path}/bad.tar, variant: 910b, cann: 8.5.0, "
                           "engine_release: sglang-0.5.6}]\n")
    with pytest.raises(UsageError, match="image bad: .*bad.tar: not an uncompressed tar archive"):
        bundle.build_bundle(spec, tmp_path / "out", tmp_path / "cache")
    assert not (tmp_path / "out/images/bad.tar").exists()
    spec = _spec(tmp_path, "images: [{name: gone, archive: /nonexistent/x.tar, variant: 910b, cann: 8.5.0, "
                           "engine_release: sglang-0.5.6}]\n")
    with pytest.raises(UsageError, match="image gone: /nonexistent/x.tar does not exist"):
        bundle.build_bundle(spec, tmp_path / "out", tmp_path / "cache")


@pytest.mark.parametrize("entry, says", [
    ("{name: x, archive: a.tar, variant: 910b, cann: 8.5.0}", "missing engine_release"),
    ("{name: x, archive: a.tar, variant: 910b, cann: 8.5.0, engine_release: sglang-0.5.6, tag: y}", "unknown tag"),
    ("{name: x, archive: a.tar, variant: 910c, cann: 8.5.0, engine_release: sglang-0.5.6}", "variant '910c'"),
    ("{name: x, archive: a.tar, variant: 910b, cann: eight, engine_release: sglang-0.5.6}", "not a CANN release name"),
    ("{name: x, archive: a.tar, variant: 910b, cann: 8.5, engine_release: sglang-0.5.6}", "must be non-empty strings"),
    ("{name: x, archive: a.tar, variant: 910b, cann: 8.5.0, engine_release: sglang}", "is not <engine>-<version>"),
    ("{name: ../x, archive: a.tar, variant: 910b, cann: 8.5.0, engine_release: sglang-0.5.6}", "not a plain file name"),
    ("x.tar", "images\\[0\\] must be a mapping"),
])
def test_bad_spec_entries_are_refused_naming_the_entry(tmp_path, entry, says):
    with pytest.raises(UsageError, match=says):
        _spec(tmp_path, f"images: [{entry}]\n")


def test_a_name_twice_is_refused(tmp_path):
    one = "{name: x, archive: a.tar, variant: 910b, cann: 8.5.0, engine_release: sglang-0.5.6}"
    with pytest.raises(UsageError, match="'x' is listed twice"):
        _spec(tmp_path, f"images: [{one}, {one}]\n")


def _manifest(**image) -> dict:
    entry = {"path": "images/x.tar", "size": 1, "sha256": "a" * 64, "kind": "image", "image_id": "b" * 64,
             "variant": "910b", "cann": "8.5.0", "engine_release": "sglang-0.5.6"} | image
    return {"format": 1, "name": "t", "files": [entry, {"path": "cann/a.run", "size": 1, "sha256": "c" * 64,
                                                         "kind": "cann"}]}


@pytest.mark.parametrize("change, says", [
    ({"image_id": "sha256:" + "b" * 64}, "is not 64 hex digits"),
    ({"variant": "910"}, "variant '910' is not one of 910b, a3"),
    ({"cann": ""}, "an image entry needs cann"),
    ({"engine_release": None}, "an image entry needs engine_release"),
    ({"path": "images/sub/x.tar"}, "an image is listed as images/<name>.tar"),
])
def test_the_reader_refuses_a_malformed_image_entry(change, says):
    with pytest.raises(fmt.ManifestError, match=says):
        fmt.bundle_images(_manifest(**change), "m.json")


def test_an_unknown_name_lists_the_images_there_are():
    assert fmt.bundle_image(_manifest(), "x", "m.json")["image_id"] == "b" * 64
    with pytest.raises(fmt.ManifestError, match="lists no image 'y' .*the bundle's images: x. Set serving_image"):
        fmt.bundle_image(_manifest(), "y", "m.json")
