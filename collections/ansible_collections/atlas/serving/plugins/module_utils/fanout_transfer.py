# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-out staging (module_utils/fanout_stage.py): the transfer from one source, with rsync. The pull of a tree
(times and permissions, resumable through ``--partial-dir``, what the source does not hold deleted but never the
node's own files, hard links from ``link_dest`` on the tree's own filesystem), the outcome of a transfer (ok,
partial, busy, unavailable), and a bundle's ``manifest.json``: fetched from the source, refused unless its bytes have
the verified manifest's sha256, and put in place last.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from ansible_collections.atlas.serving.plugins.module_utils.fanout_tree import (
    IO_TIMEOUT_S,
    MANIFEST,
    OWN_FILES,
    PARTIAL_DIR,
    SIGNATURE,
    Source,
    Tree,
    incoming_dir,
)
from ansible_collections.atlas.serving.plugins.module_utils.fanout_verify import verified_manifest
from ansible_collections.atlas.serving.plugins.module_utils.model_space import same_mount

CONNECT_TIMEOUT_S = 15
_BYTES_RECEIVED = re.compile(r"^Total bytes received: ([\d,.]+)", re.MULTILINE)
_BUSY = "max connections"


def _client(source: Source, bind: str) -> list[str]:
    """Options of a connection to a peer's server: a connect timeout, and the node's own address as the
    connection's source (what the peer's ``hosts allow`` and firewall admit)."""
    if source.path:
        return []
    return [f"--contimeout={CONNECT_TIMEOUT_S}"] + ([f"--address={bind}"] if bind else [])


def pull_argv(tree: Tree, source: Source, port: int, rsync: str = "rsync", bind: str = "") -> list[str]:
    """The rsync command that brings ``tree`` from ``source``: times and permissions (``tree.chmod``), resumable,
    what the source does not hold deleted (``tree.delete``) but never the node's own files or a manifest;
    ``bind``: the node's address, the source of its connections to peers."""
    argv = [rsync, "--recursive", "--times", "--perms", f"--chmod={tree.chmod}", "--partial",
            f"--partial-dir={PARTIAL_DIR}", "--stats", f"--timeout={IO_TIMEOUT_S}", "--exclude", OWN_FILES]
    if tree.manifest_from_source:  # it comes separately, and goes in last
        argv += ["--exclude", f"/{MANIFEST}", "--exclude", f"/{SIGNATURE}"]
    argv += _client(source, bind)
    if tree.delete:
        argv += ["--delete", "--delete-delay"]
    argv += [f"--link-dest={d}" for d in linkable(tree)]
    return [*argv, source.url(tree.name, port), tree.path.rstrip("/") + "/"]


def linkable(tree: Tree) -> list[str]:
    """Of ``tree.link_dest``, the directories on the tree's own filesystem: rsync hard-links an unchanged file from
    there (one copy on the node). One on another filesystem is left out: rsync would copy the file from it (a
    read of the site's share, where the plan has a peer send it)."""
    return [d for d in tree.link_dest if d and os.path.isdir(d) and same_mount(d, tree.path)]


def classify(proc: subprocess.CompletedProcess) -> str:
    """ok, partial (some files did not come), busy (the server's max connections) or unavailable."""
    if proc.returncode == 0:
        return "ok"
    if proc.returncode in (23, 24):
        return "partial"
    if proc.returncode == 5 and _BUSY in (proc.stderr or ""):
        return "busy"
    return "unavailable"


def why_failed(proc: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (proc.stderr or "").splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("@ERROR")), lines[0] if lines else "")
    return f"rsync exited {proc.returncode}: {said[:300]}".rstrip(": ")


def received_bytes(proc: subprocess.CompletedProcess) -> int:
    found = _BYTES_RECEIVED.search(proc.stdout or "")
    return int(re.sub(r"[,.]", "", found.group(1))) if found else 0


def fetch_manifest(tree: Tree, source: Source, port: int, server_dir: str, rsync: str,
                   run=subprocess.run, bind: str = "") -> tuple[str, str, str]:
    """(manifest path or '', kind of failure or '', why): the source's manifest and signature into this node's
    incoming directory; bytes without the verified manifest's sha256 are refused (kind ``refused``)."""
    incoming = incoming_dir(server_dir, tree)
    os.makedirs(incoming, mode=0o700, exist_ok=True)
    url = source.url(tree.name, port)
    argv = [rsync, "--times", "--stats", f"--timeout={IO_TIMEOUT_S}", *_client(source, bind)]
    proc = run([*argv, url + MANIFEST, url + SIGNATURE, incoming + "/"], capture_output=True, text=True, check=False)
    kind = classify(proc)
    path = os.path.join(incoming, MANIFEST)
    if kind in ("busy", "unavailable") or not os.path.isfile(path):
        return "", kind if kind in ("busy", "unavailable") else "unavailable", why_failed(proc)
    if not verified_manifest(path, tree):
        os.unlink(path)
        return "", "refused", f"its {MANIFEST} is not the verified one (sha256 {tree.manifest_sha256})"
    return path, "", ""  # rsync's 23 without a signature: an unsigned bundle has none


def install_manifest(tree: Tree, server_dir: str, manifest: str) -> bool:
    """Put the verified manifest (and its signature, when the source had one) in place in the tree, the
    signature first and the manifest last, each by an atomic rename. True when something changed."""
    incoming = incoming_dir(server_dir, tree)
    if os.path.dirname(manifest) != incoming:
        return False
    changed = False
    for name in (SIGNATURE, MANIFEST):
        src, dst = os.path.join(incoming, name), os.path.join(tree.path, name)
        if not os.path.isfile(src):
            if name == SIGNATURE and os.path.lexists(dst):
                os.unlink(dst)
                changed = True
            continue
        tmp = os.path.join(tree.path, f".atlas-{name}.tmp")
        shutil.copy2(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
        changed = True
    shutil.rmtree(incoming, ignore_errors=True)
    return changed
