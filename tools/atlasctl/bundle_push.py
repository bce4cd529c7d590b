"""Move a bundle to nodes: resumable delta transfers (rsync over the inventory's SSH
settings), then a verification on each node against manifest.json.

Two ways (docs/fleet-scale.md). Direct (:func:`push`): the controller sends the bundle to every node, N
times through its one link. Fan-out (:func:`push_fanout`, the default from :data:`FANOUT_MIN_NODES` nodes):
the controller sends it to the plan's roots only (plugin_utils/fanout.py), then ``playbooks/bundle_fanout.yml``
has every other node pull it from a peer that verified it (roles/fanout, module_utils/fanout_stage.py), each
file verified against the verified manifest at every hop; a node the fan-out could not complete gets the
direct push. Both judge every node first (destination, downgrade) and send the same bytes.

rsync moves only what changed (size/mtime quick check, then its rolling-checksum delta),
keeps partial files in ``.rsync-partial`` so a broken transfer resumes, and deletes what
the bundle no longer has. ``manifest.json`` and its signature go last, so a node never holds a manifest
that describes files it does not have yet; what goes is the bytes whose signature was checked (the
manifest's one read, :class:`atlasctl.bundle.Manifest`), from a private copy, never the file read again,
and the nodes verify the bundle against exactly those bytes (``manifest_sha256``).

What it writes on a node is root's alone (``--chown=root:root --chmod=go-w``, rsync running as root: the
SSH user root, or ``sudo -n`` with ``ansible_become``): the stages refuse a bundle another account could
change between their check of a file and its use (roles/bundle_trust, ``atlas.serving.root_only``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from atlasctl import inventory as shared
from atlasctl.bundle import MANIFEST, SIGNATURE, Manifest
from atlasctl.errors import EnvironmentProblem, UsageError
from atlasctl.inputs import plain_text, shown

DEFAULT_DEST = "/srv/atlas-bundle"
PARTIAL_DIR = ".rsync-partial"
# From this many nodes on, a push fans out unless told otherwise (--fan-out / --no-fan-out): below it the
# controller's link carries a few copies at most, and a direct push needs no server on any node.
FANOUT_MIN_NODES = 8
FANOUT_PLAYBOOK = "playbooks/bundle_fanout.yml"
_BYTES_SENT = re.compile(r"^Total bytes sent: ([\d,.]+)", re.MULTILINE)
# A push deletes what the destination holds and the bundle does not: never at or above these (the
# Filesystem Hierarchy Standard's system directories, with their whole trees where the OS owns them).
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                "/sys", "/usr")
SYSTEM_DIRS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/snap", "/srv", "/tmp", "/var", "/var/backups",
               "/var/cache", "/var/lib", "/var/local", "/var/log", "/var/mail", "/var/opt", "/var/spool", "/var/tmp")
DEST_FIX = f"push to a directory of its own, e.g. --dest {DEFAULT_DEST} (the default)"


def normalize_dest(dest: str) -> str:
    """``dest`` as the path it names (``/srv/./x/``, ``//srv/x`` -> ``/srv/x``); a relative one is refused, and
    so is one with a control or format character or a template delimiter (module_utils/names.py)."""
    plain_text(dest, "--dest", DEST_FIX)
    if not dest.startswith("/"):
        raise UsageError(f"--dest {shown(dest)} is not an absolute path", fix=DEST_FIX)
    return "/" + posixpath.normpath(dest).lstrip("/")


def dest_problem(dest: str, suite_paths: tuple[str, ...] = ()) -> str:
    """Why a bundle must not be pushed to ``dest`` (normalized), or '': a system directory (a push there
    with --delete would remove the system), a user's home, or a directory at or above one the suite keeps on
    the node (``suite_paths``: atlasctl.layout ``Layout.suite_paths``)."""
    if dest in SYSTEM_DIRS or any(dest == tree or dest.startswith(tree + "/") for tree in SYSTEM_TREES):
        return f"{dest} is a system directory"
    if dest.count("/") == 2 and dest.startswith("/home/"):
        return f"{dest} is a user's home directory"
    for kept in suite_paths:
        kept = "/" + posixpath.normpath(kept).lstrip("/")
        if kept == dest or kept.startswith(dest + "/"):
            return f"{dest} holds the suite's own {kept} on the node"
    return ""


def check_dest(dest: str) -> str:
    """The normalized ``--dest``, or a UsageError (exit 2) when no bundle may go there."""
    norm = normalize_dest(dest)
    problem = dest_problem(norm)
    if problem:
        raise UsageError(f"--dest {shown(dest)}: {problem}: a push deletes what is there and not in the bundle",
                         fix=DEST_FIX)
    return norm


# What a node holds at the destination, read in one SSH round trip before anything is sent: where it resolves
# to, its top-level names, whether its manifest.json is a bundle's (the marker a push with --delete needs), and
# the node's record of the bundle it accepted last (downgrade protection).
PROBE = r"""
import json, os, sys
dest, record = sys.argv[1], sys.argv[2]
state = {"real": os.path.realpath(dest), "exists": os.path.lexists(dest), "dir": os.path.isdir(dest),
         "entries": [], "more": False, "manifest": False, "record": None}
try:
    if state["dir"]:
        names = sorted(os.listdir(dest))
        state["entries"], state["more"] = names[:100], len(names) > 100
        path = os.path.join(dest, "manifest.json")
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as handle:
                data = json.loads(handle.read().decode("utf-8"))
            state["manifest"] = isinstance(data, dict) and data.get("format") == 1 and isinstance(
                data.get("files"), list)
except (OSError, ValueError) as exc:
    state["error"] = "%s: %s" % (dest, exc)
try:
    with open(record, encoding="utf-8") as handle:
        state["record"] = handle.read(1 << 20)
except FileNotFoundError:
    pass
except (OSError, ValueError) as exc:
    state["record_error"] = "%s: %s" % (record, exc)
print(json.dumps(state))
"""


def probe(target: shared.Target, dest: str) -> dict:
    """What ``target`` holds at ``dest`` and its bundle record (:data:`PROBE`, run by the node's python3); on a
    failure, ``{"error": ...}``."""
    command = " ".join(["python3", "-I", "-c", shlex.quote(PROBE), shlex.quote(dest),
                        shlex.quote(target.layout.bundle_record)])
    try:
        proc = subprocess.run([*target.ssh_argv(), target.remote, command], text=True, capture_output=True,
                              check=False, timeout=120)
    except subprocess.TimeoutExpired:
        return {"error": "no answer over SSH in 120 s"}
    try:
        state = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (ValueError, IndexError):
        state = None
    if not isinstance(state, dict):
        return {"error": f"ssh exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"}
    return state


def dest_plan(state: dict, dest: str, bundle_names: set[str], suite_paths: tuple[str, ...] = ()) -> tuple[bool, str]:
    """(delete?, refusal or '') for a push to ``dest`` on a node that holds ``state`` (:func:`probe`): with
    --delete only where the node holds a bundle (its manifest.json); into an empty or new directory, or one
    holding only this bundle's own names (a first push that was cut short), without; anything else refused,
    so nothing the bundle did not put there is ever deleted."""
    if state.get("error"):
        return False, f"cannot inspect {dest} on the node: {state['error']}"
    real = "/" + posixpath.normpath(str(state.get("real") or dest)).lstrip("/")
    problem = dest_problem(real, suite_paths)
    if problem:
        return False, f"{dest}{' (' + real + ' on the node)' if real != dest else ''}: {problem}; nothing sent"
    if state.get("exists") and not state.get("dir"):
        return False, f"{dest} on the node is not a directory; nothing sent"
    if state.get("manifest"):
        return True, ""
    strays = [n for n in state.get("entries") or [] if n not in bundle_names and n != PARTIAL_DIR
              and not n.startswith(".atlas-")]
    if not strays and not state.get("more"):
        return False, ""
    return False, (f"{dest} on the node holds {', '.join(strays[:5])}{' and more' if len(strays) > 5 else ''} and no "
                   "bundle's manifest.json: a push would delete what is there, so nothing was sent. "
                   + DEST_FIX)


def inventory_targets(inventory: Path, limit: str | None = None) -> list[shared.Target]:
    """Hosts of ``atlas_nodes`` (narrowed by ``limit``) with their SSH settings: the same settings and
    refusals as doctor's (atlasctl.inventory)."""
    return shared.targets(inventory, limit)


def inventory_fleet(inventory: Path, limit: str | None = None) -> tuple[list[shared.Target], dict[str, list[str]]]:
    """:func:`inventory_targets` and the inventory's groups ({group: hosts, children included}), from one read:
    the fan-out plan draws its tree from the branch groups."""
    document = shared.listing(inventory, limit)
    groups = {name: sorted(shared.group_hosts(document, name)) for name in document if name != "_meta"}
    return shared.targets(inventory, limit, document=document), groups


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


def rsync_argv(src: Path, target: shared.Target, dest: str, *, part: str, delete: bool = True) -> list[str]:
    """rsync of ``part`` of the bundle ``src`` to ``dest`` on ``target``: ``files`` (everything but manifest.json
    and its signature) or ``manifest`` (only those two, from the private copy of the verified bytes). With
    ``delete``, what ``dest`` holds of that part and ``src`` does not is removed (never ``.atlas-*``, the
    node's own files there)."""
    argv = ["rsync", "--archive", "--partial", f"--partial-dir={PARTIAL_DIR}",
            "--itemize-changes", "--stats", "--rsh", shlex.join(target.ssh_argv()), *receiver_args(target, dest),
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
    bytes_sent: int = 0  # by the controller (rsync's "Total bytes sent")
    via: str = ""  # "controller", or in a fan-out the peer the node completed the bundle from ("origin": nothing)
    bytes_received: int = 0  # from peers, in a fan-out
    refused: dict = dataclasses.field(default_factory=dict)  # in a fan-out: {peer: [files its copy failed on]}


def _checks(targets: list[shared.Target], dest: str) -> str:
    if not shutil.which("rsync"):
        raise EnvironmentProblem("rsync is not installed on the controller", fix="apt-get install rsync")
    dest = check_dest(dest)
    for target in targets:
        as_root(target)  # every node reachable as root before the first transfer
    return dest


def _judge(target: shared.Target, manifest: Manifest, dest: str, names: set[str], *, judge_release: bool,
           allow_downgrade: bool) -> tuple[bool, str]:
    """(delete?, refusal or '') for a push to ``target``: one SSH round trip (:func:`probe`) reads what it holds;
    ``dest`` must not be, or resolve to, a system directory or one the suite keeps; files the bundle does not have
    are deleted only where ``dest`` holds a bundle (:func:`dest_plan`); with ``judge_release`` (a signed bundle)
    one built before the bundle the node accepted last is refused, naming the node, unless ``allow_downgrade``
    (module_utils/bundle_record.py, what roles/bundle_trust judges too)."""
    from ansible_collections.atlas.serving.plugins.module_utils import bundle_record as record

    state = probe(target, dest)
    delete, problem = dest_plan(state, dest, names, target.layout.suite_paths())
    if not problem and judge_release:
        if state.get("record_error") and not allow_downgrade:
            problem = (f"its bundle record cannot be read ({state['record_error']}), so a downgrade cannot be "
                       "ruled out; " + record.ALLOW_FIX)
        else:
            verdict = record.judge(manifest.data, manifest.sha256, state.get("record"),
                                   allow_downgrade=allow_downgrade, where=target.name, source=str(manifest.path))
            problem = verdict.problem
            if verdict.warning:
                print(f"!!! {target.name}: {verdict.warning}", file=sys.stderr)
    return delete, problem


def _send(target: shared.Target, manifest: Manifest, verified: Path, dest: str, delete: bool) -> PushResult:
    """The bundle's files, then its verified manifest and signature, from the controller to ``target``."""
    sent = sent_bytes = 0
    for part, src in (("files", manifest.root), ("manifest", verified)):
        argv = rsync_argv(src, target, dest, part=part, delete=delete or part == "manifest")
        proc = subprocess.run(argv, text=True, capture_output=True, check=False)
        found = _BYTES_SENT.search(proc.stdout or "")
        sent_bytes += int(re.sub(r"[,.]", "", found.group(1))) if found else 0
        if proc.returncode != 0:
            return PushResult(target.name, False, sent, f"rsync exited {proc.returncode}: {proc.stderr.strip()[-400:]}"
                              " (run again: the transfer resumes)", sent_bytes, "controller")
        sent += sum(1 for line in proc.stdout.splitlines() if line[:2] in ("<f", ">f"))
    return PushResult(target.name, True, sent, "", sent_bytes, "controller")


def _names(manifest: Manifest) -> set[str]:
    return {rel.split("/", 1)[0] for rel in manifest.expected} | {MANIFEST, SIGNATURE}


def push(manifest: Manifest, targets: list[shared.Target], dest: str = DEFAULT_DEST, *, judge_release: bool = True,
         allow_downgrade: bool = False) -> list[PushResult]:
    """Transfer the bundle ``manifest.root`` to ``dest`` on every target: its files first, then the manifest
    as it was verified (``manifest``: the one read whose signature was checked) and its signature.

    Before anything goes to a node, it is judged (:func:`_judge`): its destination, and its record of the
    bundle it accepted last."""
    dest = _checks(targets, dest)
    names = _names(manifest)
    results = []
    with tempfile.TemporaryDirectory(prefix="atlas-push-") as tmp:
        verified = _verified_copy(manifest, Path(tmp))
        for target in targets:
            delete, problem = _judge(target, manifest, dest, names, judge_release=judge_release,
                                     allow_downgrade=allow_downgrade)
            if problem:
                results.append(PushResult(target.name, False, 0, f"refused: {problem}"))
                continue
            results.append(_send(target, manifest, verified, dest, delete))
    return results


def use_fanout(choice: bool | None, nodes: int) -> bool:
    """--fan-out / --no-fan-out, else a fan-out from :data:`FANOUT_MIN_NODES` nodes on."""
    return choice if choice is not None else nodes >= FANOUT_MIN_NODES


@dataclasses.dataclass
class FanoutReport:
    results: list[PushResult]
    plan: dict
    controller_bytes: int
    verified: bool
    fallback: list[str] = dataclasses.field(default_factory=list)


def push_fanout(manifest: Manifest, targets: list[shared.Target], groups: dict[str, list[str]], inventory: Path,
                dest: str = DEFAULT_DEST, *, judge_release: bool = True, allow_downgrade: bool = False,
                per_source: int = 2, roots: int = 1, fallbacks: int = 2, run_playbook=None) -> FanoutReport:
    """The bundle to every target along the fan-out plan: every node judged first (as :func:`push` does), the
    controller sends to the plan's roots (a root it cannot send to leaves the plan, which is drawn again), then
    ``playbooks/bundle_fanout.yml`` has every other node pull it from a verified peer and verify it. A node the
    fan-out leaves without a verified bundle gets the direct push, then the nodes' verification."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import fanout as fan

    if run_playbook is None:
        from atlasctl.runner import run_playbook
    dest = _checks(targets, dest)
    names = _names(manifest)
    by_name = {t.name: t for t in targets}
    results: dict[str, PushResult] = {}
    accepted: dict[str, bool] = {}
    for target in targets:
        delete, problem = _judge(target, manifest, dest, names, judge_release=judge_release,
                                 allow_downgrade=allow_downgrade)
        if problem:
            results[target.name] = PushResult(target.name, False, 0, f"refused: {problem}")
        else:
            accepted[target.name] = delete
    hosts = list(accepted)
    plan: dict = {"rounds": 0, "roots": [], "nodes": {}, "transfers": [], "order": []}
    fallback: list[str] = []
    with tempfile.TemporaryDirectory(prefix="atlas-push-") as tmp:
        verified = _verified_copy(manifest, Path(tmp))
        while hosts:
            try:
                plan = fan.inventory_plan(hosts, groups, fanout=per_source, roots=roots, fallbacks=fallbacks)
            except fan.FanoutError as exc:
                raise UsageError(f"bundle push --fan-out: {exc}", fix="e.g. --per-source 2 --roots 1") from None
            lost = []
            for root in plan["roots"]:
                if root not in results or not results[root].ok:
                    results[root] = _send(by_name[root], manifest, verified, dest, accepted[root])
                if not results[root].ok:
                    lost.append(root)
            if not lost:
                break
            hosts = [h for h in hosts if h not in lost]
        if hosts:
            run = run_playbook(FANOUT_PLAYBOOK, inventory, limit=",".join(hosts), extravars={
                "bundle_fanout_dest": dest, "bundle_fanout_manifest_sha256": manifest.sha256,
                "bundle_fanout_plan": plan, "bundle_fanout_delete": {h: accepted[h] for h in hosts},
                "bundle_fanout_per_source": per_source})
            for host in hosts:
                outcome = run.hosts.get(host)
                got = (outcome.facts.get("fanout_result") or {}) if outcome else {}
                done = bool(outcome and not outcome.failed and not outcome.unreachable)
                before = results.get(host) or PushResult(host, False)
                why = "" if done else (outcome.message if outcome else "not reached by the fan-out play")
                results[host] = PushResult(host, done, before.files_sent, why[:600], before.bytes_sent,
                                           before.via or got.get("source") or "", int(got.get("bytes_received") or 0),
                                           dict(got.get("refused") or {}))
            fallback = [h for h in hosts if not results[h].ok and not (run.hosts.get(h) and run.hosts[h].unreachable)]
            for host in fallback:
                direct = _send(by_name[host], manifest, verified, dest, accepted[host])
                direct.message = ("fan-out failed (" + results[host].message[:300] + "); pushed directly"
                                  + (f": {direct.message}" if direct.message else ""))
                results[host] = direct
    controller = sum(r.bytes_sent for r in results.values())
    verified_all = bool(hosts) and all(results[h].ok for h in hosts if h not in fallback)
    return FanoutReport([results[t.name] for t in targets], plan, controller, verified_all, fallback)


def bundle_bytes(manifest: Manifest) -> int:
    """What the bundle weighs: its files and its manifest (what one direct push of a new bundle sends)."""
    return sum(int(e.get("size") or 0) for e in manifest.data.get("files", [])) + len(manifest.raw)


def node_verify_args(dest: str, manifest_sha256: str | None = None, models_root: str = "") -> str:
    """The arguments of atlas.serving.model_verify that verify a bundle at ``dest`` on a node (against the
    manifest whose sha256 is ``manifest_sha256``, the verified one, when given); ``models_root``: the node's,
    whose model versions may be hard links to the bundle's files (one copy per node)."""
    args = f"path={dest} manifest={dest}/{MANIFEST} stamp_file={dest}/.atlas-verified.json full=true links=refuse"
    args += f" linked_models_root={models_root}" if models_root else ""
    return args + (f" manifest_sha256={manifest_sha256}" if manifest_sha256 else "")


def verify_on_nodes(inventory: Path, dest: str, limit: str | None, manifest_sha256: str | None = None,
                    targets: list[shared.Target] | None = None) -> subprocess.CompletedProcess:
    """atlas.serving.model_verify on each node: every file under dest against dest/manifest.json, links
    refused (but a model version hard-linked from the bundle is the bundle's own: the node's models root, from
    ``targets``' layouts), as ``atlasctl bundle verify`` checks the bundle here (the same module_utils verifier);
    the node's manifest must be the verified bytes (``manifest_sha256``). One run per models root."""
    tool = Path(sys.executable).with_name("ansible")
    by_root: dict[str, list[str]] = {}
    for target in targets or []:
        by_root.setdefault(target.layout.models_root, []).append(target.name)
    groups = [(root, ",".join(names)) for root, names in by_root.items()] or [("", limit or "atlas_nodes")]
    outs, errs, rc = [], [], 0
    for root, pattern in groups:
        cmd = [str(tool if tool.exists() else "ansible"), "-i", str(inventory), pattern,
               "-m", "atlas.serving.model_verify", "-a", node_verify_args(dest, manifest_sha256, root), "-o"]
        proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
        outs.append(proc.stdout)
        errs.append(proc.stderr)
        rc = rc or proc.returncode
    return subprocess.CompletedProcess(["ansible"], rc, "".join(outs), "".join(errs))
