"""roles/bundle_trust against localhost: the controller-side verification (module
atlas.serving.bundle_signature) sets atlas_bundle_manifest_sha256; a manifest swapped after it is
refused by the node-side check the stage roles run; unsigned is refused unless opted in, loudly."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl import bundle
from atlasctl.bundle_sources import sign_manifest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")

PLAYBOOK = """
- name: Bundle trust role test
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Verify (what preflight and the stage playbooks run)
      ansible.builtin.include_role:
        name: bundle_trust
    - name: Someone rewrites the manifest on the share after verification
      ansible.builtin.copy:
        content: '{"format": 1, "name": "evil", "files": []}'
        dest: "{{ atlas_bundle_dir }}/manifest.json"
        mode: "0644"
      when: swap | default(false) | bool
    - name: A stage reads the manifest
      ansible.builtin.slurp:
        src: "{{ atlas_bundle_dir }}/manifest.json"
      register: read
    - name: What the cann, driver and models roles run before using what they read
      ansible.builtin.include_role:
        name: bundle_trust
        tasks_from: node
      vars:
        bundle_trust_manifest: "{{ atlas_bundle_dir }}/manifest.json"
        bundle_trust_content: "{{ read.content }}"
"""


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("signer")
    home = tmp / "gnupg"
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--passphrase", ""]
    subprocess.run([*gpg, "--quick-gen-key", "role@test", "ed25519", "sign", "never"], check=True,
                   capture_output=True)
    listing = subprocess.run([*gpg, "--with-colons", "--list-keys"], check=True, capture_output=True, text=True)
    fpr = next(line.split(":")[9] for line in listing.stdout.splitlines() if line.startswith("fpr:"))
    keyring = tmp / "trusted.gpg"
    keyring.write_bytes(subprocess.run([*gpg, "--export", fpr], check=True, capture_output=True).stdout)
    yield home, fpr, keyring
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False, capture_output=True)


def play(tmp: Path, extra: dict, *args: str) -> tuple[int, str]:
    (tmp / "play.yml").write_text(PLAYBOOK)
    (tmp / "inventory.ini").write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
           "ANSIBLE_STDOUT_CALLBACK": "default"}
    extra = {"atlas_bundle_record": str(tmp / "node" / "bundle.json"), **extra}  # never the machine's own
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "inventory.ini"), str(tmp / "play.yml"),
                           "-e", json.dumps(extra), *args], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def _bundle(root: Path) -> Path:
    (root / "cann").mkdir(parents=True)
    (root / "cann" / "x.run").write_text("#!/bin/sh\n")
    bundle.write_manifest(root, "t")
    return root


def test_verified_then_swapped_manifest_is_refused_on_the_node(signer, tmp_path: Path) -> None:
    home, fpr, keyring = signer
    root = _bundle(tmp_path / "bundle")
    sign_manifest(root, fpr, home)
    trust = {"atlas_bundle_dir": str(root), "atlas_bundle_keyring": str(keyring),
             "atlas_bundle_trusted_fingerprints": [fpr]}
    rc, out = play(tmp_path, trust)
    assert rc == 0 and f"signed by {fpr}" in out, out[-3000:]
    rc, out = play(tmp_path, trust | {"swap": True})
    assert rc != 0 and "is not the manifest whose signature was verified" in out, out[-3000:]


def test_unsigned_is_refused_unless_opted_in_loudly_in_check_mode_too(signer, tmp_path: Path) -> None:
    _home, fpr, keyring = signer
    root = _bundle(tmp_path / "bundle")
    trust = {"atlas_bundle_dir": str(root), "atlas_bundle_keyring": str(keyring),
             "atlas_bundle_trusted_fingerprints": [fpr]}
    rc, out = play(tmp_path, trust, "--check")
    assert rc != 0 and "manifest.json.asc is missing" in out and "NOT signed" in out, out[-3000:]
    rc, out = play(tmp_path, trust | {"bundle_allow_unsigned": True}, "--check")
    assert rc == 0 and "!!! UNSIGNED BUNDLE" in out and "changed=0" in out, out[-3000:]


def test_lab_doubles_are_refused_unless_the_inventory_is_the_lab(signer, tmp_path: Path) -> None:
    home, fpr, keyring = signer
    root = tmp_path / "bundle"
    (root / "cann").mkdir(parents=True)
    (root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_text("#!/bin/sh\n")
    bundle.write_manifest(root, "t", sources=[("cann/*_8.5.0_*", "lab-double")])
    sign_manifest(root, fpr, home)
    trust = {"atlas_bundle_dir": str(root), "atlas_bundle_keyring": str(keyring),
             "atlas_bundle_trusted_fingerprints": [fpr]}
    rc, out = play(tmp_path, trust)
    assert rc != 0 and "lists 1 lab double(s)" in out and "Ascend-cann-toolkit_8.5.0_linux-x86_64.run" in out, \
        out[-3000:]
    rc, out = play(tmp_path, trust | {"atlas_lab": True})
    assert rc == 0 and f"signed by {fpr}" in out, out[-3000:]


def _built(root: Path, release: str, built: str | None, signer) -> None:
    """The bundle's manifest with this release and build time (None: as an older atlasctl wrote it), signed."""
    home, fpr, _keyring = signer
    data = json.loads((root / "manifest.json").read_text())
    data.pop("release", None)
    data.pop("built", None)
    if built is not None:
        data |= {"release": release, "built": built}
    (root / "manifest.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    sign_manifest(root, fpr, home)


def test_an_older_bundle_is_refused_unless_the_downgrade_is_on_purpose(signer, tmp_path: Path) -> None:
    home, fpr, keyring = signer
    root = _bundle(tmp_path / "bundle")
    record = tmp_path / "node" / "bundle.json"
    trust = {"atlas_bundle_dir": str(root), "atlas_bundle_keyring": str(keyring),
             "atlas_bundle_trusted_fingerprints": [fpr]}
    _built(root, "bank-2026.12.0", "2026-12-01T10:00:00Z", signer)
    rc, out = play(tmp_path, trust, "--check")  # check mode: judged, nothing written
    assert rc == 0 and not record.exists(), out[-3000:]
    rc, out = play(tmp_path, trust)
    assert rc == 0 and "changed=1" in out, out[-3000:]
    written = json.loads(record.read_text())
    assert (written["release"], written["built"]) == ("bank-2026.12.0", "2026-12-01T10:00:00Z")
    assert written["manifest_sha256"] == hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    rc, out = play(tmp_path, trust)
    assert rc == 0 and "changed=0" in out, out[-3000:]  # the same bundle again: nothing changes
    _built(root, "bank-2026.11.0", "2026-11-01T10:00:00Z", signer)  # an old signed bundle put back
    rc, out = play(tmp_path, trust)
    assert rc != 0 and "is OLDER than the bundle this node last accepted" in out, out[-3000:]
    assert "release bank-2026.11.0 built 2026-11-01T10:00:00Z" in out and "bank-2026.12.0" in out
    assert "atlas_allow_downgrade=true" in out and json.loads(record.read_text()) == written
    rc, out = play(tmp_path, trust | {"atlas_allow_downgrade": True})
    assert rc == 0 and "DOWNGRADE ALLOWED" in out, out[-3000:]
    assert json.loads(record.read_text())["release"] == "bank-2026.11.0"


def test_the_record_filter_judges_as_the_module_utils_do() -> None:
    """The role's filter over slurp results: a missing record is none yet, an unreadable one is named, a manifest
    an older atlasctl built (no release, no build time) cannot be ordered against a record."""
    import base64

    from ansible_collections.atlas.serving.plugins.filter.bundle import bundle_record_check

    def b64(data: object) -> str:
        return base64.b64encode(json.dumps(data).encode()).decode()

    new = {"format": 1, "name": "b", "files": [], "release": "r2", "built": "2026-02-01T00:00:00Z"}
    old = {"format": 1, "name": "b", "files": []}
    missing = {"failed": True, "msg": "file not found: /var/lib/atlas/bundle.json"}
    first = bundle_record_check(b64(new), "ab" * 32, missing, False, "n1")
    assert first["problem"] == "" and first["record"]["built"] == "2026-02-01T00:00:00Z"
    recorded = {"content": base64.b64encode(first["record_text"].encode()).decode()}
    assert bundle_record_check(b64(new), "ab" * 32, recorded, "no", "n1")["problem"] == ""
    older = bundle_record_check(b64(old), "cd" * 32, recorded, False, "n1")
    assert "n1: manifest.json carries no release and build time" in older["problem"]
    assert "refused as a possible downgrade" in older["problem"] and older["record"] is None
    allowed = bundle_record_check(b64(old), "cd" * 32, recorded, "true", "n1")
    assert allowed["problem"] == "" and "DOWNGRADE ALLOWED" in allowed["warning"] and allowed["record"] is None
    fresh = bundle_record_check(b64(old), "cd" * 32, missing, False, "n1")
    assert fresh["problem"] == "" and "starts with the first bundle that does" in fresh["warning"]
    unreadable = bundle_record_check(b64(new), "ab" * 32, {"failed": True, "msg": "Permission denied"}, False, "n1")
    assert "n1: its bundle record cannot be read: Permission denied" in unreadable["problem"]
    damaged = bundle_record_check(b64(new), "ab" * 32, {"content": base64.b64encode(b"{").decode()}, False, "n1")
    assert "its bundle record: not a bundle record" in damaged["problem"]
