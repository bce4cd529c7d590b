"""`atlasctl bundle push` end to end with real rsync, to a "node" that is a directory of this machine (an ssh
double runs the remote command here): the destination is never a system directory, --delete only where a
bundle is, the manifest sent is the verified bytes, and a bundle older than the node's record is refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from atlasctl import bundle, bundle_push, cli, exitcodes
from atlasctl import inventory as shared
from atlasctl.errors import UsageError
from support.ssh_double import SSH_DOUBLE

pytestmark = pytest.mark.skipif(not shutil.which("rsync"), reason="rsync is not installed")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> shared.Target:
    """A node reached through the ssh double; its bundle record under the test's directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(SSH_DOUBLE)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return shared.target("n1", {"ansible_host": "node-1", "atlas_bundle_record": str(tmp_path / "node/bundle.json")})


def _bundle(root: Path, built: str = "2026-12-01T10:00:00Z", *, files: bool = True) -> bundle.Manifest:
    if files:
        (root / "cann").mkdir(parents=True, exist_ok=True)
        (root / "cann" / "x.run").write_bytes(b"#!/bin/sh\necho installer\n")
        (root / "models" / "m").mkdir(parents=True, exist_ok=True)
        (root / "models" / "m" / "config.json").write_text("{}")
    bundle.write_manifest(root, "b", release="bank-1")
    data = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps(data | {"built": built}, indent=1, sort_keys=True) + "\n")
    return bundle.load(root)


@pytest.mark.parametrize("dest", ["/", "//", "/etc", "/etc/", "/usr/lib/x", "/var", "/var/lib", "/home", "/home/ops",
                                  "/root", "/opt", "/srv", "/tmp/../etc", "/srv/./..", "relative/dir"])
def test_a_system_directory_is_refused_before_anything_is_read(tmp_path, capsys, dest):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("atlas_nodes:\n  hosts:\n    n1:\n")
    argv = ["bundle", "push", "-i", str(inventory), "--src", str(tmp_path / "not-read"), "--dest", dest]
    assert cli.main(argv) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert f"--dest {dest}" in err and "Traceback" not in err and "fix: push to a directory of its own" in err


def test_the_suites_own_directories_on_the_node_are_refused(node, tmp_path):
    assert "holds the suite's own /var/lib/atlas/models" in bundle_push.dest_problem(
        "/var/lib/atlas", node.layout.suite_paths())
    assert "holds the suite's own /opt/atlas/engines" in bundle_push.dest_problem(
        "/opt/atlas/engines", node.layout.suite_paths())
    assert bundle_push.dest_problem("/srv/atlas-bundle", node.layout.suite_paths()) == ""


def test_push_sends_the_verified_bytes_and_deletes_only_where_a_bundle_is(node, tmp_path):
    manifest = _bundle(tmp_path / "src")
    dest = tmp_path / "node" / "srv" / "atlas-bundle"
    [first] = bundle_push.push(manifest, [node], str(dest))
    assert first.ok, first.message
    assert (dest / "manifest.json").read_bytes() == manifest.raw and (dest / "cann/x.run").is_file()
    # the bundle loses a file: the node's copy of it goes, as the bundle's manifest.json is there
    (tmp_path / "src" / "models" / "m" / "config.json").unlink()
    manifest = _bundle(tmp_path / "src", built="2026-12-02T10:00:00Z", files=False)
    (dest / ".atlas-verified.json").write_text("{}")  # the node's own stamp file stays
    [second] = bundle_push.push(manifest, [node], str(dest))
    assert second.ok, second.message
    assert not (dest / "models/m/config.json").exists() and (dest / ".atlas-verified.json").exists()
    assert (dest / "cann/x.run").is_file(), "the manifest's pass deletes nothing but a stale manifest or signature"
    assert (dest / "manifest.json").read_bytes() == manifest.raw


def test_a_destination_that_holds_something_else_is_never_deleted(node, tmp_path):
    manifest = _bundle(tmp_path / "src")
    dest = tmp_path / "node" / "data"
    dest.mkdir(parents=True)
    (dest / "ledger.db").write_text("the bank's")
    [result] = bundle_push.push(manifest, [node], str(dest))
    assert not result.ok and "holds ledger.db and no bundle's manifest.json" in result.message
    assert sorted(p.name for p in dest.iterdir()) == ["ledger.db"]
    # a first push that was cut short (only the bundle's own names there) goes on, deleting nothing
    cut = tmp_path / "node" / "cut"
    (cut / "cann").mkdir(parents=True)
    (cut / "cann" / "partial.tmp").write_text("x")
    [resumed] = bundle_push.push(manifest, [node], str(cut))
    assert resumed.ok and (cut / "cann/partial.tmp").exists() and (cut / "manifest.json").is_file()
    # a destination that is a link to a system directory is judged by where it leads
    (tmp_path / "node" / "sneaky").symlink_to("/etc")
    [linked] = bundle_push.push(manifest, [node], str(tmp_path / "node" / "sneaky"))
    assert not linked.ok and "(/etc on the node): /etc is a system directory" in linked.message


def test_push_refuses_a_bundle_older_than_the_nodes_record_naming_the_node(node, tmp_path, capsys):
    record = Path(node.layout.bundle_record)
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"format": 1, "name": "b", "release": "bank-2", "built": "2026-12-05T00:00:00Z",
                                  "manifest_sha256": "ab" * 32}))
    manifest = _bundle(tmp_path / "src")  # built 2026-12-01
    dest = tmp_path / "node" / "bundle"
    [refused] = bundle_push.push(manifest, [node], str(dest))
    assert not refused.ok and refused.host == "n1" and not dest.exists()
    assert "n1: bundle b (release bank-1 built 2026-12-01T10:00:00Z) is OLDER" in refused.message
    assert "--allow-downgrade" in refused.message
    [allowed] = bundle_push.push(manifest, [node], str(dest), allow_downgrade=True)
    assert allowed.ok and (dest / "manifest.json").read_bytes() == manifest.raw
    assert "DOWNGRADE ALLOWED" in capsys.readouterr().err
    [unsigned] = bundle_push.push(manifest, [node], str(dest), judge_release=False)
    assert unsigned.ok  # an unsigned bundle's build time vouches for nothing: not judged


def test_normalize_dest_and_a_relative_one():
    assert bundle_push.check_dest("//srv/./atlas-bundle/") == "/srv/atlas-bundle"
    with pytest.raises(UsageError, match="not an absolute path"):
        bundle_push.check_dest("srv/atlas-bundle")


def test_rollout_allow_downgrade_passes_atlas_allow_downgrade(monkeypatch):
    from atlasctl import rollout

    seen = {}

    def fake_run(inventory, release, *, extravars=None, **kwargs):
        seen.update(extravars or {})
        return {"status": "ok", "release": release, "inventory": str(inventory), "seconds": 0, "completed": [],
                "report": "r.json"}

    monkeypatch.setattr(rollout, "run", fake_run)
    assert cli.main(["rollout", "-i", "inventory/lab", "--release", "r1", "--allow-downgrade"]) == exitcodes.OK
    assert seen.get("atlas_allow_downgrade") is True
