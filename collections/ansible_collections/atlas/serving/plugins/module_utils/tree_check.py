# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tree checked against its checksum lists: what ``model_verify`` runs, and a stage's fast path
(``stage_state``'s ``verified``) runs with ``read=False`` to prove from stamps alone that the
module would read nothing and write no stamp.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import posixpath

from ansible_collections.atlas.serving.plugins.module_utils.checksums import (
    STAMP_FILE_NAME,
    VerifyError,
    verify_tree,
)
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError, load_expected
from ansible_collections.atlas.serving.plugins.module_utils.signature import SIGNATURE_NAME

DEFAULT_LISTS = ("manifest.json", "md5sums.txt", "sha256sums.txt")


def _relative_inside(root, path):
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")
    return None if rel.startswith("../") else rel


def check_tree(root, manifest=None, checksum_files=(), prefix="", manifest_sha256=None, stamps=True,
               stamp_file=None, files=(), **verify):
    """(report, stamp path or None) of ``root`` against a manifest.json and/or md5sum/sha256sum
    lists (default: those of DEFAULT_LISTS in ``root``). ``manifest_sha256``: the manifest's bytes must
    have it (the verified one). The lists and a manifest's detached signature inside ``root`` are not
    extra files. ``files``: only these (relative to ``root``) are verified; the other files the lists name
    are neither read nor reported (a bundle directory of which a node needs one file: an image archive).
    ``verify``: the rest of :func:`checksums.verify_tree`'s options. Raises VerifyError with a message that
    names the input and the fix."""
    lists = ([manifest] if manifest else []) + list(checksum_files)
    if not lists:
        lists = [os.path.join(root, n) for n in DEFAULT_LISTS if os.path.isfile(os.path.join(root, n))]
    if not lists:
        raise VerifyError(f"{root}: no checksum list given and none of {', '.join(DEFAULT_LISTS)} is there; "
                          "set manifest (a manifest.json) or checksum_files (md5sum/sha256sum output)")
    if manifest_sha256 is not None and not manifest:
        raise VerifyError("manifest_sha256 is set but manifest is not: name the manifest it vouches for")
    trusted = {manifest: manifest_sha256} if manifest_sha256 is not None else None
    try:
        expected = load_expected(lists, prefix=prefix, trusted=trusted)
    except ManifestError as exc:
        raise VerifyError(str(exc)) from None
    stamp_path = (stamp_file or os.path.join(root, STAMP_FILE_NAME)) if stamps else None
    ignore = {rel for rel in (_relative_inside(root, x) for x in lists) if rel}
    if files:
        wanted = [posixpath.normpath(str(f)) for f in files]
        unlisted = [f for f in wanted if f not in expected]
        if unlisted:
            raise VerifyError(f"{', '.join(unlisted)}: not listed in {', '.join(lists)}"
                              + (f" under {prefix}" if prefix else "") + "; the checksum list names "
                              + (", ".join(sorted(expected)[:10]) or "nothing there"))
        ignore |= set(expected) - set(wanted)
        expected = {rel: expected[rel] for rel in wanted}
    # a bundle root: the manifest's detached signature is not listed in it (DESIGN.md)
    ignore |= {posixpath.join(posixpath.dirname(rel), SIGNATURE_NAME) for rel in list(ignore)
               if posixpath.basename(rel) == "manifest.json"}
    return verify_tree(root, expected, stamps_path=stamp_path, ignore=ignore, **verify), stamp_path
