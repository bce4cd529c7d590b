# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-out staging (module_utils/fanout_stage.py): the node's staging server. A read-only rsync daemon, bound to the
node's backend address, whose configuration lists a tree only once a pull (or a verification that needed nothing)
left it complete and verified on this node (:func:`mark_ready`); rsync reads its configuration again for each
connection. ``hosts allow`` holds the node's planned receivers and nothing else, and the firewall admits them
(module_utils/fanout_firewall.py); the daemon itself ends after ``lifetime_s`` whatever happens to the run that
started it. :func:`stop` ends it and forgets what it served.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time

from ansible_collections.atlas.serving.plugins.module_utils.checksums import atomic_write_text
from ansible_collections.atlas.serving.plugins.module_utils.fanout_firewall import firewall_close, firewall_open
from ansible_collections.atlas.serving.plugins.module_utils.fanout_tree import (
    DEFAULT_LIFETIME_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORT,
    IO_TIMEOUT_S,
    OWN_FILES,
    PARTIAL_DIR,
    SERVER_DIR,
    TREE_NAME,
    StageError,
    Tree,
    check_address,
)


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
        if not name.endswith(".json") or not TREE_NAME.fullmatch(name[:-5]):
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
