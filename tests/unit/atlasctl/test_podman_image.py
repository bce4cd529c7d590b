"""module_utils/podman.py (module atlas.serving.podman_image): the image loaded only when Podman's store lacks its
id, the loaded id checked against the manifest's, named so a prune keeps it, its record written; idempotent; check
mode loads nothing; every refusal names both ids. Podman here is a fake store driven by the commands it is given."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import podman

from atlasctl import bundle
from support.image_archives import oci_archive

PODMAN = "/usr/bin/podman"


class FakePodman:
    """A store of image ids and their names; `load` adds what ``loads`` says the archive holds."""

    def __init__(self, loads: str):
        self.images: dict[str, list[str]] = {}
        self.loads = loads
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(argv)
        cmd = argv[1:]
        if cmd[:2] == ["image", "exists"]:
            return (0 if cmd[2] in self.images else 1), "", ""
        if cmd[:2] == ["image", "inspect"]:
            ref = cmd[-1].removeprefix("sha256:")
            found = ref if ref in self.images else next((i for i, n in self.images.items() if ref in n), None)
            if found is None:
                return 125, "", f"Error: {ref}: image not known"
            return 0, (json.dumps(self.images[found]) if ".RepoTags" in cmd[3] else found) + "\n", ""
        if cmd[0] == "load":
            self.images.setdefault(self.loads, [])
            return 0, f"Loaded image: sha256:{self.loads}\n", ""
        if cmd[0] == "tag":
            self.images[cmd[1]].append(cmd[2])
            return 0, "", ""
        raise AssertionError(argv)


@pytest.fixture
def node(tmp_path: Path, monkeypatch) -> dict:
    root = tmp_path / "bundle"
    archive, image_id = oci_archive(tmp_path / "img.tar", "p")
    (root / "images").mkdir(parents=True)
    (root / "images/img.tar").write_bytes(archive.read_bytes())
    bundle.write_manifest(root, "t", fields={"images/img.tar": {"variant": "910b", "cann": "8.5.0",
                                                                "engine_release": "sglang-0.5.6"}})
    sha = hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    monkeypatch.setattr(podman.os, "access", lambda path, mode: path == PODMAN or os.access(path, mode))
    return {"root": root, "id": image_id, "sha": sha, "record": tmp_path / "engines/images/img.json"}


def _ensure(node, fake, **kw):
    return podman.ensure_image(fake, PODMAN, str(node["root"]), str(node["root"] / "manifest.json"), node["sha"],
                               "img", str(node["record"]), **kw)


def test_load_once_pin_name_record_then_nothing(node):
    fake = FakePodman(node["id"])
    first = _ensure(node, fake)
    assert first["changed"] and first["loaded"] and first["named"] and first["record_written"]
    assert [PODMAN, "load", "-i", str(node["root"] / "images/img.tar")] in fake.calls
    assert fake.images[node["id"]] == [f"localhost/atlas-serving/img:{node['id'][:12]}"]
    record = json.loads(node["record"].read_text())
    assert record["image_id"] == node["id"] and record["variant"] == "910b"
    assert record["engine_release"] == "sglang-0.5.6"
    assert first["image"]["path"] == "images/img.tar"
    fake.calls.clear()
    second = _ensure(node, fake)
    assert not second["changed"] and not second["loaded"]
    assert not any(c[1] in ("load", "tag") for c in fake.calls), "converged: read only"


def test_check_mode_reports_the_load_and_changes_nothing(node):
    fake = FakePodman(node["id"])
    result = _ensure(node, fake, check_mode=True)
    assert result["changed"] and result["loaded"] and result["msg"].startswith("would load image img")
    assert fake.images == {} and not node["record"].exists()
    assert [c[1] for c in fake.calls] == ["image"]  # podman image exists only


def test_an_image_in_the_store_without_its_name_is_named_not_loaded(node):
    fake = FakePodman(node["id"])
    fake.images[node["id"]] = ["quay.io/ascend/vllm-ascend:v0.11.0"]
    result = _ensure(node, fake)
    assert result["named"] and not result["loaded"]
    assert not any(c[1] == "load" for c in fake.calls)


def test_a_load_that_gives_another_id_fails_naming_both(node):
    other = "cd" * 32
    with pytest.raises(podman.PodmanError, match=f"podman loaded {other} .*not image {node['id']}"):
        _ensure(node, FakePodman(other))
    assert not node["record"].exists()


def test_an_archive_that_is_not_the_manifest_s_image_is_not_loaded(node):
    oci_archive(node["root"] / "images/img.tar", "swapped")  # same name, another image, manifest unchanged
    fake = FakePodman(node["id"])
    with pytest.raises(podman.PodmanError, match=f"holds image [0-9a-f]{{64}}, but the bundle manifest says image img "
                                                 f"is {node['id']}"):
        _ensure(node, fake)
    assert not any(c[1] == "load" for c in fake.calls)


def test_a_manifest_that_is_not_the_verified_one_is_refused(node):
    with pytest.raises(podman.PodmanError, match="sha256"):
        podman.ensure_image(FakePodman(node["id"]), PODMAN, str(node["root"]), str(node["root"] / "manifest.json"),
                            "0" * 64, "img", str(node["record"]))


def test_an_unknown_name_lists_the_bundle_s_images(node):
    with pytest.raises(podman.PodmanError, match="lists no image 'other' .*the bundle's images: img"):
        podman.ensure_image(FakePodman(node["id"]), PODMAN, str(node["root"]), str(node["root"] / "manifest.json"),
                            node["sha"], "other", str(node["record"]))


def test_without_podman(node, monkeypatch):
    monkeypatch.setattr(podman.os, "access", lambda path, mode: False)
    with pytest.raises(podman.PodmanError, match="/usr/bin/podman is not installed"):
        _ensure(node, FakePodman(node["id"]))
    result = _ensure(node, FakePodman(node["id"]), check_mode=True)
    assert result["changed"] and "once podman is installed" in result["msg"]
