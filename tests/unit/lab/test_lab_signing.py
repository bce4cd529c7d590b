"""The lab's bundle signing key: made once per machine in the cache dir, signs the lab's bundle,
pinned in the generated inventory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from atlasctl import bundle, cli, exitcodes
from atlaslab import cli as lab_cli
from atlaslab import config, inventory, signing

pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")


@pytest.fixture()
def lab_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ATLAS_LAB_DIR", str(tmp_path / "lab"))
    yield tmp_path
    signing._stop_agent()


def test_key_made_once_and_exported(lab_env: Path) -> None:
    first = signing.ensure_key()
    assert len(first) == 40 and signing.keyring().is_file()
    assert signing.ensure_key() == first  # once per machine
    assert signing.homedir().stat().st_mode & 0o077 == 0
    assert signing.trust_vars() == {"atlas_bundle_trusted_fingerprints": [first],
                                    "atlas_bundle_keyring": str(lab_env / "cache/lab-signing/trusted.gpg")}


def test_building_the_labs_bundle_signs_it_and_verify_trusts_the_lab_key(lab_env: Path, capsys) -> None:
    model = lab_env / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = lab_env / "bundle.yml"
    spec.write_text(f"name: lab\nmodels:\n  - {{name: m, path: {model}}}\n")
    assert lab_cli.main(["bundle", "--spec", str(spec)]) == exitcodes.OK  # the lab's bundle directory
    root = lab_env / "lab" / "bundle"
    assert (root / bundle.SIGNATURE).is_file()
    trust = signing.trust_vars()
    verdict = bundle.verify_signature(root, keyring=trust["atlas_bundle_keyring"],
                                      fingerprints=trust["atlas_bundle_trusted_fingerprints"])
    assert verdict.signed and verdict.primary_fingerprint == signing.ensure_key()
    argv = ["bundle", "verify", str(root), "--keyring", trust["atlas_bundle_keyring"],
            "--fingerprint", signing.ensure_key()]
    assert cli.main(argv) == exitcodes.OK  # the lab's bundle against the lab's key
    assert "signed by" in capsys.readouterr().out


def test_a_scratch_bundle_is_dated_as_the_labs_bundle(lab_env: Path) -> None:
    """Nodes refuse a bundle built before the one they accepted last: a lab test's scratch bundle signed with
    the lab key carries the lab bundle's build time, so a node that ran it still takes the lab's bundle."""
    model = lab_env / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec = lab_env / "bundle.yml"
    spec.write_text(f"name: lab\nmodels:\n  - {{name: m, path: {model}}}\n")
    assert lab_cli.main(["bundle", "--spec", str(spec)]) == exitcodes.OK
    lab_built = bundle.read_manifest(lab_env / "lab" / "bundle")["built"]
    scratch = lab_env / "scratch"
    (scratch / "cann").mkdir(parents=True)
    (scratch / "cann" / "x.run").write_text("#!/bin/sh\n")
    data = bundle.write_manifest(scratch, "drill")
    data_built = "2099-01-01T00:00:00Z"
    (scratch / "manifest.json").write_text((scratch / "manifest.json").read_text().replace(data["built"], data_built))
    signing.sign_bundle(scratch)
    assert bundle.read_manifest(scratch)["built"] == lab_built
    trust = signing.trust_vars()
    assert bundle.verify_signature(scratch, keyring=trust["atlas_bundle_keyring"],
                                   fingerprints=trust["atlas_bundle_trusted_fingerprints"]).signed


def test_generated_inventory_pins_the_lab_key_for_all(tmp_path: Path) -> None:
    cfg = config.parse({"lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
                        "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
                        "nodes": [{"name": "n1", "npu": {"model": "910B3", "count": 8, "hbm_mb": 65536}}]},
                       tmp_path / "lab.yml")
    trust = {"atlas_bundle_trusted_fingerprints": ["AB" * 20], "atlas_bundle_keyring": "/c/trusted.gpg"}
    data = yaml.safe_load(inventory.render(cfg, Path("/k"), Path("/kh"), trust))
    assert data["all"]["vars"] == trust and "n1" in data["all"]["children"]["atlas_nodes"]["hosts"]


def test_evidence_key_signs_packs(lab_env: Path, tmp_path: Path) -> None:
    """A second key, in its own home, named in the generated inventory's vars beside the bundle's; a pack it
    signs verifies against its exported keyring, and not against the bundle key."""
    from ansible_collections.atlas.serving.plugins.module_utils import evidence as mu

    from atlasctl import evidence

    bundle_key, evidence_key = signing.ensure_key(), signing.ensure_key(signing.EVIDENCE)
    try:
        assert len(evidence_key) == 40 and evidence_key != bundle_key
        assert signing.homedir(signing.EVIDENCE) != signing.homedir()
        assert signing.ensure_key(signing.EVIDENCE) == evidence_key  # once per machine
        group_vars = signing.inventory_vars()
        assert group_vars == {**signing.trust_vars(), "atlas_evidence_signing_key": evidence_key,
                              "atlas_evidence_gnupg_home": str(signing.homedir(signing.EVIDENCE))}
        pack = tmp_path / "r.evidence"
        record = mu.build_record({"release": "r", "nodes": []}, signing_key=evidence_key,
                                 gnupg_home=group_vars["atlas_evidence_gnupg_home"])
        written = mu.write_pack(str(pack), record, signing_key=evidence_key,
                                gnupg_home=group_vars["atlas_evidence_gnupg_home"])
        assert written["signed"], written
        assert evidence.verify(pack, keyring=signing.keyring(signing.EVIDENCE), fingerprint=evidence_key).ok
        refused = evidence.verify(pack, keyring=signing.keyring(), fingerprint=bundle_key)
        assert [name for name, _ in refused.problems] == ["SHA256SUMS.asc"]
    finally:
        signing._stop_agent(signing.EVIDENCE)
