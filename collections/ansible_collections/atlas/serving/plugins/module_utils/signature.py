# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bundle's trust anchor: the detached GPG signature of ``manifest.json``, checked against
signing keys pinned by full fingerprint.

One implementation for ``atlasctl bundle verify|push`` and the controller-side module
``atlas.serving.bundle_signature`` (preflight). gpg runs with a throwaway ``--homedir`` and
``--no-options``: the user's ``~/.gnupg``, ``GNUPGHOME`` and ``gpg.conf`` never take part. The
public keys come from a keyring file on the controller (never from the bundle); the decision is
read from gpg's machine-readable ``--status-fd`` output, not from its exit code or messages.

Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

# The bundle layout's two names that are not themselves listed in the manifest (DESIGN.md).
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.json.asc"
UNLISTED = (MANIFEST_NAME, SIGNATURE_NAME)

_FPR = re.compile(r"^[0-9A-F]{40}$")
# What inventory/example-bank pins: a format-valid fingerprint that no key has; refused by name.
PLACEHOLDER_FINGERPRINT = "0" * 40
SIGN_FIX = "Sign it on the signing station: atlasctl bundle sign DIR --key <fingerprint> (docs/bundle-signing.md)"


class SignatureError(ValueError):
    """A refused signature; ``reason`` is one word (unsigned, bad, revoked, expired-key, ...)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Verdict:
    """What was verified: the sha256 of the exact manifest bytes gpg checked, and by whom."""

    sha256: str
    signed: bool
    fingerprint: str = ""  # the signing key (a subkey or the primary)
    primary_fingerprint: str = ""
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"sha256": self.sha256, "signed": self.signed, "fingerprint": self.fingerprint,
                "primary_fingerprint": self.primary_fingerprint, "warnings": list(self.warnings)}


def normalize_fingerprints(values: object, where: str = "atlas_bundle_trusted_fingerprints") -> list[str]:
    """Full 40-hex fingerprints, upper-case, spaces removed; anything shorter is refused."""
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)):
        raise SignatureError("config", f"{where} must be a list of 40-hex fingerprints, got {values!r}")
    out = []
    for value in values:
        text = re.sub(r"\s+", "", str(value)).upper().removeprefix("0X")
        if not _FPR.match(text):
            raise SignatureError("config", f"{where}: {value!r} is not a full 40-hex fingerprint (a short key id "
                                 "can be forged); pin the fingerprint `gpg --fingerprint <key>` prints")
        if text == PLACEHOLDER_FINGERPRINT:
            raise SignatureError("config", f"{where}: the example inventory's PLACEHOLDER fingerprint is pinned; "
                                 "put your bank's signing key's fingerprint there (docs/bundle-signing.md)")
        out.append(text)
    return out


def parse_status(text: str) -> dict[str, list[list[str]]]:
    """``[GNUPG:] KEYWORD args...`` lines -> {KEYWORD: [args, ...]}."""
    found: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        if line.startswith("[GNUPG:] "):
            words = line[len("[GNUPG:] "):].split()
            if words:
                found.setdefault(words[0], []).append(words[1:])
    return found


def judge(status: dict[str, list[list[str]]], pinned: list[str], manifest: str, signature: str,
          keyring: str) -> tuple[str, str]:
    """(signing key fingerprint, primary fingerprint) of an acceptable signature, else SignatureError."""
    if "BADSIG" in status:
        raise SignatureError("bad", f"{signature}: BAD signature of {manifest}: the manifest was changed after "
                             "it was signed (or the signature was replaced). Do not install from this bundle; "
                             "copy it again from the signing station, or re-sign a bundle you rebuilt. " + SIGN_FIX)
    if "REVKEYSIG" in status or "KEYREVOKED" in status:
        raise SignatureError("revoked", f"{signature}: {manifest} is signed by a REVOKED key "
                             f"({_keyid(status, 'REVKEYSIG')}). Re-sign the bundle with a current key and pin "
                             "that key's fingerprint in atlas_bundle_trusted_fingerprints; unpin the revoked one.")
    if "EXPKEYSIG" in status:
        raise SignatureError("expired-key", f"{signature}: {manifest} is signed by an EXPIRED key "
                             f"({_keyid(status, 'EXPKEYSIG')}). Extend the key's expiry on the signing station "
                             "(gpg --quick-set-expire), export it into the keyring again, and re-sign.")
    if "EXPSIG" in status:
        raise SignatureError("expired-signature", f"{signature}: the signature of {manifest} has EXPIRED. " + SIGN_FIX)
    if "ERRSIG" in status or "NO_PUBKEY" in status:
        keyid = (status.get("NO_PUBKEY") or status.get("ERRSIG") or [["?"]])[0][0]
        raise SignatureError("unknown-key", f"{signature}: {manifest} is signed by key {keyid}, which is not in "
                             f"the keyring {keyring}. If that is your signing key, export its public key into "
                             "atlas_bundle_keyring and pin its fingerprint; otherwise do not install from this bundle.")
    valid = status.get("VALIDSIG") or []
    if not valid:
        raise SignatureError("bad", f"{signature}: no valid signature of {manifest} in it (gpg: "
                             f"{', '.join(sorted(status)) or 'no status'}). " + SIGN_FIX)
    for args in valid:
        signer = args[0].upper()
        primary = args[-1].upper() if len(args) >= 10 else signer
        if signer in pinned or primary in pinned:
            return signer, primary
    signer = valid[0][0].upper()
    primary = valid[0][-1].upper() if len(valid[0]) >= 10 else signer
    raise SignatureError("untrusted", f"{signature}: good signature of {manifest}, but by key {primary} which is "
                         "NOT pinned in atlas_bundle_trusted_fingerprints. Do not install from this bundle unless "
                         "that is your signing key; then pin its full fingerprint.")


def _keyid(status: dict[str, list[list[str]]], keyword: str) -> str:
    rows = status.get(keyword) or []
    return " ".join(rows[0][:1] + rows[0][1:]) if rows else "?"


def gpg_binary() -> str:
    gpg = shutil.which("gpg")
    if not gpg:
        raise SignatureError("environment", "gpg is not installed on the controller: apt-get install gnupg gpgv")
    return gpg


def isolated_gpg(homedir: str) -> list[str]:
    """gpg with no user state: its own homedir, no options file, no agent start, no network."""
    return [gpg_binary(), "--homedir", homedir, "--no-options", "--batch", "--no-tty", "--quiet",
            "--no-autostart", "--no-auto-key-retrieve", "--no-auto-key-locate", "--trust-model", "always"]


def _clean_env(homedir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNUPG") and k != "GPG_AGENT_INFO"}
    env["GNUPGHOME"] = homedir
    env["LC_ALL"] = "C"
    return env


def verify_manifest(manifest: bytes, signature: bytes | None, *, keyring: str, fingerprints: object,
                    manifest_name: str = MANIFEST_NAME, signature_name: str = SIGNATURE_NAME,
                    allow_unsigned: bool = False) -> Verdict:
    """Check ``signature`` (the .asc bytes, None when there is none) over the exact ``manifest`` bytes.

    Returns the Verdict (its ``sha256`` is of the bytes gpg verified); raises SignatureError with
    a message naming the file and the fix. ``allow_unsigned`` skips the check, loudly.
    """
    sha = hashlib.sha256(manifest).hexdigest()
    if allow_unsigned:
        return Verdict(sha, False, warnings=[
            f"UNSIGNED BUNDLE: the signature of {manifest_name} was NOT verified (atlas_bundle_allow_unsigned / "
            "--allow-unsigned). Anyone who can write the bundle's share can replace what this run installs."])
    if signature is None:
        raise SignatureError("unsigned", f"{signature_name} is missing: {manifest_name} is NOT signed, so nothing "
                             "vouches for the bundle's files. " + SIGN_FIX + "; or, for a lab only, opt in with "
                             "atlas_bundle_allow_unsigned: true / --allow-unsigned.")
    pinned = normalize_fingerprints(fingerprints)
    if not pinned:
        raise SignatureError("config", "no signing key is pinned: set atlas_bundle_trusted_fingerprints to the "
                             "full fingerprint(s) of your bundle signing key (docs/bundle-signing.md)")
    if not keyring or not os.path.isfile(keyring):
        raise SignatureError("config", f"the keyring {keyring or '(atlas_bundle_keyring not set)'} does not exist on "
                             "the controller: export the signing key's public key there "
                             "(gpg --export <fingerprint> > FILE) and set atlas_bundle_keyring")
    with tempfile.TemporaryDirectory(prefix="atlas-gpg-") as home:
        os.chmod(home, 0o700)
        env = _clean_env(home)
        imported = subprocess.run([*isolated_gpg(home), "--import", keyring], env=env,
                                  capture_output=True, text=True, check=False, timeout=60)
        if imported.returncode != 0 and "IMPORT_OK" not in imported.stderr + imported.stdout:
            raise SignatureError("config", f"{keyring}: gpg cannot read this keyring: "
                                 f"{imported.stderr.strip()[-300:]}")
        data, sig = os.path.join(home, "manifest"), os.path.join(home, "manifest.asc")
        with open(data, "wb") as handle:
            handle.write(manifest)
        with open(sig, "wb") as handle:
            handle.write(signature)
        proc = subprocess.run([*isolated_gpg(home), "--status-fd", "1", "--verify", sig, data], env=env,
                              capture_output=True, text=True, check=False, timeout=60)
    status = parse_status(proc.stdout)
    signer, primary = judge(status, pinned, manifest_name, signature_name, keyring)
    return Verdict(sha, True, signer, primary)


def verify_files(manifest_path: str, signature_path: str, **kwargs) -> Verdict:
    """:func:`verify_manifest` over files (a missing signature file is ``unsigned``)."""
    with open(manifest_path, "rb") as handle:
        manifest = handle.read()
    try:
        with open(signature_path, "rb") as handle:
            signature: bytes | None = handle.read()
    except FileNotFoundError:
        signature = None
    return verify_manifest(manifest, signature, manifest_name=manifest_path, signature_name=signature_path,
                           **kwargs)


def check_trusted_sha256(actual: str, expected: str, path: str) -> str:
    """'' when the node's manifest is the verified one, else the refusal message."""
    if not expected:
        return (f"{path}: the bundle's signature was not verified in this run (no atlas_bundle_manifest_sha256); "
                "run site.yml or the stage playbook, which verify it first (roles/bundle_trust)")
    if actual != expected:
        return (f"{path}: sha256 {actual} is not the manifest whose signature was verified ({expected}): "
                "it was replaced after verification. Nothing from it was used; check who writes the bundle share, "
                "copy the signed bundle again and rerun.")
    return ""


def sign_detached(data_path: str, signature_path: str, key: str, homedir: str,
                  where: str = "signing key") -> str:
    """Write ``signature_path``, an armored detached signature of ``data_path`` by ``key`` (a full fingerprint)
    from the secret keys in ``homedir``; returns the fingerprint gpg reports it signed with. Signing uses that
    homedir (its key, its agent; the key must sign unattended); verification never does (verify_manifest)."""
    pinned = normalize_fingerprints([key], where)[0]
    if not homedir or not os.path.isdir(homedir):
        raise SignatureError("config", f"the gpg home {homedir or '(not set)'} of the {where} {pinned} does not exist")
    argv = [gpg_binary(), "--homedir", homedir, "--batch", "--no-tty", "--yes", "--status-fd", "1",
            "--local-user", pinned, "--armor", "--detach-sign", "--output", signature_path, data_path]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNUPG")}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=120)
    created = parse_status(proc.stdout).get("SIG_CREATED")
    if proc.returncode != 0 or not created:
        raise SignatureError("sign", f"gpg could not sign {data_path} with the {where} {pinned} from {homedir}: "
                             f"{proc.stderr.strip()[-300:] or 'no signature made'} (the key must be in that home "
                             "and sign unattended: no passphrase, or one its agent holds)")
    return created[0][-1].upper() if created[0] else pinned
