"""Signed bundles: `atlasctl bundle verify` refuses each kind of bad signature with its own reason,
with real gpg and throwaway homedirs; the user's GNUPGHOME takes no part; bundle file safety."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from atlasctl import bundle, cli, exitcodes
from atlasctl.bundle_sources import sign_manifest
from support.gpg_keys import Keys, one_installer_bundle

pytestmark = pytest.mark.skipif(not shutil.which("gpg"), reason="gpg is not installed (apt-get install gnupg gpgv)")
PAST = "20200101T000000"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    """pinned (good), other (in the keyring, not pinned), revoked and expired (pinned), past (pinned, for an
    expired signature), stranger (in no keyring)."""
    tmp = tmp_path_factory.mktemp("pki")
    keys = Keys(tmp / "signing")
    fpr = {
        "pinned": keys.make("pinned@bank"),
        "other": keys.make("other@bank"),
        "revoked": keys.make("revoked@bank"),
        "expired": keys.make("expired@bank", "1d", faked=PAST),
        "past": keys.make("past@bank", faked=PAST),
    }
    stranger = Keys(tmp / "stranger")
    fpr["stranger"] = stranger.make("stranger@elsewhere")
    before = Keys(tmp / "before-revocation", copy_of=keys.home)  # signs with the key revoked afterwards
    keys.revoke(fpr["revoked"])
    keyring = keys.export(tmp / "trusted.gpg", *(f"{n}@bank" for n in ("pinned", "other", "revoked", "expired",
                                                                        "past")))
    keys.before = before
    yield keys, stranger, fpr, keyring
    for each in (keys, stranger, before):
        each.close()


def _tamper(root: Path) -> None:
    """An attacker with write access to the share: a replaced installer and a rewritten manifest."""
    (root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_bytes(b"#!/bin/sh\necho evil\n")
    bundle.write_manifest(root, "t")


def _verify(root: Path, keyring: Path, *pinned: str, extra: tuple[str, ...] = ()) -> list[str]:
    argv = ["bundle", "verify", str(root), "--keyring", str(keyring)]
    for fpr in pinned:
        argv += ["--fingerprint", fpr]
    return [*argv, *extra]


def test_good_signature_by_a_pinned_key_passes(pki, tmp_path, capsys):
    keys, _stranger, fpr, keyring = pki
    root = one_installer_bundle(tmp_path / "b")
    keys.sign(root, "pinned@bank")
    assert cli.main(_verify(root, keyring, fpr["pinned"])) == exitcodes.OK
    assert f"signed by {fpr['pinned']}" in capsys.readouterr().out


@pytest.mark.parametrize("case, reason, words", [
    ("unsigned", "unsigned", "manifest.json.asc is missing"),
    ("other", "untrusted", "NOT pinned"),
    ("revoked", "revoked", "REVOKED key"),
    ("expired", "expired-key", "EXPIRED key"),
    ("expired-signature", "expired-signature", "signature of"),
    ("stale", "bad", "BAD signature"),
    ("stranger", "unknown-key", "not in the keyring"),
])
def test_tampered_bundle_is_refused_with_its_own_reason(pki, tmp_path, capsys, case, reason, words):
    keys, stranger, fpr, keyring = pki
    root = one_installer_bundle(tmp_path / "b")
    keys.sign(root, "pinned@bank")
    _tamper(root)
    if case == "unsigned":
        (root / "manifest.json.asc").unlink()
    elif case == "other":
        keys.sign(root, "other@bank")
    elif case == "revoked":
        keys.before.sign(root, "revoked@bank")
    elif case == "expired":
        keys.sign(root, "expired@bank", faked="20200101T010000")
    elif case == "expired-signature":
        keys.sign(root, "past@bank", "--default-sig-expire", "1d", faked="20200101T010000")
    elif case == "stranger":
        stranger.sign(root, "stranger@elsewhere")
    pinned = [fpr["pinned"], fpr["revoked"], fpr["expired"], fpr["past"]]
    assert cli.main(_verify(root, keyring, *pinned)) == exitcodes.FAILED
    err = " ".join(capsys.readouterr().err.split())
    assert f"REFUSED ({reason})" in err and words in err and "manifest.json" in err
    # the tampered file itself would pass the checksum check: only the signature stops it
    assert bundle.verify_bundle(root) == []


def test_allow_unsigned_passes_loudly(pki, tmp_path, capsys):
    root = one_installer_bundle(tmp_path / "b")
    assert cli.main(["bundle", "verify", str(root), "--allow-unsigned"]) == exitcodes.OK
    out = capsys.readouterr()
    assert "!!! WARNING" in out.err and "UNSIGNED BUNDLE" in out.err and "NOT signature-checked" in out.out


def test_short_key_ids_are_refused(pki, tmp_path, capsys):
    keys, _stranger, fpr, keyring = pki
    root = one_installer_bundle(tmp_path / "b")
    keys.sign(root, "pinned@bank")
    assert cli.main(_verify(root, keyring, fpr["pinned"][-16:])) == exitcodes.FAILED
    assert "not a full 40-hex fingerprint" in capsys.readouterr().err


def test_users_gnupg_home_takes_no_part(pki, tmp_path, capsys, monkeypatch):
    """A GNUPGHOME that trusts the stranger's key and whose gpg.conf would break gpg changes nothing."""
    keys, stranger, fpr, keyring = pki
    evil = tmp_path / "evil-home"
    shutil.copytree(stranger.home, evil, ignore=shutil.ignore_patterns("S.*"))
    (evil / "gpg.conf").write_text("no-such-option-breaks-gpg\ntrust-model always\nkeyring /nonexistent\n")
    monkeypatch.setenv("GNUPGHOME", str(evil))
    root = one_installer_bundle(tmp_path / "b")
    keys.sign(root, "pinned@bank")
    assert cli.main(_verify(root, keyring, fpr["pinned"])) == exitcodes.OK
    stranger.sign(root, "stranger@elsewhere")
    assert cli.main(_verify(root, keyring, fpr["pinned"], fpr["stranger"])) == exitcodes.FAILED
    assert "REFUSED (unknown-key)" in capsys.readouterr().err


def test_trust_from_the_inventory_and_the_alias(pki, tmp_path, capsys):
    keys, _stranger, fpr, keyring = pki
    root = one_installer_bundle(tmp_path / "b")
    keys.sign(root, "pinned@bank")
    inv = tmp_path / "hosts.yml"
    inv.write_text(json.dumps({"all": {
        "vars": {"atlas_bundle_keyring": str(keyring), "atlas_bundle_trusted_fingerprints": [fpr["pinned"]]},
        "children": {"atlas_nodes": {"hosts": {"n1": None}}}}}))
    assert cli.main(["bundle", "verify", str(root), "-i", str(inv)]) == exitcodes.OK
    (root / "manifest.json.asc").unlink()
    assert cli.main(["bundle", "verify", str(root), "-i", str(inv)]) == exitcodes.FAILED
    assert "REFUSED (unsigned)" in capsys.readouterr().err
    inv.write_text(json.dumps({"all": {"vars": {"bundle_allow_unsigned": True},
                                       "children": {"atlas_nodes": {"hosts": {"n1": None}}}}}))
    assert cli.main(["bundle", "verify", str(root), "-i", str(inv)]) == exitcodes.OK
    assert "UNSIGNED BUNDLE" in capsys.readouterr().err


def test_build_signs_with_the_named_key_and_sign_refuses_a_damaged_bundle(pki, tmp_path, capsys):
    keys, _stranger, fpr, keyring = pki
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    spec = tmp_path / "b.yml"
    spec.write_text(f"name: t\nmodels:\n  - {{name: m, path: {src}}}\n")
    out = tmp_path / "out"
    argv = ["bundle", "build", "--spec", str(spec), "--out", str(out), "--sign-key", fpr["pinned"],
            "--sign-home", str(keys.home)]
    assert cli.main(argv) == exitcodes.OK
    assert cli.main(_verify(out, keyring, fpr["pinned"])) == exitcodes.OK
    (out / "models" / "m" / "config.json").write_text('{"x": 1}')
    assert cli.main(["bundle", "sign", str(out), "--key", fpr["pinned"], "--homedir", str(keys.home)]) \
        == exitcodes.FAILED
    assert "not signing it" in capsys.readouterr().err
    bundle.write_manifest(out, "t")
    assert cli.main(["bundle", "sign", str(out), "--key", fpr["pinned"], "--homedir", str(keys.home)]) == exitcodes.OK
    assert cli.main(_verify(out, keyring, fpr["pinned"])) == exitcodes.OK


def test_module_utils_verdict_is_the_sha256_of_the_verified_bytes(pki, tmp_path):
    from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

    keys, _stranger, fpr, keyring = pki
    root = one_installer_bundle(tmp_path / "b")
    sign_manifest(root, "pinned@bank", keys.home)
    data = (root / "manifest.json").read_bytes()
    verdict = sig.verify_manifest(data, (root / "manifest.json.asc").read_bytes(), keyring=str(keyring),
                                  fingerprints=[fpr["pinned"]])
    import hashlib

    assert verdict.sha256 == hashlib.sha256(data).hexdigest() and verdict.primary_fingerprint == fpr["pinned"]
    assert sig.check_trusted_sha256(verdict.sha256, verdict.sha256, "m") == ""
    assert "replaced after verification" in sig.check_trusted_sha256("0" * 64, verdict.sha256, "m")
    assert "not verified in this run" in sig.check_trusted_sha256(verdict.sha256, "", "m")


# --- bundle file safety ------------------------------------------------------------------------


def test_symlinks_are_refused_and_dot_files_reported(tmp_path, capsys):
    root = one_installer_bundle(tmp_path / "b")
    (root / "cann" / ".hidden").write_text("x")
    (root / "cann" / "passwd").symlink_to("/etc/passwd")
    (root / "outside").symlink_to(tmp_path)
    bad = {b.path: b.problem for b in bundle.verify_bundle(root)}
    assert bad == {"cann/.hidden": "unexpected", "cann/passwd": "symlink", "outside": "symlink"}
    assert cli.main(["bundle", "verify", str(root), "--allow-unsigned"]) == exitcodes.FAILED
    assert "cann/passwd: a symlink" in capsys.readouterr().err
    with pytest.raises(Exception, match="cann/passwd"):
        bundle.write_manifest(root, "t")
    (root / "cann" / "passwd").unlink()
    (root / "outside").unlink()
    listed = [f["path"] for f in bundle.write_manifest(root, "t")["files"]]
    assert "cann/.hidden" in listed and "manifest.json" not in listed


@pytest.mark.parametrize("entry", ["wheelsets: ['../../etc']", "wheelsets: [/etc]",
                                   "models: [{name: ../x, generator: tiny-llama}]", "cann: ['../8.5.0']"])
def test_spec_names_never_leave_the_bundle(tmp_path, capsys, entry):
    spec = tmp_path / "b.yml"
    spec.write_text(f"name: t\n{entry}\n")
    assert cli.main(["bundle", "build", "--spec", str(spec), "--out", str(tmp_path / "out")]) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert ("is not a plain model name" if entry.startswith("models") else "is not a plain file name") in err
    assert entry.split(":")[0] in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_zip_members_are_recorded(tmp_path):
    import zipfile

    root = tmp_path / "b"
    (root / "cann").mkdir(parents=True)
    with zipfile.ZipFile(root / "cann" / "k.zip", "w") as archive:
        archive.writestr("k.run", b"payload")
    entry = bundle.write_manifest(root, "t")["files"][0]
    import hashlib

    assert entry["members"] == [{"path": "k.run", "size": 7, "sha256": hashlib.sha256(b"payload").hexdigest()}]
    assert not (root / ".atlas-manifest-cache.json").exists()
    assert os.path.exists(bundle.stat_cache_path(root))


def test_build_refuses_a_model_source_with_a_symlink(tmp_path, capsys):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "weights.safetensors").symlink_to("/etc/hostname")
    spec = tmp_path / "b.yml"
    spec.write_text(f"name: t\nmodels:\n  - {{name: m, path: {src}}}\n")
    assert cli.main(["bundle", "build", "--spec", str(spec), "--out", str(tmp_path / "out")]) == exitcodes.USAGE
    assert "weights.safetensors" in capsys.readouterr().err


# --- one read of manifest.json -------------------------------------------------------------------


class SwapOnSecondRead:
    """Every open of ``path`` for reading is counted; the second one finds ``evil`` there: an attacker who
    swaps the manifest on the share between two reads, made deterministic (builtins.open and io.open, which
    pathlib uses, are both watched)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path, evil: bytes):
        import builtins
        import io

        self.path, self.evil, self.reads = str(path), evil, 0
        real = builtins.open

        def watched(file, *args, **kwargs):
            mode = args[0] if args else kwargs.get("mode", "r")
            if isinstance(file, (str, os.PathLike)) and os.path.abspath(file) == self.path and "r" in mode:
                self.reads += 1
                if self.reads == 2:
                    fd = os.open(self.path, os.O_WRONLY | os.O_TRUNC)
                    os.write(fd, self.evil)
                    os.close(fd)
            return real(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", watched)
        monkeypatch.setattr(io, "open", watched)


def _swap_prepared(pki, tmp_path: Path) -> tuple[Path, bytes]:
    """A signed bundle whose installer an attacker already replaced, and the attacker's manifest that lists
    the replaced installer (what the swap puts in place)."""
    keys, _stranger, _fpr, _keyring = pki
    root = one_installer_bundle(tmp_path / "b")
    keys.sign(root, "pinned@bank")
    evil = one_installer_bundle(tmp_path / "evil")
    _tamper(evil)
    shutil.copy(evil / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run",
                root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run")
    return root, (evil / "manifest.json").read_bytes()


def test_verify_reads_the_manifest_once_so_a_swap_between_reads_is_never_accepted(pki, tmp_path, monkeypatch,
                                                                                   capsys):
    _keys, _stranger, fpr, keyring = pki
    root, evil = _swap_prepared(pki, tmp_path)
    swap = SwapOnSecondRead(monkeypatch, root / "manifest.json", evil)
    assert cli.main(_verify(root, keyring, fpr["pinned"])) == exitcodes.FAILED
    assert swap.reads == 1, "manifest.json read more than once"
    err = capsys.readouterr().err
    assert "Ascend-cann-toolkit_8.5.0_linux-x86_64.run: sha256 mismatch" in err and "do not install" in err


def test_push_reads_the_manifest_once_and_sends_nothing_after_a_swap(pki, tmp_path, monkeypatch, capsys):
    from atlasctl import bundle_push

    _keys, _stranger, fpr, keyring = pki
    root, evil = _swap_prepared(pki, tmp_path)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("atlas_nodes:\n  hosts:\n    n1:\n")
    pushed = []
    monkeypatch.setattr(bundle_push, "inventory_targets", lambda *a, **k: [])
    monkeypatch.setattr(bundle_push, "push", lambda *a, **k: pushed.append(a) or [])
    swap = SwapOnSecondRead(monkeypatch, root / "manifest.json", evil)
    argv = ["bundle", "push", "-i", str(inventory), "--src", str(root), "--no-verify", "--keyring", str(keyring),
            "--fingerprint", fpr["pinned"]]
    assert cli.main(argv) == exitcodes.FAILED
    assert swap.reads == 1 and pushed == []
    assert "not pushing it" in capsys.readouterr().err


def test_sign_signs_the_bytes_it_checked(pki, tmp_path, monkeypatch, capsys):
    """`bundle sign` checks the files against one read of the manifest and signs those bytes: a manifest
    swapped after the check is not what the signature vouches for."""
    keys, _stranger, fpr, keyring = pki
    root, evil = _swap_prepared(pki, tmp_path)
    good = one_installer_bundle(tmp_path / "good")  # the intact bundle: its manifest is the one the signer checks
    root_manifest = (good / "manifest.json").read_bytes()
    (root / "manifest.json").write_bytes(root_manifest)
    shutil.copy(good / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run",
                root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run")
    swap = SwapOnSecondRead(monkeypatch, root / "manifest.json", evil)
    assert cli.main(["bundle", "sign", str(root), "--key", fpr["pinned"], "--homedir", str(keys.home)]) \
        == exitcodes.OK
    assert swap.reads == 1
    monkeypatch.undo()
    from ansible_collections.atlas.serving.plugins.module_utils import signature as sig

    signature = (root / "manifest.json.asc").read_bytes()
    verdict = sig.verify_manifest(root_manifest, signature, keyring=str(keyring), fingerprints=[fpr["pinned"]])
    assert verdict.signed and verdict.sha256 in capsys.readouterr().out


@pytest.mark.parametrize("command", ["verify", "push"])
def test_a_signature_that_is_a_directory_is_one_line_and_exit_2(tmp_path, capsys, command):
    root = one_installer_bundle(tmp_path / "b")
    (root / "manifest.json.asc").mkdir()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("atlas_nodes:\n  hosts:\n    n1:\n")
    argv = ["bundle", "verify", str(root)] if command == "verify" else [
        "bundle", "push", "-i", str(inventory), "--src", str(root)]
    assert cli.main([*argv, "--keyring", str(tmp_path / "k.gpg"), "--fingerprint", "AB" * 20]) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([x for x in err.splitlines() if not x.startswith("  fix:")]) == 1, err
    assert "manifest.json.asc is a directory" in err


def test_push_of_a_missing_src_is_one_line_and_exit_2(tmp_path, capsys):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("atlas_nodes:\n  hosts:\n    n1:\n")
    argv = ["bundle", "push", "-i", str(inventory), "--src", str(tmp_path / "nope")]
    assert cli.main(argv) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([x for x in err.splitlines() if not x.startswith("  fix:")]) == 1, err
    assert f"bundle directory {tmp_path / 'nope'} does not exist" in err
