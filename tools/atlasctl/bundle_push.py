"""Move a bundle to nodes: resumable delta transfers (rsync over the inventory's SSH
settings), then a verification on each node against manifest.json.

rsync moves only what changed (size/mtime quick check, then its rolling-checksum delta),
keeps partial files in ``.rsync-partial`` so a broken transfer resumes, and deletes what
the bundle no longer has. ``manifest.json`` and its signature go last, so a node never holds a manifest
that describes files it does not have yet; what goes is the bytes whose signature was checked (the
manifest's one read, :class:`atlasctl.bundle.Manifest`), from a private copy, never the file read again,
and the nodes verify the bundle against exactly those bytes (``manifest_sha256``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from atlasctl import inventory as shared
from atlasctl.bundle import MANIFEST, SIGNATURE, Manifest
from atlasctl.errors import EnvironmentProblem

DEFAULT_DEST = "/srv/atlas-bundle"
PARTIAL_DIR = ".rsync-partial"


def inventory_targets(inventory: Path, limit: str | None = None) -> list[shared.Target]:
    """Hosts of ``atlas_nodes`` (narrowed by ``limit``) with their SSH settings: the same settings and
    refusals as doctor's (atlasctl.inventory)."""
    return shared.targets(inventory, limit)


def rsync_argv(src: Path, target: shared.Target, dest: str, *, part: str, delete: bool = True) -> list[str]:
    """rsync of ``part`` of the bundle ``src`` to ``dest`` on ``target``: ``files`` (everything but manifest.json
    and its signature) or ``manifest`` (only those two, from the private copy of the verified bytes). With
    ``delete``, what ``dest`` holds of that part and ``src`` does not is removed (never ``.atlas-*``, the
    node's own files there)."""
    argv = ["rsync", "--archive", "--partial", f"--partial-dir={PARTIAL_DIR}",
            "--itemize-changes", "--rsh", shlex.join(target.ssh_argv()),
            "--rsync-path", f"mkdir -p {shlex.quote(dest)} && rsync",
            "--exclude", "/.atlas-*"]
    if delete:
        argv[2:2] = ["--delete", "--delete-delay"]
    if part == "files":
        argv += ["--exclude", f"/{MANIFEST}", "--exclude", f"/{SIGNATURE}"]
    else:
        argv += ["--include", f"/{MANIFEST}", "--include", f"/{SIGNATURE}", "--exclude", "*"]
    return [*argv, f"{src}/", f"{target.remote}:{dest}/"]


def _verified_copy(manifest: Manifest, folder: Path) -> Path:
    """The manifest's verified bytes and its signature, written into a fresh private folder, with the modes
    and times the bundle's own have (rsync's quick check then sees an unchanged manifest as unchanged, and
    the bundle directory on the node keeps the mode and time the files pass gave it)."""
    for name, data in ((MANIFEST, manifest.raw), (SIGNATURE, manifest.signature), (".", None)):
        path = folder / name
        if data is not None:
            path.write_bytes(data)
        elif name != ".":
            continue
        try:
            st = os.stat(manifest.root / name)
        except OSError:
            os.chmod(path, 0o755 if name == "." else 0o644)
            continue
        os.chmod(path, st.st_mode & 0o7755)  # the bundle's own modes, never writable by group or others
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return folder


@dataclasses.dataclass
class PushResult:
    host: str
    ok: bool
    files_sent: int = 0
    message: str = ""


def push(manifest: Manifest, targets: list[shared.Target], dest: str = DEFAULT_DEST) -> list[PushResult]:
    """Transfer the bundle ``manifest.root`` to ``dest`` on every target: its files first, then the manifest
    as it was verified (``manifest``: the one read whose signature was checked) and its signature."""
    if not shutil.which("rsync"):
        raise EnvironmentProblem("rsync is not installed on the controller", fix="apt-get install rsync")
    results = []
    with tempfile.TemporaryDirectory(prefix="atlas-push-") as tmp:
        verified = _verified_copy(manifest, Path(tmp))
        for target in targets:
            sent = 0
            for part, src in (("files", manifest.root), ("manifest", verified)):
                argv = rsync_argv(src, target, dest, part=part)
                proc = subprocess.run(argv, text=True, capture_output=True, check=False)
                if proc.returncode != 0:
                    results.append(PushResult(target.name, False, sent,
                                              f"rsync exited {proc.returncode}: {proc.stderr.strip()[-400:]}"
                                              " (run again: the transfer resumes)"))
                    break
                sent += sum(1 for line in proc.stdout.splitlines() if line[:2] in ("<f", ">f"))
            else:
                results.append(PushResult(target.name, True, sent))
    return results


def node_verify_args(dest: str, manifest_sha256: str | None = None) -> str:
    """The arguments of atlas.serving.model_verify that verify a bundle at ``dest`` on a node (against the
    manifest whose sha256 is ``manifest_sha256``, the verified one, when given)."""
    args = f"path={dest} manifest={dest}/{MANIFEST} stamp_file={dest}/.atlas-verified.json full=true links=refuse"
    return args + (f" manifest_sha256={manifest_sha256}" if manifest_sha256 else "")


def verify_on_nodes(inventory: Path, dest: str, limit: str | None,
                    manifest_sha256: str | None = None) -> subprocess.CompletedProcess:
    """atlas.serving.model_verify on each node: every file under dest against dest/manifest.json, links
    refused, as ``atlasctl bundle verify`` checks the bundle here (the same module_utils verifier); the
    node's manifest must be the verified bytes (``manifest_sha256``)."""
    tool = Path(sys.executable).with_name("ansible")
    args = node_verify_args(dest, manifest_sha256)
    cmd = [str(tool if tool.exists() else "ansible"), "-i", str(inventory), limit or "atlas_nodes",
           "-m", "atlas.serving.model_verify", "-a", args, "-o"]
    return subprocess.run(cmd, text=True, capture_output=True, check=False)
