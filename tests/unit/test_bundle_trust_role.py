"""roles/bundle_trust against localhost: the controller-side verification (module
atlas.serving.bundle_signature) sets atlas_bundle_manifest_sha256; a manifest swapped after it is
refused by the node-side check the stage roles run; unsigned is refused unless opted in, loudly."""

from __future__ import annotations

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
