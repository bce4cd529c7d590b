"""Move a bundle to nodes: resumable delta transfers (rsync over the inventory's SSH
settings), then a verification on each node against manifest.json.

rsync moves only what changed (size/mtime quick check, then its rolling-checksum delta),
keeps partial files in ``.rsync-partial`` so a broken transfer resumes, and deletes what
the bundle no longer has. ``manifest.json`` and its signature go last, so a node never holds a manifest
that describes files it does not have yet.

What it writes on a node is root's alone (``--chown=root:root --chmod=go-w``, rsync running as root: the
SSH user root, or ``sudo -n`` with ``ansible_become``): the stages refuse a bundle another account could
change between their check of a file and its use (roles/bundle_trust, ``atlas.serving.root_only``).
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from atlasctl import inventory as shared
from atlasctl.bundle import MANIFEST, SIGNATURE, read_manifest
from atlasctl.errors import EnvironmentProblem, UsageError

DEFAULT_DEST = "/srv/atlas-bundle"
PARTIAL_DIR = ".rsync-partial"


def inventory_targets(inventory: Path, limit: str | None = None) -> list[shared.Target]:
    """Hosts of ``atlas_nodes`` (narrowed by ``limit``) with their SSH settings: the same settings and
    refusals as doctor's (atlasctl.inventory)."""
    return shared.targets(inventory, limit)


def as_root(target: shared.Target) -> str:
    """How the node side runs as root: '' for the SSH user root, ``sudo -n `` with ansible_become; any other
    user is refused (the bundle would be that user's to change, and the nodes refuse it)."""
    if target.user == "root":
        return ""
    if target.become:
        return "sudo -n "
    raise UsageError(f"{target.name}: bundle push connects as {target.user} without ansible_become, so the bundle "
                     f"would be {target.user}'s to change, and the nodes refuse such a bundle",
                     fix="set ansible_become: true (passwordless sudo) or ansible_user: root for the nodes")


def receiver_args(target: shared.Target, dest: str) -> list[str]:
    """The rsync options that make what a push writes on ``target`` root's alone: the node side runs as root
    (:func:`as_root`), owns every file and directory to root and takes group and other write away."""
    sudo = as_root(target)
    return ["--chown=root:root", "--chmod=go-w", "--rsync-path", f"{sudo}mkdir -p {shlex.quote(dest)} && {sudo}rsync"]


def rsync_argv(src: Path, target: shared.Target, dest: str, *, exclude_manifest: bool) -> list[str]:
    argv = ["rsync", "--archive", "--delete", "--delete-delay", "--partial", f"--partial-dir={PARTIAL_DIR}",
            "--itemize-changes", "--rsh", shlex.join(target.ssh_argv()), *receiver_args(target, dest),
            "--exclude", "/.atlas-*"]
    if exclude_manifest:
        argv += ["--exclude", f"/{MANIFEST}", "--exclude", f"/{SIGNATURE}"]
    return [*argv, f"{src}/", f"{target.remote}:{dest}/"]


@dataclasses.dataclass
class PushResult:
    host: str
    ok: bool
    files_sent: int = 0
    message: str = ""


def push(src: Path, targets: list[shared.Target], dest: str = DEFAULT_DEST) -> list[PushResult]:
    """Transfer ``src`` to ``dest`` on every target, files first, manifest.json last."""
    if not shutil.which("rsync"):
        raise EnvironmentProblem("rsync is not installed on the controller", fix="apt-get install rsync")
    read_manifest(src)  # refuse to push something that is not a bundle
    for target in targets:
        as_root(target)  # every node reachable as root before the first transfer
    results = []
    for target in targets:
        sent = 0
        for exclude_manifest in (True, False):
            argv = rsync_argv(src, target, dest, exclude_manifest=exclude_manifest)
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


def node_verify_args(dest: str) -> str:
    """The arguments of atlas.serving.model_verify that verify a bundle at ``dest`` on a node."""
    return f"path={dest} manifest={dest}/{MANIFEST} stamp_file={dest}/.atlas-verified.json full=true links=refuse"


def verify_on_nodes(inventory: Path, dest: str, limit: str | None) -> subprocess.CompletedProcess:
    """atlas.serving.model_verify on each node: every file under dest against dest/manifest.json, links
    refused, as ``atlasctl bundle verify`` checks the bundle here (the same module_utils verifier)."""
    tool = Path(sys.executable).with_name("ansible")
    args = node_verify_args(dest)
    cmd = [str(tool if tool.exists() else "ansible"), "-i", str(inventory), limit or "atlas_nodes",
           "-m", "atlas.serving.model_verify", "-a", args, "-o"]
    return subprocess.run(cmd, text=True, capture_output=True, check=False)
