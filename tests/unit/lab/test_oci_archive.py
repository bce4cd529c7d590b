"""module_utils/oci_archive.py: the image id (the config's sha256) read from both archive formats podman load
takes, and every way an archive is refused (several images, a damaged or missing config, compressed, not a tar)."""

from __future__ import annotations

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import manifest
from ansible_collections.atlas.serving.plugins.module_utils import oci_archive as archive

from support.image_archives import docker_archive, oci_archive


@pytest.mark.parametrize("build", [
    lambda p: oci_archive(p / "oci.tar"),
    lambda p: oci_archive(p / "nested.tar", nested=True),
    lambda p: docker_archive(p / "docker.tar"),
    lambda p: docker_archive(p / "docker25.tar", blobs_layout=True),
], ids=["oci", "oci-nested-index", "docker-save", "docker-save-blobs"])
def test_the_id_is_the_config_digest_in_every_format(tmp_path, build):
    path, expected = build(tmp_path)
    assert archive.image_id(str(path)) == expected
    assert manifest.is_image_id(expected)


def test_the_lab_builder_s_archive_reads_as_its_config_digest(tmp_path):
    oci_image = pytest.importorskip("atlaslab.oci_image")
    (tmp_path / "root/bin").mkdir(parents=True)
    (tmp_path / "root/bin/engine").write_text("#!/bin/sh\n")
    built = oci_image.build(tmp_path / "lab.tar", [oci_image.Tree(tmp_path / "root")],
                            oci_image.ImageConfig(cmd=("/bin/engine",)), ref_name="atlas/test:1")
    assert archive.image_id(str(built.path)) == built.config_digest.split(":", 1)[1]


@pytest.mark.parametrize("build, says", [
    (lambda p: oci_archive(p / "x.tar", images=2), "lists 2 manifests; an archive in the bundle holds exactly one"),
    (lambda p: docker_archive(p / "x.tar", images=2), "manifest.json lists 2 images"),
    (lambda p: oci_archive(p / "x.tar", tamper="config"), "the archive is damaged"),
    (lambda p: docker_archive(p / "x.tar", tamper=True), "the archive is damaged"),
    (lambda p: oci_archive(p / "x.tar", tamper="no-config"), "is not in the archive"),
    (lambda p: oci_archive(p / "x.tar", gzip=True), "not an uncompressed tar archive"),
])
def test_an_archive_that_is_not_one_sound_image_is_refused(tmp_path, build, says):
    path, _ = build(tmp_path)
    with pytest.raises(archive.ImageArchiveError, match=says):
        archive.image_id(str(path))


def test_not_a_tar_and_missing_and_empty_tar(tmp_path):
    (tmp_path / "text.tar").write_text("not a tar at all\n" * 100)
    with pytest.raises(archive.ImageArchiveError, match="not an uncompressed tar"):
        archive.image_id(str(tmp_path / "text.tar"))
    with pytest.raises(archive.ImageArchiveError, match="no such file"):
        archive.image_id(str(tmp_path / "absent.tar"))
    import tarfile

    with tarfile.open(tmp_path / "empty.tar", "w"):
        pass
    with pytest.raises(archive.ImageArchiveError, match="neither an OCI image layout"):
        archive.image_id(str(tmp_path / "empty.tar"))
