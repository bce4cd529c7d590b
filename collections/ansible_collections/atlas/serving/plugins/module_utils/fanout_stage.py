# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-out staging on a node (docs/fleet-scale.md): receive a tree of files (the bundle, or a model version)
from a peer that verified it, verify every file against the signed manifest, and serve the tree to the node's
planned receivers only once all of it verified.

Receiving (:func:`pull`). The tree is first verified as it is (md5 + sha256 in one read, stamps: the code of
``model_verify``, ``tree_check.check_tree``): a complete tree moves nothing. Otherwise the sources are tried in
order (the plan's parent, its fallbacks, then the origin when the node can read it; an origin on the tree's own
mount first, since its files are hard-linked, one copy on the node, model_space.py): rsync pulls the tree
(``--partial-dir``: a broken transfer resumes), then the tree is verified again. A file that fails verification
is deleted and the source that sent it is never used again in this pull; the next source sends it again. A
source that cannot be reached, or does not serve the tree, is skipped; one that is busy (its server's
``max connections``) is tried again after the others, until ``wait_s``. A bundle's ``manifest.json`` comes
from the source too: its bytes must have the verified manifest's sha256 (else the source is refused), and it
is put in place last, once every file it lists verified, as ``atlasctl bundle push`` does.

Serving (:func:`serve`, :func:`mark_ready`, :func:`stop`). A read-only rsync daemon, bound to the node's
backend address, whose configuration lists a tree only once a pull (or a verification that needed nothing)
left it complete and verified on this node; rsync reads its configuration again for each connection.
``hosts allow`` holds the node's planned receivers and nothing else; the node's nftables table
(roles/firewall) admits them to the port through two sets, filled here with a timeout and flushed by
:func:`stop`; the daemon itself ends after ``lifetime_s`` whatever happens to the run that started it.
The node's own files in a tree (``/.atlas-*``, the stamps) are neither served nor deleted.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

from ansible_collections.atlas.serving.plugins.module_utils.checksums import (
    STATUS_EXTRA,
    STATUS_MISSING,
    STATUS_OK,
    atomic_write_text,
    linked_trees,
)
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError, load_expected, read_text
from ansible_collections.atlas.serving.plugins.module_utils.model_space import same_mount
from ansible_collections.atlas.serving.plugins.module_utils.tree_check import check_tree

SERVER_DIR = "/run/atlas-fanout"
DEFAULT_PORT = 8873
DEFAULT_MAX_CONNECTIONS = 2
DEFAULT_LIFETIME_S = 6 * 3600
DEFAULT_WAIT_S = 900
PARTIAL_DIR = ".rsync-partial"
OWN_FILES = "/.atlas-*"  # the node's own files in a tree: stamps, a manifest on its way in
MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.asc"
CONNECT_TIMEOUT_S = 15
IO_TIMEOUT_S = 300
RETRY_S = 2.0
# The node firewall (roles/firewall, plugin_utils/firewall.py): table inet atlas, and two sets of the peers a
# node's staging server admits to its port, with a timeout per element.
NFT_TABLE = "inet atlas"
NFT_SETS = (("ip", "atlas_fanout4", "ipv4_addr"), ("ip6", "atlas_fanout6", "ipv6_addr"))
NFT_COMMENT = "fan-out staging: the node's planned receivers, while it stages"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BYTES_RECEIVED = re.compile(r"^Total bytes received: ([\d,.]+)", re.MULTILINE)
_BUSY = "max connections"


class StageError(Exception):
    """The staging could not be done; the message names the tree, what is wrong and the fix; ``result``: what a
    pull did before it gave up (sources tried, refused)."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result or {}


@dataclass(frozen=True)
class Tree:
    """A tree this node stages: where it lives, what it must hold (the manifest, restricted to ``prefix``, whose
    bytes must have ``manifest_sha256``) and how it is written."""

    name: str
    path: str
    manifest_sha256: str
    manifest: str = ""  # the manifest on this node; '' for a bundle: it comes from the source (manifest_from_source)
    prefix: str = ""
    stamp_file: str = ""
    links: str = "follow"
    linked_from: tuple = ()
    chmod: str = "go-w"
    delete: bool = True
    link_dest: tuple = ()

    @property
    def manifest_from_source(self) -> bool:
        return not self.manifest


@dataclass(frozen=True)
class Source:
    """Where a tree can come from: a peer's server (``address``) or a directory of this node (``path``)."""

    name: str
    address: str = ""
    path: str = ""

    def url(self, tree: str, port: int) -> str:
        if self.path:
            return self.path.rstrip("/") + "/"
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"rsync://{host}:{port}/{tree}/"


@dataclass
class Verdict:
    good: list = field(default_factory=list)
    bad: list = field(default_factory=list)  # FileResult of files that fail: deleted before the next pull
    missing: list = field(default_factory=list)
    extra: list = field(default_factory=list)
    bytes_read: int = 0
    stamps_written: bool = False

    @property
    def complete(self) -> bool:
        return not (self.bad or self.missing or self.extra)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise StageError(f"tree name {name!r}: use letters, digits, '.', '_' and '-' (at most 128), it names the "
                         "tree on the staging servers")
    return name


def check_address(value: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(str(value).strip("[]")))
    except ValueError:
        raise StageError(f"{what} {value!r} is not an IP address: the staging server binds to it and the firewall "
                         "admits addresses (set fanout_address, or ansible_host, to the node's IP address)") from None


# --- verification ------------------------------------------------------------------------------------------

def verify(tree: Tree, manifest: str, write_stamps: bool = True) -> Verdict:
    """``tree`` against ``manifest`` (the bytes must have ``tree.manifest_sha256``), as ``model_verify`` checks it:
    md5 + sha256 in one read of each file no stamp vouches for. A tree that does not exist yet lacks every file."""
    verdict = Verdict()
    if not os.path.isdir(tree.path):
        expected = load_expected([manifest], prefix=tree.prefix, trusted={manifest: tree.manifest_sha256})
        verdict.missing = sorted(expected)
        return verdict
    report, _stamps = check_tree(tree.path, manifest, prefix=tree.prefix, manifest_sha256=tree.manifest_sha256,
                                 stamp_file=tree.stamp_file or None, links=tree.links,
                                 linked_from=list(tree.linked_from), write_stamps=write_stamps)
    verdict.bytes_read, verdict.stamps_written = report.bytes_read, report.stamps_written
    for result in report.results:
        if result.status == STATUS_OK:
            verdict.good.append(result.path)
        elif result.status == STATUS_MISSING:
            verdict.missing.append(result.path)
        elif result.status == STATUS_EXTRA:
            if result.path.startswith(PARTIAL_DIR + "/") or result.path.startswith(".atlas-"):
                continue  # a transfer's partial file, the node's own file
            if tree.manifest_from_source and result.path in (MANIFEST, SIGNATURE):
                continue  # the manifest in place: replaced last
            verdict.extra.append(result.path)
        else:
            verdict.bad.append(result)
    return verdict


def _remove(tree: Tree, rels) -> None:
    for rel in rels:
        path = os.path.join(tree.path, rel)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass


# --- receiving -----------------------------------------------------------------------------------------------

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


def _classify(proc: subprocess.CompletedProcess) -> str:
    """ok, partial (some files did not come), busy (the server's max connections) or unavailable."""
    if proc.returncode == 0:
        return "ok"
    if proc.returncode in (23, 24):
        return "partial"
    if proc.returncode == 5 and _BUSY in (proc.stderr or ""):
        return "busy"
    return "unavailable"


def _why(proc: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (proc.stderr or "").splitlines() if line.strip()]
    said = next((line for line in lines if line.startswith("@ERROR")), lines[0] if lines else "")
    return f"rsync exited {proc.returncode}: {said[:300]}".rstrip(": ")


def _received(proc: subprocess.CompletedProcess) -> int:
    found = _BYTES_RECEIVED.search(proc.stdout or "")
    return int(re.sub(r"[,.]", "", found.group(1))) if found else 0


def _incoming(server_dir: str, tree: Tree) -> str:
    return os.path.join(server_dir, "incoming", tree.name)


def _manifest_here(tree: Tree, server_dir: str) -> str:
    """The manifest to verify ``tree`` against, if this node already holds the verified bytes: the tree's own
    (``tree.manifest``, or the one in place in a bundle), or one a pull brought in; '' when none."""
    if tree.manifest:
        candidates = [tree.manifest]
    else:
        candidates = [os.path.join(tree.path, MANIFEST), os.path.join(_incoming(server_dir, tree), MANIFEST)]
    for path in candidates:
        if os.path.isfile(path) and not os.path.islink(path) and _verified_manifest(path, tree):
            return path
    if tree.manifest:
        raise StageError(f"{tree.manifest}: not the verified manifest (sha256 {tree.manifest_sha256}); verify the "
                         "bundle's signature first (roles/bundle_trust), then stage from it")
    return ""


def _verified_manifest(path: str, tree: Tree) -> bool:
    """Whether the bytes at ``path`` are the manifest whose signature was verified (``tree.manifest_sha256``)."""
    try:
        read_text(path, tree.manifest_sha256)
    except ManifestError:
        return False
    return True


def _fetch_manifest(tree: Tree, source: Source, port: int, server_dir: str, rsync: str,
                    run=subprocess.run, bind: str = "") -> tuple[str, str, str]:
    """(manifest path or '', kind of failure or '', why): the source's manifest and signature into this node's
    incoming directory; bytes without the verified manifest's sha256 are refused (kind ``refused``)."""
    incoming = _incoming(server_dir, tree)
    os.makedirs(incoming, mode=0o700, exist_ok=True)
    url = source.url(tree.name, port)
    argv = [rsync, "--times", "--stats", f"--timeout={IO_TIMEOUT_S}", *_client(source, bind)]
    proc = run([*argv, url + MANIFEST, url + SIGNATURE, incoming + "/"], capture_output=True, text=True, check=False)
    kind = _classify(proc)
    path = os.path.join(incoming, MANIFEST)
    if kind in ("busy", "unavailable") or not os.path.isfile(path):
        return "", kind if kind in ("busy", "unavailable") else "unavailable", _why(proc)
    if not _verified_manifest(path, tree):
        os.unlink(path)
        return "", "refused", f"its {MANIFEST} is not the verified one (sha256 {tree.manifest_sha256})"
    return path, "", ""  # rsync's 23 without a signature: an unsigned bundle has none


def _install_manifest(tree: Tree, server_dir: str, manifest: str) -> bool:
    """Put the verified manifest (and its signature, when the source had one) in place in the tree, the
    signature first and the manifest last, each by an atomic rename. True when something changed."""
    incoming = _incoming(server_dir, tree)
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


def check(tree: Tree, *, server_dir: str = SERVER_DIR, check_mode: bool = False) -> dict:
    """Whether ``tree`` is complete and verified on this node as it is (stamps; only files no stamp vouches for
    are read); a complete one is listed on the node's server. Nothing is pulled, nothing deleted.
    Returns ``{changed, complete, verified, lacking: [files missing, failing or extra]}``."""
    check_name(tree.name)
    manifest = _manifest_here(tree, server_dir)
    if not manifest:
        return {"changed": False, "complete": False, "verified": 0, "lacking": [MANIFEST]}
    verdict = verify(tree, manifest, write_stamps=not check_mode)
    changed = verdict.stamps_written
    if verdict.complete and not check_mode:
        changed = _install_manifest(tree, server_dir, manifest) or changed
        mark_ready(server_dir, tree)
    lacking = verdict.missing + [b.path for b in verdict.bad] + verdict.extra
    return {"changed": changed, "complete": verdict.complete, "verified": len(verdict.good), "lacking": lacking[:20]}


def pull(tree: Tree, sources: list[Source], *, port: int = DEFAULT_PORT, server_dir: str = SERVER_DIR,
         address: str = "", wait_s: float = DEFAULT_WAIT_S, rsync: str = "rsync", run=subprocess.run,
         sleep=time.sleep, clock=time.monotonic, check_mode: bool = False) -> dict:
    """Make ``tree`` complete and verified on this node from ``sources`` (in order), then mark it ready to serve;
    ``address``: the node's own (its connections to peers come from it).

    Returns ``{changed, source, verified, bytes_received, tried: [{name, outcome, why}], refused: {source: [files
    or why]}}``; raises StageError naming what is still missing or bad and why each source was left."""
    check_name(tree.name)
    manifest = _manifest_here(tree, server_dir)
    verdict = verify(tree, manifest, write_stamps=not check_mode) if manifest else None
    result = {"changed": False, "source": "", "verified": 0, "bytes_received": 0, "tried": [], "refused": {}}
    if verdict is not None and verdict.complete:
        result["changed"] = _install_manifest(tree, server_dir, manifest) if not check_mode else False
        result["verified"] = len(verdict.good)
        if not check_mode:
            mark_ready(server_dir, tree)
        return result
    if check_mode:
        result["changed"] = True
        result["missing"] = (verdict.missing + [b.path for b in verdict.bad]) if verdict else ["everything"]
        return result
    os.makedirs(tree.path, mode=0o755, exist_ok=True)
    bind = check_address(address, "fanout_address") if address else ""
    # an origin on the tree's own mount first: its files are hard-linked (one copy), nothing crosses the network
    pending = sorted(sources, key=lambda s: not (s.path and same_mount(s.path, tree.path)))
    deadline = clock() + wait_s
    while pending:
        busy = []
        for source in list(pending):
            if verdict is not None and verdict.bad:
                _remove(tree, [b.path for b in verdict.bad])
            if not manifest:
                manifest, kind, why = _fetch_manifest(tree, source, port, server_dir, rsync, run, bind)
                if kind == "busy":
                    busy.append(source)
                    continue
                if kind:
                    pending.remove(source)
                    result["tried"].append({"name": source.name, "outcome": kind, "why": why})
                    if kind == "refused":
                        result["refused"][source.name] = [why]
                    continue
                verdict = verify(tree, manifest)
                if verdict.complete:
                    result["source"] = source.name
                    break
                _remove(tree, [b.path for b in verdict.bad])
            proc = run(pull_argv(tree, source, port, rsync, bind), capture_output=True, text=True, check=False)
            kind = _classify(proc)
            if kind == "busy":
                busy.append(source)
                continue
            result["bytes_received"] += _received(proc)
            if kind == "unavailable":
                pending.remove(source)
                result["tried"].append({"name": source.name, "outcome": kind, "why": _why(proc)})
                continue
            result["changed"] = True
            before = set(verdict.good)
            verdict = verify(tree, manifest)
            pending.remove(source)
            refused = [b.path for b in verdict.bad if b.path not in before]
            if refused:
                result["refused"][source.name] = refused
                result["tried"].append({"name": source.name, "outcome": "refused",
                                        "why": "; ".join(b.describe() for b in verdict.bad)[:600]})
            else:
                result["tried"].append({"name": source.name, "outcome": "complete" if verdict.complete else kind,
                                        "why": "" if verdict.complete else _why(proc)})
            if verdict.complete:
                result["source"] = source.name
                break
        if verdict is not None and verdict.complete:
            break
        if not busy or clock() >= deadline:
            for source in busy:
                result["tried"].append({"name": source.name, "outcome": "busy",
                                        "why": f"still at its max connections after {wait_s:.0f} s"})
            break
        pending = [s for s in pending if s in busy]
        sleep(RETRY_S)
    if verdict is None or not verdict.complete:
        if verdict is not None and verdict.bad:
            _remove(tree, [b.path for b in verdict.bad])
        raise StageError(_failure(tree, verdict, result), result)
    result["changed"] = _install_manifest(tree, server_dir, manifest) or result["changed"]
    result["verified"] = len(verdict.good)
    mark_ready(server_dir, tree)
    return result


def _failure(tree: Tree, verdict: Verdict | None, result: dict) -> str:
    if verdict is None:
        lacking = f"no source gave its {MANIFEST} with sha256 {tree.manifest_sha256}"
    else:
        names = verdict.missing + [b.path for b in verdict.bad] + verdict.extra
        lacking = f"{len(names)} file(s) not verified ({', '.join(names[:5])}{' ...' if len(names) > 5 else ''})"
    tried = "; ".join(f"{t['name']}: {t['outcome']}{' (' + t['why'] + ')' if t['why'] else ''}"
                      for t in result["tried"]) or "no source to pull from"
    return (f"tree {tree.name} at {tree.path}: {lacking}. Sources: {tried}. Nothing unverified is served or used; "
            "run the staging again (it resumes), or from the origin")


# --- serving -------------------------------------------------------------------------------------------------

def _ready_dir(server_dir: str) -> str:
    return os.path.join(server_dir, "ready")


def mark_ready(server_dir: str, tree: Tree) -> None:
    """``tree`` is complete and verified here: list it in the server's configuration (when a server runs)."""
    os.makedirs(_ready_dir(server_dir), mode=0o700, exist_ok=True)
    atomic_write_text(os.path.join(_ready_dir(server_dir), tree.name + ".json"),
                      json.dumps({"path": tree.path, "manifest_sha256": tree.manifest_sha256}) + "\n", 0o600)
    if os.path.isfile(os.path.join(server_dir, "server.json")):
        write_config(server_dir)


def ready_trees(server_dir: str) -> dict[str, str]:
    out = {}
    try:
        names = sorted(os.listdir(_ready_dir(server_dir)))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json") or not _NAME.fullmatch(name[:-5]):
            continue
        try:
            with open(os.path.join(_ready_dir(server_dir), name), encoding="utf-8") as handle:
                out[name[:-5]] = json.load(handle)["path"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def render_config(server_dir: str, settings: dict, trees: dict[str, str], as_root: bool) -> str:
    """rsyncd.conf of the node's staging server: read-only, bound to ``address``, ``hosts allow`` the receivers
    only, one module per ready tree, the node's own files excluded."""
    lines = ["# The node's fan-out staging server (module_utils/fanout_stage.py, docs/fleet-scale.md): read-only,",
             "# only trees verified on this node, only to the node's planned receivers.",
             f"address = {settings['address']}", f"port = {int(settings['port'])}",
             f"lock file = {os.path.join(server_dir, 'rsyncd.lock')}",
             f"log file = {os.path.join(server_dir, 'rsyncd.log')}",
             "read only = yes", "write only = no", "list = no", "reverse lookup = no", "numeric ids = yes",
             f"max connections = {int(settings['max_connections'])}", f"timeout = {IO_TIMEOUT_S}",
             f"hosts allow = {' '.join(settings['peers']) or '0.0.0.0/32'}", "hosts deny = *",
             f"exclude = {OWN_FILES} /{PARTIAL_DIR}/"]
    if as_root:
        lines += ["use chroot = yes", "uid = root", "gid = root"]
    else:
        lines += ["use chroot = no"]
    for name, path in sorted(trees.items()):
        lines += ["", f"[{name}]", f"path = {path}", "comment = verified on this node against the signed manifest"]
    return "\n".join(lines) + "\n"


def write_config(server_dir: str) -> str:
    with open(os.path.join(server_dir, "server.json"), encoding="utf-8") as handle:
        settings = json.load(handle)
    path = os.path.join(server_dir, "rsyncd.conf")
    atomic_write_text(path, render_config(server_dir, settings, ready_trees(server_dir), os.geteuid() == 0), 0o600)
    return path


def _server_pid(server_dir: str) -> int | None:
    """The pid (and process group) of the server this directory started, when it still runs: the one its pid file
    names, else any process group leader started on its configuration (a pid file lost in between)."""
    found = _server_groups(server_dir)
    try:
        with open(os.path.join(server_dir, "server.pid"), encoding="utf-8") as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        pid = None
    return pid if pid in found else (found[0] if found else None)


def _server_groups(server_dir: str) -> list[int]:
    """Process groups whose leader runs on this directory's configuration (``--config=<server_dir>/rsyncd.conf``)."""
    wanted = f"--config={os.path.join(server_dir, 'rsyncd.conf')}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().split(b"\0")
            pid = int(entry)
            if wanted in cmdline and os.getpgid(pid) == pid:
                found.append(pid)
        except (OSError, ValueError):
            continue
    return sorted(found)


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def serve(server_dir: str = SERVER_DIR, *, address: str, port: int = DEFAULT_PORT, peers=(),
          max_connections: int = DEFAULT_MAX_CONNECTIONS, lifetime_s: int = DEFAULT_LIFETIME_S, firewall: bool = True,
          rsync: str = "rsync", nft: str = "nft", clock=time.monotonic, sleep=time.sleep) -> dict:
    """Start (or keep) the node's staging server for ``peers`` and admit them through the firewall. Trees are
    added as they become ready (:func:`mark_ready`). Returns ``{changed, pid, address, port, peers, firewall}``."""
    address = check_address(address, "fanout_address")
    peers = sorted({check_address(p, "a receiver's address") for p in peers})
    if not 1 <= int(port) <= 65535 or int(max_connections) < 1 or int(lifetime_s) < 1:
        raise StageError(f"port {port}, max_connections {max_connections} and lifetime_s {lifetime_s} must be a TCP "
                         "port and positive whole numbers")
    os.makedirs(server_dir, mode=0o700, exist_ok=True)
    settings = {"address": address, "port": int(port), "peers": peers, "max_connections": int(max_connections)}
    path = os.path.join(server_dir, "server.json")
    try:
        with open(path, encoding="utf-8") as handle:
            before = json.load(handle)
    except (OSError, ValueError):
        before = None
    pid = _server_pid(server_dir)
    if pid and before and (before.get("address"), before.get("port")) != (address, int(port)):
        _kill(pid)
        pid = None
    atomic_write_text(path, json.dumps(settings) + "\n", 0o600)
    conf = write_config(server_dir)
    changed = before != settings
    if pid is None:
        log = open(os.path.join(server_dir, "server.out"), "ab")  # noqa: SIM115 (the daemon keeps it)
        try:
            proc = subprocess.Popen(["timeout", "--kill-after=10", f"{int(lifetime_s)}s", rsync, "--daemon",
                                     "--no-detach", f"--config={conf}"], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True, close_fds=True)
        finally:
            log.close()
        atomic_write_text(os.path.join(server_dir, "server.pid"), f"{proc.pid}\n", 0o600)
        deadline = clock() + 10
        while not _listening(address, int(port)):
            if proc.poll() is not None or clock() >= deadline:
                _kill(proc.pid)
                raise StageError(f"the staging server did not start on {address}:{port}: {_log_tail(server_dir)} "
                                 "(is the address this node's, and the port free? set fanout_address / "
                                 "atlas_fanout_port)")
            sleep(0.05)
        pid, changed = proc.pid, True
    said = firewall_open(peers, int(port), int(lifetime_s), nft) if firewall else "firewall not managed here"
    return {"changed": changed, "pid": pid, "address": address, "port": int(port), "peers": peers,
            "firewall": said}


def _log_tail(server_dir: str) -> str:
    text = ""
    for name in ("rsyncd.log", "server.out"):
        try:
            with open(os.path.join(server_dir, name), encoding="utf-8", errors="replace") as handle:
                text += handle.read()[-600:]
        except OSError:
            continue
    return " ".join(text.split())[-400:] or "no log"


def _kill(pid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        except PermissionError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                finished, _status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                finished = pid if not os.path.exists(f"/proc/{pid}") else 0
            if finished == pid:
                return
            time.sleep(0.05)


def stop(server_dir: str = SERVER_DIR, *, firewall: bool = True, nft: str = "nft") -> dict:
    """Stop the node's staging server, take its receivers out of the firewall, forget what it served."""
    groups = _server_groups(server_dir)
    for pid in groups:
        _kill(pid)
    pid = groups[0] if groups else None
    said = firewall_close(nft) if firewall else "firewall not managed here"
    shutil.rmtree(server_dir, ignore_errors=True)  # its bookkeeping: the trees ready here, a manifest coming in
    return {"changed": bool(pid), "stopped": bool(pid), "firewall": said}


# --- the firewall ------------------------------------------------------------------------------------------------

def nft_declarations() -> list[str]:
    """The sets of table inet atlas that hold a staging server's admitted peers (roles/firewall's rules file)."""
    return [f"set {name} {{ type {kind}; flags timeout; }}" for _family, name, kind in NFT_SETS]


def nft_rules(port: int) -> list[str]:
    """The input chain's rules admitting those peers to the staging port."""
    return [f'{family} saddr @{name} tcp dport {int(port)} accept comment "{NFT_COMMENT}"'
            for family, name, _kind in NFT_SETS]


def _nft(nft: str, args: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([nft, *args], input=script, capture_output=True, text=True, check=False)
    except OSError as exc:
        return subprocess.CompletedProcess([nft, *args], 127, "", str(exc))


def firewall_open(peers, port: int, lifetime_s: int, nft: str = "nft") -> str:
    """Admit ``peers`` to ``port`` for ``lifetime_s`` through the sets of table inet atlas (added with their rules
    when the loaded rules predate them). A node without the table filters nothing: said, not changed."""
    if _nft(nft, ["list", "table", *NFT_TABLE.split()]).returncode != 0:
        return "no nftables table inet atlas on this node: its firewall does not filter the port"
    script = []
    if _nft(nft, ["list", "set", *NFT_TABLE.split(), NFT_SETS[0][1]]).returncode != 0:
        script += [f"add {line.replace('set ', f'set {NFT_TABLE} ', 1)}" for line in nft_declarations()]
        script += [f"add rule {NFT_TABLE} input {rule}" for rule in nft_rules(port)]
    by_family = {"ip": [], "ip6": []}
    for peer in peers:
        by_family["ip6" if ":" in peer else "ip"].append(peer)
    for family, name, _kind in NFT_SETS:
        script.append(f"flush set {NFT_TABLE} {name}")
        if by_family[family]:
            elements = ", ".join(f"{p} timeout {int(lifetime_s)}s" for p in by_family[family])
            script.append(f"add element {NFT_TABLE} {name} {{ {elements} }}")
    proc = _nft(nft, ["-f", "-"], "\n".join(script) + "\n")
    if proc.returncode != 0:
        raise StageError(f"nft could not admit the receivers to port {port}: {proc.stderr.strip()[:300]} "
                         "(apply the firewall stage: playbooks/serving.yml)")
    return f"admitted {len(peers)} receiver(s) to port {port} for {int(lifetime_s)} s (table inet atlas)"


def firewall_close(nft: str = "nft") -> str:
    if _nft(nft, ["list", "set", *NFT_TABLE.split(), NFT_SETS[0][1]]).returncode != 0:
        return "no staging sets in table inet atlas: nothing to close"
    script = "".join(f"flush set {NFT_TABLE} {name}\n" for _family, name, _kind in NFT_SETS)
    proc = _nft(nft, ["-f", "-"], script)
    if proc.returncode != 0:
        raise StageError(f"nft could not close the staging port: {proc.stderr.strip()[:300]}")
    return "receivers removed from table inet atlas"


def tree_from_params(params: dict) -> Tree:
    """A :class:`Tree` from the module's options (one place for their names)."""
    linked = list(params.get("linked_from") or [])
    if params.get("linked_models_root"):
        linked += linked_trees(params["linked_models_root"])
    if not params.get("manifest_sha256"):
        raise StageError("manifest_sha256 is required: the sha256 of the manifest whose signature was verified")
    return Tree(name=check_name(params["name"]), path=params["path"], manifest_sha256=params["manifest_sha256"],
                manifest=params.get("manifest") or "", prefix=params.get("prefix") or "",
                stamp_file=params.get("stamp_file") or "", links=params.get("links") or "follow",
                linked_from=tuple(linked), chmod=params.get("chmod") or "go-w",
                delete=bool(params.get("delete", True)), link_dest=tuple(params.get("link_dest") or ()))


def sources_from_params(names, addresses, origin: str = "") -> list[Source]:
    """The peers ``names`` (in order) at their ``addresses`` ({name: address}), then ``origin`` (a directory)."""
    out = []
    for name in names or []:
        if name not in (addresses or {}):
            raise StageError(f"source {name}: no address given for it (addresses)")
        out.append(Source(str(name), address=check_address(addresses[name], f"source {name}'s address")))
    if origin:
        out.append(Source("origin", path=origin))
    return out
