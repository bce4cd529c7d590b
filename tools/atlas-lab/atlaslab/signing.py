"""The lab's signing keys: one per machine and purpose, generated on first use, kept in the cache dir.

The bundle key: ``<cache>/lab-signing/gnupg/`` is its own gpg homedir (0700) holding a no-passphrase
ed25519 key; ``<cache>/lab-signing/trusted.gpg`` is the exported public key, the keyring the lab's
generated inventory pins (``atlas_bundle_keyring``, ``atlas_bundle_trusted_fingerprints``).
Every lab path that writes a bundle manifest signs it here: ``atlasctl bundle build`` into the
lab's bundle directory, and the lab tests' and drills' scratch bundles (``sign_bundle``).
A bank's signing key lives on its own signing station (docs/bundle-signing.md), never here.

The evidence key, a separate one (``<cache>/lab-evidence/``, the same layout): the controller's
own key that signs each rollout's evidence pack (docs/evidence.md), named in the generated inventory
(``atlas_evidence_signing_key``, ``atlas_evidence_gnupg_home``). It is never the bundle's key: a pack
records which key signed the bundle, and an auditor must be able to tell the two apart.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from atlasctl.errors import EnvironmentProblem
from atlasctl.paths import cache_dir

UID = "atlas-serving lab bundle signing (lab only, not for production) <lab-signing@atlas-serving.invalid>"
EVIDENCE_UID = "atlas-serving lab evidence signing (lab only, not for production) <lab-evidence@atlas-serving.invalid>"
BUNDLE, EVIDENCE = "bundle", "evidence"
_DIRS = {BUNDLE: "lab-signing", EVIDENCE: "lab-evidence"}
_UIDS = {BUNDLE: UID, EVIDENCE: EVIDENCE_UID}


def signing_dir(purpose: str = BUNDLE) -> Path:
    return cache_dir() / _DIRS[purpose]


def homedir(purpose: str = BUNDLE) -> Path:
    return signing_dir(purpose) / "gnupg"


def keyring(purpose: str = BUNDLE) -> Path:
    return signing_dir(purpose) / "trusted.gpg"


def _gpg(purpose: str, *args: str, text: bool = True) -> subprocess.CompletedProcess:
    gpg = shutil.which("gpg")
    if not gpg:
        raise EnvironmentProblem("gpg is not installed", fix="apt-get install gnupg gpgv (make host-deps)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNUPG")}
    return subprocess.run([gpg, "--homedir", str(homedir(purpose)), "--no-options", "--batch", "--no-tty", *args],
                          env=env, capture_output=True, text=text, check=False, timeout=120)


def _stop_agent(purpose: str = BUNDLE) -> None:
    gpgconf = shutil.which("gpgconf")
    if gpgconf:
        subprocess.run([gpgconf, "--homedir", str(homedir(purpose)), "--kill", "gpg-agent"],
                       capture_output=True, check=False, timeout=30)


def _secret_fingerprint(purpose: str) -> str:
    listing = _gpg(purpose, "--with-colons", "--list-secret-keys")
    for line in listing.stdout.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    return ""


def ensure_key(purpose: str = BUNDLE) -> str:
    """The lab key's fingerprint; the key and its exported keyring are created once per machine."""
    home = homedir(purpose)
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(signing_dir(purpose), 0o700)
    os.chmod(home, 0o700)
    fingerprint = _secret_fingerprint(purpose)
    if not fingerprint:
        made = _gpg(purpose, "--passphrase", "", "--quick-gen-key", _UIDS[purpose], "ed25519", "sign", "never")
        _stop_agent(purpose)
        fingerprint = _secret_fingerprint(purpose)
        if not fingerprint:
            raise EnvironmentProblem(f"gpg could not create the lab {purpose} signing key in {home}: "
                                     f"{made.stderr.strip()[-400:]}",
                                     fix=f"remove {signing_dir(purpose)} and run again")
    if not keyring(purpose).is_file():
        exported = _gpg(purpose, "--export", fingerprint, text=False)
        if exported.returncode != 0 or not exported.stdout:
            raise EnvironmentProblem(f"gpg could not export the lab {purpose} signing key {fingerprint} from {home}",
                                     fix=f"remove {signing_dir(purpose)} and run again")
        tmp = keyring(purpose).with_name(".trusted.gpg.tmp")
        tmp.write_bytes(exported.stdout)
        tmp.replace(keyring(purpose))
    return fingerprint


def trust_vars() -> dict[str, object]:
    """Group vars of the lab's generated inventory: the lab's bundle key pinned."""
    return {"atlas_bundle_trusted_fingerprints": [ensure_key()], "atlas_bundle_keyring": str(keyring())}


def evidence_vars() -> dict[str, object]:
    """Group vars of the lab's generated inventory: the lab controller's evidence key, which signs every
    rollout's evidence pack (its public part: ``keyring(EVIDENCE)``, for ``atlasctl evidence verify --keyring``)."""
    return {"atlas_evidence_signing_key": ensure_key(EVIDENCE), "atlas_evidence_gnupg_home": str(homedir(EVIDENCE))}


def inventory_vars() -> dict[str, object]:
    """Every group var the lab's generated inventory carries for its keys: the bundle's, the evidence's."""
    return {**trust_vars(), **evidence_vars()}


def sign_bundle(root: Path) -> Path:
    """Sign ``root``/manifest.json with the lab key (``manifest.json.asc``), dated first as the lab's bundle
    (:func:`date_as_lab_bundle`)."""
    from atlasctl.bundle_sources import sign_manifest

    date_as_lab_bundle(Path(root))
    fingerprint = ensure_key()
    try:
        return sign_manifest(Path(root), fingerprint, homedir())
    finally:
        _stop_agent()


def date_as_lab_bundle(root: Path) -> None:
    """Give a scratch bundle (a lab test's or drill's, cut from the lab's bundle) the lab bundle's build time.
    Nodes refuse a bundle built before the one they accepted last (downgrade protection,
    module_utils/bundle_record.py): a scratch bundle dated now would make the node that ran it refuse the
    lab's own bundle afterwards. Dated as the lab's, it orders equal to it. Nothing changes when the lab has no
    bundle, or one without a build time."""
    from ansible_collections.atlas.serving.plugins.module_utils import manifest

    from atlaslab.paths import bundle_dir

    if root.resolve() == bundle_dir().resolve():
        return
    try:
        built = json.loads((bundle_dir() / "manifest.json").read_text(encoding="utf-8"))["built"]
        data = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        return
    if not isinstance(built, str) or data.get("built") == built:
        return
    text = manifest.render_manifest(data["files"], data.get("name"), data.get("release"), built)
    (root / "manifest.json").write_text(text, encoding="utf-8")
