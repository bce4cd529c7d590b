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

The parts, one module each: what is staged and from where (fanout_tree.py), verification (fanout_verify.py),
the transfer (fanout_transfer.py), the node's staging server (fanout_server.py) and its firewall sets
(fanout_firewall.py). This module puts them together (:func:`pull`, :func:`check`) and is what the module
``atlas.serving.fanout_stage`` and the other callers import: every name of the parts they use is here too.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import subprocess
import time

from ansible_collections.atlas.serving.plugins.module_utils.fanout_firewall import (
    NFT_COMMENT,
    NFT_SETS,
    NFT_TABLE,
    firewall_close,
    firewall_open,
    nft_declarations,
    nft_rules,
)
from ansible_collections.atlas.serving.plugins.module_utils.fanout_server import (
    mark_ready,
    ready_trees,
    render_config,
    serve,
    stop,
    write_config,
)
from ansible_collections.atlas.serving.plugins.module_utils.fanout_transfer import (
    CONNECT_TIMEOUT_S,
    classify,
    fetch_manifest,
    install_manifest,
    linkable,
    pull_argv,
    received_bytes,
    why_failed,
)
from ansible_collections.atlas.serving.plugins.module_utils.fanout_tree import (
    DEFAULT_LIFETIME_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_PORT,
    DEFAULT_WAIT_S,
    IO_TIMEOUT_S,
    MANIFEST,
    OWN_FILES,
    PARTIAL_DIR,
    SERVER_DIR,
    SIGNATURE,
    Source,
    StageError,
    Tree,
    check_address,
    check_name,
    sources_from_params,
    tree_from_params,
)
from ansible_collections.atlas.serving.plugins.module_utils.fanout_verify import (
    Verdict,
    manifest_here,
    remove_files,
    verify,
)
from ansible_collections.atlas.serving.plugins.module_utils.model_space import same_mount

__all__ = [
    "CONNECT_TIMEOUT_S", "DEFAULT_LIFETIME_S", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_PORT", "DEFAULT_WAIT_S",
    "IO_TIMEOUT_S", "MANIFEST", "NFT_COMMENT", "NFT_SETS", "NFT_TABLE", "OWN_FILES", "PARTIAL_DIR", "RETRY_S",
    "SERVER_DIR", "SIGNATURE", "Source", "StageError", "Tree", "Verdict", "check", "check_address", "check_name",
    "firewall_close", "firewall_open", "linkable", "mark_ready", "nft_declarations", "nft_rules", "pull",
    "pull_argv", "ready_trees", "render_config", "serve", "sources_from_params", "stop", "tree_from_params",
    "verify", "write_config",
]

RETRY_S = 2.0


def check(tree: Tree, *, server_dir: str = SERVER_DIR, check_mode: bool = False) -> dict:
    """Whether ``tree`` is complete and verified on this node as it is (stamps; only files no stamp vouches for
    are read); a complete one is listed on the node's server. Nothing is pulled, nothing deleted.
    Returns ``{changed, complete, verified, lacking: [files missing, failing or extra]}``."""
    check_name(tree.name)
    manifest = manifest_here(tree, server_dir)
    if not manifest:
        return {"changed": False, "complete": False, "verified": 0, "lacking": [MANIFEST]}
    verdict = verify(tree, manifest, write_stamps=not check_mode)
    changed = verdict.stamps_written
    if verdict.complete and not check_mode:
        changed = install_manifest(tree, server_dir, manifest) or changed
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
    manifest = manifest_here(tree, server_dir)
    verdict = verify(tree, manifest, write_stamps=not check_mode) if manifest else None
    result = {"changed": False, "source": "", "verified": 0, "bytes_received": 0, "tried": [], "refused": {}}
    if verdict is not None and verdict.complete:
        result["changed"] = install_manifest(tree, server_dir, manifest) if not check_mode else False
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
                remove_files(tree, [b.path for b in verdict.bad])
            if not manifest:
                manifest, kind, why = fetch_manifest(tree, source, port, server_dir, rsync, run, bind)
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
                remove_files(tree, [b.path for b in verdict.bad])
            proc = run(pull_argv(tree, source, port, rsync, bind), capture_output=True, text=True, check=False)
            kind = classify(proc)
            if kind == "busy":
                busy.append(source)
                continue
            result["bytes_received"] += received_bytes(proc)
            if kind == "unavailable":
                pending.remove(source)
                result["tried"].append({"name": source.name, "outcome": kind, "why": why_failed(proc)})
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
                                        "why": "" if verdict.complete else why_failed(proc)})
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
            remove_files(tree, [b.path for b in verdict.bad])
        raise StageError(_failure(tree, verdict, result), result)
    result["changed"] = install_manifest(tree, server_dir, manifest) or result["changed"]
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
