"""The lab's bundle signing key: one per machine, generated on first use, kept in the cache dir.

``<cache>/lab-signing/gnupg/`` is its own gpg homedir (0700) holding a no-passphrase ed25519
key; ``<cache>/lab-signing/trusted.gpg`` is the exported public key, the keyring the lab's
generated inventory pins (``atlas_bundle_keyring``, ``atlas_bundle_trusted_fingerprints``).
Every lab path that writes a bundle manifest signs it here: ``atlasctl bundle build`` into the
lab's bundle directory, and the lab tests' and drills' scratch bundles (``sign_bundle``).
A bank's signing key lives on its own signing station (docs/bundle-signing.md), never here.
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


def signing_dir() -> Path:
    return cache_dir() / "lab-signing"


def homedir() -> Path:
    return signing_dir() / "gnupg"


def keyring() -> Path:
    return signing_dir() / "trusted.gpg"


def _gpg(*args: str, text: bool = True) -> subprocess.CompletedProcess:
    gpg = shutil.which("gpg")
    if not gpg:
        raise EnvironmentProblem("gpg is not installed", fix="apt-get install gnupg gpgv (make host-deps)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GNUPG")}
    return subprocess.run([gpg, "--homedir", str(homedir()), "--no-options", "--batch", "--no-tty", *args],
                          env=env, capture_output=True, text=text, check=False, timeout=120)


def _stop_agent() -> None:
    gpgconf = shutil.which("gpgconf")
    if gpgconf:
        subprocess.run([gpgconf, "--homedir", str(homedir()), "--kill", "gpg-agent"],
                       capture_output=True, check=False, timeout=30)


def _secret_fingerprint() -> str:
    listing = _gpg("--with-colons", "--list-secret-keys")
    for line in listing.stdout.splitlines():
        if line.startswith("fpr:"):
            return line.split(":")[9]
    return ""


def ensure_key() -> str:
    """The lab key's fingerprint; the key and its exported keyring are created once per machine."""
    home = homedir()
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(signing_dir(), 0o700)
    os.chmod(home, 0o700)
    fingerprint = _secret_fingerprint()
    if not fingerprint:
        made = _gpg("--passphrase", "", "--quick-gen-key", UID, "ed25519", "sign", "never")
        _stop_agent()
        fingerprint = _secret_fingerprint()
        if not fingerprint:
            raise EnvironmentProblem(f"gpg could not create the lab signing key in {home}: "
                                     f"{made.stderr.strip()[-400:]}", fix=f"remove {signing_dir()} and run again")
    if not keyring().is_file():
        exported = _gpg("--export", fingerprint, text=False)
        if exported.returncode != 0 or not exported.stdout:
            raise EnvironmentProblem(f"gpg could not export the lab signing key {fingerprint} from {home}",
                                     fix=f"remove {signing_dir()} and run again")
        tmp = keyring().with_name(".trusted.gpg.tmp")
        tmp.write_bytes(exported.stdout)
        tmp.replace(keyring())
    return fingerprint


def trust_vars() -> dict[str, object]:
    """Group vars of the lab's generated inventory: the lab key pinned."""
    return {"atlas_bundle_trusted_fingerprints": [ensure_key()], "atlas_bundle_keyring": str(keyring())}


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
    from atlasctl.collection import module_utils
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
    text = module_utils("manifest").render_manifest(data["files"], data.get("name"), data.get("release"), built)
    (root / "manifest.json").write_text(text, encoding="utf-8")
