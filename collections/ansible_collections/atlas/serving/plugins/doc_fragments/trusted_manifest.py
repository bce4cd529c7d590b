# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option of the modules that use a bundle manifest only as the bytes whose signature was verified
(module_utils/signature.py, check_trusted_sha256)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  manifest_sha256:
    description:
      - The sha256 of the O(manifest) whose signature was verified (C(atlas_bundle_manifest_sha256)).
        The manifest's bytes are hashed as they are read; a manifest that is not those bytes fails the task
        before anything it lists is used, and so does an empty value (the signature was not verified in
        this run).
    type: str
"""
