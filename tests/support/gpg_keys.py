"""Throwaway GnuPG keys for the tests: one signing homedir, keys made on demand (no passphrase), exported
to keyrings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


class Keys:
    """One signing homedir, keys made on demand (no passphrase), exported to keyrings."""

    def __init__(self, home: Path, copy_of: Path | None = None):
        self.home = home
        if copy_of:
            shutil.copytree(copy_of, home, ignore=shutil.ignore_patterns("S.*"))
        else:
            home.mkdir(mode=0o700, parents=True)

    def gpg(self, *args: str, faked: str | None = None, text: bool = True) -> subprocess.CompletedProcess:
        argv = ["gpg", "--homedir", str(self.home), "--batch", "--no-tty", "--passphrase", ""]
        argv += ["--faked-system-time", faked] if faked else []
        proc = subprocess.run([*argv, *args], capture_output=True, text=text, check=False)
        assert proc.returncode == 0, proc.stderr
        return proc

    def make(self, uid: str, expire: str = "never", faked: str | None = None) -> str:
        self.gpg("--quick-gen-key", uid, "ed25519", "sign", expire, faked=faked)
        listing = self.gpg("--with-colons", "--list-keys", uid).stdout
        return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))

    def sign(self, root: Path, uid: str, *extra: str, faked: str | None = None) -> None:
        self.gpg("--yes", "--local-user", uid, "--armor", "--detach-sign", *extra, "--output",
                 str(root / "manifest.json.asc"), str(root / "manifest.json"), faked=faked)

    def revoke(self, fpr: str) -> None:
        cert = (self.home / "openpgp-revocs.d" / f"{fpr}.rev").read_text().replace(":-----BEGIN", "-----BEGIN")
        proc = subprocess.run(["gpg", "--homedir", str(self.home), "--batch", "--import"], input=cert,
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr

    def export(self, path: Path, *uids: str) -> Path:
        path.write_bytes(self.gpg("--export", *uids, text=False).stdout)
        return path

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"], check=False,
                       capture_output=True)


def one_installer_bundle(root: Path) -> Path:
    """The smallest bundle the signature checks need: one CANN installer and the manifest (unsigned)."""
    from atlasctl import bundle

    (root / "cann").mkdir(parents=True)
    (root / "cann" / "Ascend-cann-toolkit_8.5.0_linux-x86_64.run").write_bytes(b"#!/bin/sh\necho good\n")
    bundle.write_manifest(root, "t")
    return root
