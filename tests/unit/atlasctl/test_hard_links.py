"""Hard links and links out of a tree: a bundle (and a model it copies) holds its own files, so a hard link
to a file with a name outside it is refused as a symlink is; `models verify` refuses both before it reads; the
model_verify module, which follows links, checks a file outside its root but never prints what that file holds."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import checksums, manifest, tree_check

from atlasctl import bundle, cli, exitcodes
from atlasctl.errors import UsageError


def _bundle(root: Path) -> Path:
    (root / "cann").mkdir(parents=True)
    (root / "cann" / "x.run").write_bytes(b"#!/bin/sh\necho installer\n")
    bundle.write_manifest(root, "t")
    return root


def test_a_hard_link_out_of_a_bundle_is_refused_like_a_symlink(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:$6$not-for-the-bundle\n")
    root = _bundle(tmp_path / "b")
    os.link(secret, root / "cann" / "shadow")  # an attacker with write access to the share
    assert {b.path: b.problem for b in bundle.verify_bundle(root)} == {"cann/shadow": "hardlink"}
    with pytest.raises(UsageError, match=r"a hard link to a file outside it .*cann/shadow"):
        bundle.write_manifest(root, "t")
    # listed in the manifest too: refused, never read
    (root / "cann" / "shadow").unlink()
    (root / "cann" / "shadow").write_bytes(b"decoy")
    bundle.write_manifest(root, "t")
    (root / "cann" / "shadow").unlink()
    os.link(secret, root / "cann" / "shadow")
    [bad] = bundle.verify_bundle(root)
    assert (bad.path, bad.problem, bad.actual) == ("cann/shadow", "hardlink", "")
    assert "hard link to a file outside the tree" in bad.describe()


def test_hard_links_inside_the_tree_and_from_a_linked_from_root_are_its_own(tmp_path):
    """Two names of one file inside the tree are the tree's; a verified file hard-linked from the node's
    bundle (the same relative path under a ``linked_from`` root, the same inode) counts as inside, so a later
    change can keep one copy per node."""
    root = _bundle(tmp_path / "b")
    os.link(root / "cann" / "x.run", root / "cann" / "y.run")
    bundle.write_manifest(root, "t")
    assert bundle.verify_bundle(root) == []
    source = tmp_path / "bundle-copy"
    (source / "cann").mkdir(parents=True)
    target = tmp_path / "models-root"
    (target / "cann").mkdir(parents=True)
    (source / "cann" / "x.run").write_bytes(b"weights")
    os.link(source / "cann" / "x.run", target / "cann" / "x.run")
    expected = {"cann/x.run": manifest.Expected("cann/x.run", 7,
                                                                sha256=hashlib.sha256(b"weights").hexdigest())}
    refused = checksums.verify_tree(str(target), expected, links="refuse")
    assert [r.problem for r in refused.bad] == ["hardlink"]
    accepted = checksums.verify_tree(str(target), expected, links="refuse", linked_from=[str(source)])
    assert accepted.bad == []
    os.link(source / "cann" / "x.run", tmp_path / "third-name")  # a name neither tree holds
    again = checksums.verify_tree(str(target), expected, links="refuse", linked_from=[str(source)])
    assert [r.problem for r in again.bad] == ["hardlink"]


def test_build_refuses_a_model_source_with_a_hard_link_out_of_it(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not the model's")
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    os.link(secret, src / "tokenizer.json")
    spec = tmp_path / "b.yml"
    spec.write_text(f"name: t\nmodels:\n  - {{name: m, path: {src}}}\n")
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=r"model m: .*a hard link to a file outside it .*tokenizer.json"):
        bundle.build_bundle(bundle.BundleSpec.load(spec), out, tmp_path / "cache")
    assert not out.exists()


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_models_verify_never_prints_the_digest_of_a_file_outside_its_root(tmp_path, capsys, how):
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:$6$hash-of-the-root-password\n")
    digests = {hashlib.sha256(secret.read_bytes()).hexdigest(), hashlib.md5(secret.read_bytes()).hexdigest()}  # noqa: S324
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    if how == "symlink":
        (model / "weights.bin").symlink_to(secret)
    else:
        os.link(secret, model / "weights.bin")
    sums = tmp_path / "sha256sums.txt"
    sums.write_text(f"{'0' * 64}  weights.bin\n{hashlib.sha256(b'{}').hexdigest()}  config.json\n")
    for extra in ([], ["--json"]):  # the CLI refuses the tree before reading it (module_utils/paths.py)
        code = cli.main(["models", "verify", str(model), "--manifest", str(sums), "--no-stamps", *extra])
        out = capsys.readouterr()
        assert code == exitcodes.USAGE
        said = out.out + out.err
        assert not any(d in said for d in digests), said
        assert "weights.bin" in said and ("symbolic link" if how == "symlink" else "hard link") in said
    # the node's module (links followed): checked, never shown (tree_check is what model_verify runs)
    report, _stamp = tree_check.check_tree(str(model), checksum_files=[str(sums)], stamps=False)
    assert not any(d in json.dumps(report.as_dict()) for d in digests)


def test_a_bundle_whose_model_is_staged_by_hard_links_is_still_its_own(tmp_path):
    """One copy per node: the models stage hard-links models/<name>/ of the bundle into
    <models_root>/<name>/versions/<v>/; the bundle's check (links=refuse, what `bundle push` runs on the node) takes
    those names as its own with linked_models_root, and still refuses a third name elsewhere."""
    root = tmp_path / "bundle"
    (root / "models" / "m").mkdir(parents=True)
    (root / "models" / "m" / "w.bin").write_bytes(b"weights")
    bundle.write_manifest(root, "t")
    version = tmp_path / "models" / "m" / "versions" / "0123456789abcdef"
    version.mkdir(parents=True)
    os.link(root / "models" / "m" / "w.bin", version / "w.bin")
    expected = manifest.load_manifest(str(root / "manifest.json"))
    refused = checksums.verify_tree(str(root), expected, links="refuse", ignore={"manifest.json"})
    assert [(r.path, r.problem) for r in refused.bad] == [("models/m/w.bin", "hardlink")]
    trees = checksums.linked_trees(str(tmp_path / "models"))
    assert trees == [(str(version), "models/m/")]
    assert checksums.verify_tree(str(root), expected, links="refuse", ignore={"manifest.json"},
                                 linked_from=trees).bad == []
    os.link(version / "w.bin", tmp_path / "elsewhere")
    again = checksums.verify_tree(str(root), expected, links="refuse", ignore={"manifest.json"}, linked_from=trees)
    assert [r.problem for r in again.bad] == ["hardlink"]
    assert checksums.linked_trees(str(tmp_path / "none")) == []
