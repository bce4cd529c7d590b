# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-out staging (module_utils/fanout_stage.py): verification of a tree on this node against the signed manifest,
as ``model_verify`` checks it (md5 + sha256 in one read, stamps: ``tree_check.check_tree``), and which manifest to
verify it against (only bytes with the verified manifest's sha256). A file that fails is deleted before the next
pull; nothing unverified is served or used.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from ansible_collections.atlas.serving.plugins.module_utils.checksums import STATUS_EXTRA, STATUS_MISSING, STATUS_OK
from ansible_collections.atlas.serving.plugins.module_utils.fanout_tree import (
    MANIFEST,
    PARTIAL_DIR,
    SIGNATURE,
    StageError,
    Tree,
    incoming_dir,
)
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError, load_expected, read_text
from ansible_collections.atlas.serving.plugins.module_utils.tree_check import check_tree


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


def remove_files(tree: Tree, rels) -> None:
    for rel in rels:
        path = os.path.join(tree.path, rel)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass


def manifest_here(tree: Tree, server_dir: str) -> str:
    """The manifest to verify ``tree`` against, if this node already holds the verified bytes: the tree's own
    (``tree.manifest``, or the one in place in a bundle), or one a pull brought in; '' when none."""
    if tree.manifest:
        candidates = [tree.manifest]
    else:
        candidates = [os.path.join(tree.path, MANIFEST), os.path.join(incoming_dir(server_dir, tree), MANIFEST)]
    for path in candidates:
        if os.path.isfile(path) and not os.path.islink(path) and verified_manifest(path, tree):
            return path
    if tree.manifest:
        raise StageError(f"{tree.manifest}: not the verified manifest (sha256 {tree.manifest_sha256}); verify the "
                         "bundle's signature first (roles/bundle_trust), then stage from it")
    return ""


def verified_manifest(path: str, tree: Tree) -> bool:
    """Whether the bytes at ``path`` are the manifest whose signature was verified (``tree.manifest_sha256``)."""
    try:
        read_text(path, tree.manifest_sha256)
    except ManifestError:
        return False
    return True
