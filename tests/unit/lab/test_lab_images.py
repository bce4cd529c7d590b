"""The lab's engine images (atlaslab.images): the base root filesystem and a wheelset's venv as two layers of
an OCI archive, cached by a key of everything that goes in. The install step (a chroot and pip, on the lab) is
injected here: what is tested is what the builder makes of the trees and when it builds again."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from atlaslab import images, oci_image


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "base"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").write_text("#!/bin/sh\n")
    (root / "tmp").mkdir()
    (root / "tmp/junk").write_text("not in the image")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "requirements.lock").write_text("engine==1.0\n")
    (wheels / "engine-1.0-py3-none-any.whl").write_bytes(b"wheel")
    image = images.EngineImage("engine-1.0", wheels, "/opt/atlas/engines/engine-1.0", {"atlas.variant": "910b"})
    calls: list[Path] = []

    def install(build_root: Path, img: images.EngineImage) -> None:
        calls.append(build_root)
        venv = build_root / img.venv.lstrip("/")
        (venv / "bin").mkdir(parents=True)
        (venv / "bin/engine").write_text("#!/bin/sh\necho engine\n")

    return image, root, calls, install


def _names(archive: Path, layer: oci_image.Blob) -> set[str]:
    with tarfile.open(archive) as outer:
        blob = outer.extractfile(f"blobs/sha256/{layer.digest.split(':')[1]}")
        with tarfile.open(fileobj=blob) as inner:
            return {m.name for m in inner.getmembers()}


def test_two_layers_the_base_and_the_venv_at_its_path(setup) -> None:
    image, root, calls, install = setup
    built = images.build(image, install=install, base_root=root, base_hash="b1")
    assert len(built.layers) == 2 and calls
    base_names, venv_names = _names(built.path, built.layers[0]), _names(built.path, built.layers[1])
    assert "usr/bin/python3" in base_names and "tmp/junk" not in base_names, "tmp is kept empty"
    assert "opt/atlas/engines/engine-1.0/bin/engine" in venv_names
    assert not any(n.startswith("usr/") for n in venv_names), "the venv layer holds the venv only"
    assert built.path.parent == images.images_dir() and not list(images.images_dir().glob(".build-*"))


def test_nothing_changed_nothing_built_again_and_a_changed_lock_builds_anew(setup) -> None:
    image, root, calls, install = setup
    first = images.build(image, install=install, base_root=root, base_hash="b1")
    again = images.build(image, install=install, base_root=root, base_hash="b1")
    assert len(calls) == 1 and again.manifest_digest == first.manifest_digest
    (image.wheelset / "requirements.lock").write_text("engine==1.1\n")
    changed = images.build(image, install=install, base_root=root, base_hash="b1")
    assert len(calls) == 2 and changed.path != first.path
    assert not first.path.exists(), "the older archive of the same image is removed"
    other_base = images.build(image, install=install, base_root=root, base_hash="b2")
    assert len(calls) == 3 and other_base.path != changed.path


def test_a_failed_install_leaves_no_archive_and_no_build_tree(setup) -> None:
    image, root, _, _ = setup

    def broken(build_root: Path, img: images.EngineImage) -> None:
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError, match="pip failed"):
        images.build(image, install=broken, base_root=root, base_hash="b1")
    assert list(images.images_dir().iterdir()) == []


def test_the_lab_bundle_step_puts_the_built_image_in_the_bundle_with_its_fields(setup, tmp_path, monkeypatch) -> None:
    """`lab_images:` of the lab's bundle spec: the image built from the bundle's own wheelset, copied to
    images/<name>.tar by the product's image step and listed in the manifest as an image with its id."""
    from atlasctl import bundle
    from atlaslab import bundle_doubles

    image, root, _calls, install = setup
    out = tmp_path / "bundle"
    (out / "wheels").mkdir(parents=True)
    (out / "wheels" / "engine-1.0").symlink_to(image.wheelset)
    real_build = images.build
    built_for: list[images.EngineImage] = []
    built: list[oci_image.BuiltImage] = []

    def build(img: images.EngineImage):
        built_for.append(img)
        built.append(real_build(img, install=install, base_root=root, base_hash="base"))
        return built[-1]

    monkeypatch.setattr(images, "build", build)
    entry = {"name": "engine-1.0", "wheelset": "engine-1.0", "variant": "910b", "cann": "8.5.0",
             "engine_release": "engine-1.0"}
    step = bundle_doubles._lab_image_step(entry)
    step.run(out)
    assert built_for[0].wheelset == out / "wheels" / "engine-1.0"
    assert built_for[0].venv == "/opt/atlas/engines/engine-1.0"
    assert step.owns == ("images/engine-1.0.tar",)
    archive = out / "images" / "engine-1.0.tar"
    assert archive.read_bytes() == built[0].path.read_bytes()
    (out / "wheels" / "engine-1.0").unlink()
    manifest = bundle.write_manifest(out, "t", sources=[("images/*", "lab-double")], fields=step.fields)
    record = {f["path"]: f for f in manifest["files"]}["images/engine-1.0.tar"]
    assert (record["kind"], record["variant"], record["cann"], record["engine_release"], record["source"]) == (
        "image", "910b", "8.5.0", "engine-1.0", "lab-double"), record
    assert record["image_id"] == oci_image.verify(archive).config_digest.split(":")[1], record
