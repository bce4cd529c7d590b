"""Move a bundle to nodes: resumable delta transfers (rsync over the inventory's SSH
settings), then a verification on each node against manifest.json.

rsync moves only what changed (size/mtime quick check, then its rolling-checksum delta),
keeps partial files in ``.rsync-partial`` so a broken transfer resumes, and deletes what
the bundle no longer has. ``manifest.json`` and its signature go last, so a node never holds a manifest
that describes files it does not have yet.
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


@dataclasses.dataclass(frozen=True)
class SshTarget:
    name: str
    host: str
    user: str = "root"
    port: int | None = None
    key: str | None = None
    common_args: str = ""

    def ssh_command(self) -> list[str]:
        cmd = ["ssh", "-o", "BatchMode=yes"]
        if self.port:
            cmd += ["-p", str(self.port)]
        if self.key:
            cmd += ["-i", self.key]
        return cmd + shlex.split(self.common_args)

    @property
    def remote(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host


def inventory_targets(inventory: Path, limit: str | None = None) -> list[SshTarget]:
    """Hosts of ``atlas_nodes`` (narrowed by ``limit``) with their SSH settings, via ansible-inventory."""
    return targets_from_inventory(shared.listing(inventory, limit))


def targets_from_inventory(data: dict) -> list[SshTarget]:
    hostvars = shared.hostvars(data)
    names = shared.group_hosts(data, shared.SERVING_GROUP)
    if not names:
        raise UsageError("the inventory has no hosts in group atlas_nodes (or --limit matched none)")
    out = []
    for name in sorted(names):
        hv = hostvars.get(name, {})
        out.append(SshTarget(name=name, host=str(hv.get("ansible_host", name)),
                             user=str(hv.get("ansible_user", "root")),
                             port=int(hv["ansible_port"]) if hv.get("ansible_port") else None,
                             key=hv.get("ansible_ssh_private_key_file"),
                             common_args=str(hv.get("ansible_ssh_common_args", ""))))
    return out


def rsync_argv(src: Path, target: SshTarget, dest: str, *, exclude_manifest: bool) -> list[str]:
    argv = ["rsync", "--archive", "--delete", "--delete-delay", "--partial", f"--partial-dir={PARTIAL_DIR}",
            "--itemize-changes", "--rsh", shlex.join(target.ssh_command()),
            "--rsync-path", f"mkdir -p {shlex.quote(dest)} && rsync",
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


def push(src: Path, targets: list[SshTarget], dest: str = DEFAULT_DEST) -> list[PushResult]:
    """Transfer ``src`` to ``dest`` on every target, files first, manifest.json last."""
    if not shutil.which("rsync"):
        raise EnvironmentProblem("rsync is not installed on the controller", fix="apt-get install rsync")
    read_manifest(src)  # refuse to push something that is not a bundle
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


def verify_on_nodes(inventory: Path, dest: str, limit: str | None) -> subprocess.CompletedProcess:
    """atlas.serving.model_verify on each node: every file under dest against dest/manifest.json."""
    tool = Path(sys.executable).with_name("ansible")
    args = (f"path={dest} manifest={dest}/{MANIFEST} stamp_file={dest}/.atlas-verified.json full=true")
    cmd = [str(tool if tool.exists() else "ansible"), "-i", str(inventory), limit or "atlas_nodes",
           "-m", "atlas.serving.model_verify", "-a", args, "-o"]
    return subprocess.run(cmd, text=True, capture_output=True, check=False)
