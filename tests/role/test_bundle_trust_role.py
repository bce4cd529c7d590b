"""roles/bundle_trust against localhost: the controller-side verification (module
atlas.serving.bundle_signature) sets atlas_bundle_manifest_sha256; a manifest swapped after it is
refused by the node-side check the stage roles run; unsigned is refused unless opted in, loudly."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl import bundle
from atlasctl.bundle_sources import sign_manifest
from support.ansible_run import ansible_env, run_playbook

pytestmark = [pytest.mark.role,
              pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")]

PLAYBOOK = """
- name: Bundle trust role test
  hosts: cases
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


# Each case is a host of its own (ansible_connection=local; its variables are its host's, as a site's inventory gives
# them), so cases that need nothing of another's run go side by side in one ansible-playbook run: one start-up for
# several. What a case proves is read from its own lines of the output (the results naming it, its recap line).
RESULT = re.compile(r"^(?:ok|changed|fatal|failed|skipping|ignoring|\.\.\.ignoring): \[([^\]\s]+)")
RECAP = re.compile(r"^(\S+)\s+: ok=\d+ +changed=(\d+) +unreachable=(\d+) +failed=(\d+)")


def record_of(tmp: Path, case: str) -> Path:
    return tmp / case / "node" / "bundle.json"  # never the machine's own


def play(tmp: Path, cases: dict[str, dict], *args: str) -> tuple[int, dict[str, tuple[bool, str]], str]:
    """PLAYBOOK run once for ``cases`` ({host: its variables}): the run's rc; per case, (whether it came through,
    i.e. what its rc would be alone: nothing failed, nothing unreachable; its own output); the whole output."""
    (tmp / "play.yml").write_text(PLAYBOOK)
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "atlas_bundle_record": str(record_of(tmp, name)), **extra} for name, extra in cases.items()}
    (tmp / "inventory.yml").write_text(json.dumps({"all": {
        "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}},
        "children": {"cases": {"hosts": hosts}}}}))
    proc = run_playbook(tmp / "inventory.yml", tmp / "play.yml", *args, cwd=tmp, env=ansible_env(tmp))
    whole = " ".join((proc.stdout + proc.stderr).split())
    lines: dict[str, list[str]] = {name: [] for name in cases}
    through: dict[str, bool] = {}
    host = None
    for line in proc.stdout.splitlines():
        result, recap = RESULT.match(line), RECAP.match(line)
        if recap and recap.group(1) in lines:
            host = None
            through[recap.group(1)] = recap.group(3) == recap.group(4) == "0"
            lines[recap.group(1)].append(line)
        elif result:
            host = result.group(1) if result.group(1) in lines else None
        elif line[:1] not in (" ", ""):
            host = None  # TASK, PLAY, "included: ... for a, b": no one case's
        if host:
            lines[host].append(line)
    assert set(through) == set(cases) and (proc.returncode == 0) == all(through.values()), whole[-3000:]
    return proc.returncode, {name: (through[name], " ".join(" ".join(lines[name]).split())) for name in cases}, whole


def play_one(tmp: Path, case: str, extra: dict, *args: str) -> tuple[int, str]:
    """PLAYBOOK for one case: the run's rc and its whole output."""
    rc, _cases, whole = play(tmp, {case: extra}, *args)
    return rc, whole


def _bundle(root: Path) -> Path:
    (root / "cann").mkdir(parents=True)
    (root / "cann" / "x.run").write_text("#!/bin/sh\n")
    bundle.write_manifest(root, "t")
    return root


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


@pytest.fixture(scope="module")
def cases(signer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict[str, Path]]:
    """The bundles the cases verify (one of its own for a case that changes it), and the trust settings."""
    home, fpr, keyring = signer
    tmp = tmp_path_factory.mktemp("cases")
    roots = {name: _bundle(tmp / "bundles" / name) for name in ("plain", "swapped", "unsigned", "downgrade")}
    for name in ("plain", "swapped"):
        sign_manifest(roots[name], fpr, home)
    roots["doubles"] = root = tmp / "bundles" / "doubles"
    (root / "cann").mkdir(parents=True)
    (root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_text("#!/bin/sh\n")
    bundle.write_manifest(root, "t", sources=[("cann/*_8.5.0_*", "lab-double")])
    sign_manifest(root, fpr, home)
    _built(roots["downgrade"], "bank-2026.12.0", "2026-12-01T10:00:00Z", signer)
    trust = {"atlas_bundle_keyring": str(keyring), "atlas_bundle_trusted_fingerprints": [fpr]}
    return tmp, trust, roots


@pytest.fixture(scope="module")
def check_run(cases) -> tuple[dict[str, tuple[bool, str]], bool]:
    """One run in check mode: the unsigned bundle without and with the opt-in, and the downgrade case's first
    look at its bundle (then whether that wrote the node's record)."""
    tmp, trust, roots = cases
    _rc, outs, _whole = play(tmp, {
        "unsigned": trust | {"atlas_bundle_dir": str(roots["unsigned"])},
        "unsigned_allowed": trust | {"atlas_bundle_dir": str(roots["unsigned"]), "bundle_allow_unsigned": True},
        "downgrade": trust | {"atlas_bundle_dir": str(roots["downgrade"])}}, "--check")
    return outs, record_of(tmp, "downgrade").exists()


@pytest.fixture(scope="module")
def first_run(cases, check_run) -> dict[str, tuple[bool, str]]:
    """One run for real (after check_run: the downgrade case's check-mode run comes before this one)."""
    tmp, trust, roots = cases
    _rc, outs, _whole = play(tmp, {
        "plain": trust | {"atlas_bundle_dir": str(roots["plain"])},
        "swapped": trust | {"atlas_bundle_dir": str(roots["swapped"]), "swap": True},
        "doubles": trust | {"atlas_bundle_dir": str(roots["doubles"])},
        "lab": trust | {"atlas_bundle_dir": str(roots["doubles"]), "atlas_lab": True},
        "downgrade": trust | {"atlas_bundle_dir": str(roots["downgrade"])}})
    return outs


def test_verified_then_swapped_manifest_is_refused_on_the_node(signer, first_run) -> None:
    _home, fpr, _keyring = signer
    ok, out = first_run["plain"]
    assert ok and f"signed by {fpr}" in out, out[-3000:]
    ok, out = first_run["swapped"]  # verified as plain was, then its manifest rewritten
    assert not ok and f"signed by {fpr}" in out and "is not the manifest whose signature was verified" in out, \
        out[-3000:]


def test_unsigned_is_refused_unless_opted_in_loudly_in_check_mode_too(check_run) -> None:
    outs, _written = check_run
    ok, out = outs["unsigned"]
    assert not ok and "manifest.json.asc is missing" in out and "NOT signed" in out, out[-3000:]
    ok, out = outs["unsigned_allowed"]
    assert ok and "!!! UNSIGNED BUNDLE" in out and "changed=0" in out, out[-3000:]


def test_lab_doubles_are_refused_unless_the_inventory_is_the_lab(signer, first_run) -> None:
    _home, fpr, _keyring = signer
    ok, out = first_run["doubles"]
    assert not ok and "lists 1 lab double(s)" in out and "Ascend-cann-toolkit_8.5.0_linux-x86_64.run" in out, \
        out[-3000:]
    ok, out = first_run["lab"]
    assert ok and f"signed by {fpr}" in out, out[-3000:]


def test_an_older_bundle_is_refused_unless_the_downgrade_is_on_purpose(signer, cases, check_run, first_run) -> None:
    tmp, trust, roots = cases
    root, record = roots["downgrade"], record_of(tmp, "downgrade")
    trust = trust | {"atlas_bundle_dir": str(root)}  # its manifest: release bank-2026.12.0, built 2026-12-01
    outs, written_in_check_mode = check_run
    ok, out = outs["downgrade"]  # check mode: judged, nothing written
    assert ok and not written_in_check_mode, out[-3000:]
    ok, out = first_run["downgrade"]
    assert ok and "changed=1" in out, out[-3000:]
    written = json.loads(record.read_text())
    assert (written["release"], written["built"]) == ("bank-2026.12.0", "2026-12-01T10:00:00Z")
    assert written["manifest_sha256"] == hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()
    rc, out = play_one(tmp, "downgrade", trust)
    assert rc == 0 and "changed=0" in out, out[-3000:]  # the same bundle again: nothing changes
    _built(root, "bank-2026.11.0", "2026-11-01T10:00:00Z", signer)  # an old signed bundle put back
    rc, out = play_one(tmp, "downgrade", trust)
    assert rc != 0 and "is OLDER than the bundle this node last accepted" in out, out[-3000:]
    assert "release bank-2026.11.0 built 2026-11-01T10:00:00Z" in out and "bank-2026.12.0" in out
    assert "atlas_allow_downgrade=true" in out and json.loads(record.read_text()) == written
    rc, out = play_one(tmp, "downgrade", trust | {"atlas_allow_downgrade": True})
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
