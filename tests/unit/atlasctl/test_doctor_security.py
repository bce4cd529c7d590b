"""atlasctl doctor and the secrets around it: every written form of an API key redacted (controller side and the
node-side sed), the API keys file's mode and owner judged, and the bundle on the node checked for a signature by
a pinned key (real gpg, throwaway keys) as an error finding with its fix."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from atlasctl import cli, exitcodes, layout
from atlasctl import inventory as shared
from atlasctl.bundle_trust import Trust
from atlasctl.doctor import checks, gather
from atlasctl.doctor.model import ERROR, WARNING, Evidence, Section, redact
from support.gpg_keys import Keys, one_installer_bundle

REPO = Path(__file__).resolve().parents[3]

# (written as, the secret in it)
REDACT = [
    ("X-API-Key: sk-hdr-1", "sk-hdr-1"),
    ('curl -H "X-API-Key: sk-hdr-2" http://127.0.0.1:8000/v1/models', "sk-hdr-2"),
    ("x-api-key:sk-hdr-3", "sk-hdr-3"),
    ("api_keys=sk-plural-1", "sk-plural-1"),
    ("api_keys=['sk-plural-2', 'sk-plural-3']", "sk-plural-2"),
    ("serving_api_keys: [sk-rot-1, sk-rot-2]", "sk-rot-1"),
    ("serving_api_keys:\n  - sk-rot-3\n  - sk-rot-4", "sk-rot-4"),
    ('{"serving_api_keys": ["sk-rot-5"]}', "sk-rot-5"),
    ("apikey=sk-flat-1", "sk-flat-1"),
    ("GET /v1/models?apikey=sk-flat-2 HTTP/1.1", "sk-flat-2"),
    ("ApiKey: sk-flat-3", "sk-flat-3"),
    ("SERVING_API_KEYS=sk-env-1", "sk-env-1"),
]


@pytest.mark.parametrize(("text", "secret"), REDACT, ids=[t.split("sk-")[0].strip()[:30] or t for t, _ in REDACT])
def test_every_written_form_of_a_key_is_redacted(text, secret):
    hidden = redact(text)
    assert secret not in hidden and "<redacted>" in hidden


def test_a_finding_never_carries_the_new_forms_and_keeps_lookalikes():
    finding = checks.Finding("h", "x", ERROR, "X-API-Key: sk-a", "apikey=sk-b", "serving_api_keys: [sk-c]")
    assert "sk-" not in json.dumps(finding.to_dict())
    for text in ("serving_api_keys_file: /etc/x", "my_api_key_count=3", "grpc_keys: 2"):  # names, not keys
        assert checks.Finding("h", "x", ERROR, text, "", "").message == text


def test_node_side_redaction_of_the_env_file_forms(tmp_path):
    env = tmp_path / "e.env"
    env.write_text("VLLM_API_KEY=sk-1\nexport SGLANG_API_KEY=sk-2\nSERVING_API_KEYS=sk-3\nMY_APIKEY=sk-4\n"
                   "HF_HUB_OFFLINE=1\n")
    moved = dataclasses.replace(layout.default_layout(), env_file=str(env))
    out = subprocess.run(["bash", "-c", gather.script((("env", dict(gather.snippets(moved))["env"]),))],
                         capture_output=True, text=True, check=True).stdout
    assert "sk-" not in out and "HF_HUB_OFFLINE=1" in out


# --- the API keys file (the engine's --config) -----------------------------------------------------------------

KEYS = "/etc/atlas/serving/releases/r1/atlas-serving.keys.yaml"


@pytest.mark.parametrize(("line", "problem"), [
    (f"{KEYS} 640 root atlas-serving", None),  # as the serving role writes it
    (f"{KEYS} 440 root atlas-serving", None),
    (f"{KEYS} 600 atlas-serving atlas-serving", None),
    (f"{KEYS} 400 atlas-serving atlas-serving", None),
    (f"{KEYS} 600 root root", None),
    (f"{KEYS} 644 root atlas-serving", "others can access it"),
    (f"{KEYS} 604 root root", "others can access it"),
    (f"{KEYS} 660 root atlas-serving", "group atlas-serving can write or run it"),
    (f"{KEYS} 640 root users", "group users can read it"),
    (f"{KEYS} 600 nobody nobody", "it belongs to nobody"),
    (f"{KEYS} 4600 root root", "set-id"),
])
def test_the_keys_file_mode_and_owner(line, problem):
    ev = Evidence("n1", {"keys": Section(0, line)})
    found = checks.check_keys_file(ev, "atlas-serving", "atlas-serving")
    if problem is None:
        assert found == []
    else:
        assert [f.check for f in found] == ["keys-file-mode"] and found[0].severity == ERROR
        assert problem in found[0].message and KEYS in found[0].evidence and "chmod 0640" in found[0].fix


def test_the_keys_file_is_found_through_the_args_file(tmp_path):
    """The node-side snippet follows the engine's --config (as a separate line or --config=FILE) and stats it."""
    keys = tmp_path / "atlas-serving.keys.yaml"
    keys.write_text('{"api-key": ["sk-1"]}')
    keys.chmod(0o644)
    for args_text in (f"vllm\nserve\n/m\n--config\n{keys}\n--port\n8000\n", f"python3\n--config={keys}\n"):
        args = tmp_path / "a.args"
        args.write_text(args_text)
        moved = dataclasses.replace(layout.default_layout(), args_file=str(args))
        out = subprocess.run(["bash", "-c", gather.script((("keys", dict(gather.snippets(moved))["keys"]),))],
                             capture_output=True, text=True, check=True).stdout
        ev = gather.split_sections("n1", out, moved)
        found = checks.check_keys_file(ev, "atlas-serving", "atlas-serving")
        assert "sk-1" not in out and [f.message.split(":")[-1].strip() for f in found] == ["others can access it"]
    args.write_text("vllm\nserve\n/m\n")  # no key configured: nothing to judge
    out = subprocess.run(["bash", "-c", gather.script((("keys", dict(gather.snippets(moved))["keys"]),))],
                         capture_output=True, text=True, check=True).stdout
    assert checks.check_keys_file(gather.split_sections("n1", out, moved), "atlas-serving", "atlas-serving") == []


# --- the bundle on the node: signed by a pinned key -------------------------------------------------------------

gpg = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("doctor-pki")
    signing = Keys(tmp / "signing")
    fpr = {"pinned": signing.make("pinned@bank"), "other": signing.make("other@bank")}
    keyring = signing.export(tmp / "trusted.gpg", "pinned@bank", "other@bank")
    yield signing, fpr, keyring
    signing.close()


def _node_bundle(root: Path) -> Path:
    return one_installer_bundle(root)


def _evidence(root: Path) -> Evidence:
    """The node's bundle section, gathered by the real snippet from ``root``."""
    out = subprocess.run(["bash", "-c", gather.script((("bundle", gather.bundle_snippet(str(root))),))],
                         capture_output=True, text=True, check=True).stdout
    return gather.split_sections("n1", out)


@gpg
@pytest.mark.parametrize(("case", "severity", "words"), [
    ("signed", None, None),
    ("unsigned", ERROR, ["(unsigned)", "manifest.json.asc is missing", "signature missing"]),
    ("other-key", ERROR, ["(untrusted)", "NOT pinned"]),
    ("edited", ERROR, ["(bad)", "BAD signature"]),
    ("no-bundle", WARNING, ["no bundle to check", "no "]),
    ("opted-out", None, None),
])
def test_the_bundle_on_the_node_is_signed_by_a_pinned_key(keys, tmp_path, case, severity, words):
    signing, fpr, keyring = keys
    root = _node_bundle(tmp_path / "b")
    signing.sign(root, "other@bank" if case == "other-key" else "pinned@bank")
    if case == "unsigned":
        (root / "manifest.json.asc").unlink()
    elif case == "edited":
        (root / "manifest.json").write_bytes((root / "manifest.json").read_bytes().replace(b'"t"', b'"u"'))
    elif case == "no-bundle":
        shutil.rmtree(root)
    trust = Trust(str(keyring), (fpr["pinned"],), case == "opted-out")
    found = checks.check_bundle_signed(_evidence(root), trust)
    if severity is None:
        assert found == []
        return
    assert [(f.check, f.severity) for f in found] == [("bundle-signature", severity)]
    text = " ".join((found[0].message, found[0].evidence, found[0].fix))
    assert all(word in text for word in words), text
    assert f"n1:{root}" in text and found[0].fix


def test_a_host_without_atlas_bundle_dir_is_a_warning():
    found = checks.check_bundle_signed(Evidence("n1", {}), Trust("/k.gpg", ("A" * 40,), False))
    assert [(f.check, f.severity) for f in found] == [("bundle-signature", WARNING)]
    assert "atlas_bundle_dir" in found[0].fix


@gpg
def test_doctor_reports_an_unsigned_bundle_as_an_error(keys, tmp_path, monkeypatch, capsys):
    """The whole command: the inventory's atlas_bundle_dir reaches the node's gather, and the bundle there is
    judged against the inventory's pinned key (the gather runs here: only its bundle and keys sections)."""
    _signing, fpr, keyring = keys
    root = _node_bundle(tmp_path / "b")  # never signed
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(json.dumps({"all": {"children": {"atlas_nodes": {"hosts": {"n1": {
        "ansible_host": "127.0.0.1", "atlas_bundle_dir": str(root), "atlas_bundle_keyring": str(keyring),
        "atlas_bundle_trusted_fingerprints": [fpr["pinned"]]}}}}}}))

    def run_here(target: shared.Target, script: str) -> str:
        wanted = tuple((n, s) for n, s in gather.snippets(target.layout, 0, target.bundle_dir)
                       if n in ("bundle", "keys"))
        return subprocess.run(["bash", "-c", gather.script(wanted)], capture_output=True, text=True,
                              check=True).stdout

    monkeypatch.setattr("atlasctl.doctor.inventory.ssh_run", run_here)
    monkeypatch.chdir(REPO)
    code = cli.main(["doctor", "-i", str(inv), "--json", "--hang-window", "0"])
    doc = json.loads(capsys.readouterr().out)
    signature = [f for f in doc["hosts"]["n1"]["findings"] if f["check"] == "bundle-signature"]
    assert code == exitcodes.FAILED and [f["severity"] for f in signature] == [ERROR], signature
    assert "manifest.json.asc is missing" in signature[0]["message"] and "atlasctl bundle sign" in signature[0]["fix"]
