"""atlaslab.oci_image: an OCI image archive built offline, byte for byte reproducible, that validates."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from atlaslab import oci_image as oi

MTIME = 1_700_000_000


def make_rootfs(root: Path) -> Path:
    for d in ("etc", "usr/bin", "dev", "proc", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "etc/os-release").write_text("ID=debian\n")
    (root / "usr/bin/tool").write_text("#!/bin/sh\necho tool\n")
    (root / "usr/bin/tool").chmod(0o755)
    os.link(root / "usr/bin/tool", root / "usr/bin/tool-again")
    (root / "usr/bin/sh").symlink_to("tool")
    (root / "dev/leftover").write_text("not in the image\n")
    (root / "tmp/junk").write_text("not in the image\n")
    (root / "tmp").chmod(0o1777)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (MTIME, MTIME), follow_symlinks=False)
    return root


def make_venv(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin/python").symlink_to("/usr/bin/python3")
    (root / "lib/site-packages/pkg").mkdir(parents=True)
    (root / "lib/site-packages/pkg/__init__.py").write_text("VERSION = '1.0'\n")
    return root


CONFIG = oi.ImageConfig(
    env={"PATH": "/opt/atlas/engines/e/bin:/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    entrypoint=("/opt/atlas/engines/e/bin/python",), cmd=("-c", "print(1)"),
    working_dir="/srv", labels={"org.opencontainers.image.version": "1.0"}, architecture="arm64",
)


@pytest.fixture()
def trees(tmp_path: Path) -> list[oi.Tree]:
    rootfs = make_rootfs(tmp_path / "rootfs")
    venv = make_venv(tmp_path / "venv")
    return [oi.Tree(rootfs, skip_contents=oi.ROOTFS_SKIP), oi.Tree(venv, "/opt/atlas/engines/e")]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def layer_entries(blob: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_same_input_gives_the_same_bytes_and_digest(tmp_path: Path, trees: list[oi.Tree]) -> None:
    one = oi.build(tmp_path / "one.tar", trees, CONFIG, ref_name="atlas/e:1.0")
    two = oi.build(tmp_path / "two.tar", trees, CONFIG, ref_name="atlas/e:1.0")
    assert one.path.read_bytes() == two.path.read_bytes()
    assert one.manifest_digest == two.manifest_digest
    assert one.size == one.path.stat().st_size
    assert not list(tmp_path.glob("*.partial"))


def test_a_change_in_content_or_mtime_changes_the_digest(tmp_path: Path, trees: list[oi.Tree]) -> None:
    before = oi.build(tmp_path / "a.tar", trees, CONFIG)
    init = trees[1].source / "lib/site-packages/pkg/__init__.py"
    os.utime(init, (MTIME + 1, MTIME + 1))
    after = oi.build(tmp_path / "b.tar", trees, CONFIG)
    assert after.manifest_digest != before.manifest_digest
    assert after.layers[0] == before.layers[0]  # the untouched tree's layer is the same blob
    labelled = oi.build(tmp_path / "c.tar", trees, oi.ImageConfig(labels={"x": "y"}))
    assert labelled.layers == after.layers and labelled.config_digest != after.config_digest


def test_the_layout_validates_index_manifest_config_layers(tmp_path: Path, trees: list[oi.Tree]) -> None:
    image = oi.build(tmp_path / "img.tar", trees, CONFIG, ref_name="atlas/e:1.0")
    files = members(image.path)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["mediaType"] == oi.MEDIA_MANIFEST
    assert entry["annotations"] == {oi.REF_NAME: "atlas/e:1.0"}
    manifest_bytes = files["blobs/sha256/" + entry["digest"][7:]]
    assert sha(manifest_bytes) == entry["digest"] == image.manifest_digest
    assert len(manifest_bytes) == entry["size"]
    manifest = json.loads(manifest_bytes)
    config_bytes = files["blobs/sha256/" + manifest["config"]["digest"][7:]]
    assert sha(config_bytes) == manifest["config"]["digest"] == image.config_digest
    assert len(config_bytes) == manifest["config"]["size"]
    config = json.loads(config_bytes)
    for desc, blob in zip(manifest["layers"], image.layers, strict=True):
        data = files["blobs/sha256/" + desc["digest"][7:]]
        assert desc["mediaType"] == oi.MEDIA_LAYER
        assert (sha(data), len(data)) == (desc["digest"], desc["size"]) == (blob.digest, blob.size)
    assert config["rootfs"] == {"type": "layers", "diff_ids": [b.digest for b in image.layers]}
    assert set(files) == {"oci-layout", "index.json", *(f"blobs/sha256/{d[7:]}" for d in (
        image.manifest_digest, image.config_digest, *(b.digest for b in image.layers)))}
    assert oi.verify(image.path) == image


def test_the_image_config(tmp_path: Path, trees: list[oi.Tree]) -> None:
    image = oi.build(tmp_path / "img.tar", trees, CONFIG)
    config = json.loads(members(image.path)["blobs/sha256/" + image.config_digest[7:]])
    assert config["architecture"] == "arm64" and config["os"] == "linux"
    assert config["config"] == {
        "Env": ["PATH=/opt/atlas/engines/e/bin:/usr/bin:/bin", "HF_HUB_OFFLINE=1"],
        "Entrypoint": ["/opt/atlas/engines/e/bin/python"], "Cmd": ["-c", "print(1)"],
        "WorkingDir": "/srv", "Labels": {"org.opencontainers.image.version": "1.0"},
    }
    assert [h["created_by"] for h in config["history"]] == ["atlaslab.oci_image: /",
                                                            "atlaslab.oci_image: /opt/atlas/engines/e"]
    assert oi.oci_arch("x86_64") == "amd64" and oi.oci_arch("aarch64") == "arm64"


def test_layer_contents(tmp_path: Path, trees: list[oi.Tree]) -> None:
    image = oi.build(tmp_path / "img.tar", trees, CONFIG)
    files = members(image.path)
    base = layer_entries(files["blobs/sha256/" + image.layers[0].digest[7:]])
    assert "dev" in base and "tmp" in base and "dev/leftover" not in base and "tmp/junk" not in base
    assert base["tmp"].mode == 0o1777
    tool = base["usr/bin/tool"]
    assert tool.isfile() and tool.mode == 0o755 and tool.mtime == MTIME
    assert (tool.uid, tool.gid) == (os.getuid(), os.getgid()) and tool.uname == tool.gname == ""
    assert base["usr/bin/tool-again"].islnk() and base["usr/bin/tool-again"].linkname == "usr/bin/tool"
    assert base["usr/bin/sh"].issym() and base["usr/bin/sh"].linkname == "tool"
    assert list(base) == sorted(base, key=lambda n: n.split("/"))  # depth first, names sorted
    venv = layer_entries(files["blobs/sha256/" + image.layers[1].digest[7:]])
    assert list(venv)[:4] == ["opt", "opt/atlas", "opt/atlas/engines", "opt/atlas/engines/e"]
    assert all(venv[d].isdir() and venv[d].mode == 0o755 for d in ("opt", "opt/atlas", "opt/atlas/engines"))
    assert venv["opt/atlas/engines/e/bin/python"].linkname == "/usr/bin/python3"
    assert "opt/atlas/engines/e/lib/site-packages/pkg/__init__.py" in venv


def test_verify_rejects_a_corrupt_archive(tmp_path: Path, trees: list[oi.Tree]) -> None:
    image = oi.build(tmp_path / "img.tar", trees, CONFIG)
    data = bytearray(image.path.read_bytes())
    needle = b"#!/bin/sh\necho tool\n"
    data[data.index(needle)] = ord("X")  # the layer's bytes no longer match its digest
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(oi.ImageError, match="does not match its digest"):
        oi.verify(bad)


def test_verify_rejects_a_missing_blob_and_a_wrong_size(tmp_path: Path) -> None:
    def archive(name: str, files: dict[str, bytes]) -> Path:
        path = tmp_path / name
        with tarfile.open(path, "w") as tar:
            for fname, data in files.items():
                info = tarfile.TarInfo(fname)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return path

    manifest = json.dumps({"schemaVersion": 2, "mediaType": oi.MEDIA_MANIFEST,
                           "config": {"mediaType": oi.MEDIA_CONFIG, "digest": sha(b"{}"), "size": 2},
                           "layers": []}).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": oi.MEDIA_MANIFEST, "digest": sha(manifest), "size": len(manifest)}]}).encode()
    base = {"oci-layout": oi.LAYOUT, "index.json": index}
    with pytest.raises(oi.ImageError, match="missing"):
        oi.verify(archive("a.tar", base))
    wrong = dict(base, **{"blobs/sha256/" + sha(manifest)[7:]: manifest, "blobs/sha256/" + sha(b"{}")[7:]: b"{ }"})
    with pytest.raises(oi.ImageError, match="size 3"):
        oi.verify(archive("b.tar", wrong))
    with pytest.raises(oi.ImageError, match="no oci-layout"):
        oi.verify(archive("c.tar", {"index.json": index}))


def test_a_tree_that_changes_during_the_build_is_an_error(tmp_path: Path, trees: list[oi.Tree],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    real = oi.layer_blob
    monkeypatch.setattr(oi, "layer_blob", lambda tree: oi.Blob(real(tree).digest, real(tree).size - 512))
    out = tmp_path / "img.tar"
    with pytest.raises(oi.ImageError, match="changed while the image was built"):
        oi.build(out, trees, CONFIG)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    with pytest.raises(oi.ImageError, match="at least one tree"):
        oi.build(out, [], CONFIG)
