#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_verify
short_description: Verify a model directory against md5 and sha256 lists in one read
description:
  - Reads every file of O(path) once and checks md5 and sha256 from the same buffers, hashing
    files in parallel threads.
  - Expected checksums come from C(md5sum)/C(sha256sum) output files (text or binary C(*) markers,
    backslash-escaped names, C(--tag) lines) and/or a bundle C(manifest.json)
    (a C(files) list of C(path), C(size), C(sha256), C(md5)), restricted to O(prefix).
  - Reports each file as C(ok), C(mismatch) (naming the algorithm, expected and actual digest),
    C(missing), C(extra) (not in any list) or C(error).
  - After a successful read a stamp per file (size, mtime_ns, ctime_ns, inode, device, digests) is
    stored in O(stamp_file). A later run skips the read of a file whose stamp still matches both
    the file and the expected digests. Any edit changes ctime, a replaced file changes inode, and a
    changed list changes the expected digests, so a stamp never vouches for a changed file.
version_added: 0.1.0
options:
  path:
    description: Model directory (the root the checksum lists are relative to).
    type: path
    required: true
  manifest:
    description:
      - A bundle C(manifest.json) (a C(files) list of C(path), C(size), C(sha256), C(md5)).
        An C(md5sum)/C(sha256sum) output file is accepted here too (the format is detected by content).
      - Without O(manifest) and O(checksum_files), whichever of C(manifest.json), C(md5sums.txt),
        C(sha256sums.txt) exist in O(path) are used.
    type: path
  checksum_files:
    description:
      - C(md5sum)/C(sha256sum) output files (text or binary C(*) markers, backslash-escaped names,
        C(--tag) lines); the algorithm is taken from the file name or the digest length.
      - Combined with O(manifest); two sources that disagree about a file fail the task.
      - Checksum files inside O(path) are not reported as extra files.
    type: list
    elements: path
    default: []
    aliases: [checksums]
  prefix:
    description:
      - Use only entries under this subdirectory and strip it, for example C(models/qwen2.5-72b)
        when O(manifest) is the bundle's C(manifest.json) and O(path) is the staged model.
    type: str
    default: ''
    aliases: [manifest_prefix]
  files:
    description:
      - Verify only these files (relative to O(path)); the other files the lists name are neither read nor
        reported. A file the lists do not name fails the task. Empty (the default) verifies every listed file.
      - For a bundle directory of which a node needs one file (an image archive under C(images/)).
    type: list
    elements: str
    default: []
  allow_extra:
    description: Files under O(path) that no list names are reported; with V(false) they fail the task.
    type: bool
    default: false
  links:
    description:
      - V(follow) reads a symlinked file through its link (a model directory that links to its blobs); a file
        outside O(path) (through a symlink, or a hard link with a name outside it) is checked, but its digests
        are never reported.
        V(refuse) reports every symlink or special file under O(path) as an error and reads none through, and
        so is a hard link to a file with a name outside O(path)
        (a bundle; C(atlasctl bundle push) verifies the pushed bundle so, as C(atlasctl bundle verify) does).
    type: str
    choices: [follow, refuse]
    default: follow
  linked_from:
    description:
      - Directories whose file at the same relative path, when it is the same file (device and inode), counts as
        a name inside O(path). A verified file hard-linked from there (the node's bundle, the version it
        replaces) is neither refused nor hidden.
    type: list
    elements: path
    default: []
  linked_models_root:
    description:
      - A node's models root whose model versions are staged from this bundle by hard links (one copy per node,
        docs/fleet-scale.md). A file under C(models/<name>/) of O(path) that is the same file as the one at the same
        place under C(<linked_models_root>/<name>/versions/<v>/) counts as a name inside O(path).
    type: path
  full:
    description: Read every file even when a stamp vouches for it.
    type: bool
    default: false
  stamps:
    description: Read and write verification stamps. V(false) reads every file every time.
    type: bool
    default: true
  stamp_file:
    description:
      - Stamp file. Default C(<path>/.atlas-verified.json). Set it outside O(path) when O(path) is read-only.
    type: path
    aliases: [stamp_path]
  workers:
    description: Hashing threads. Default is the number of usable cores (at most 8).
    type: int
notes:
  - Check mode verifies (reads) but writes no stamps; C(changed) then says whether stamps would be written.
  - C(changed) is true only when the stamp file was written.
  - On a filesystem with whole-second timestamps, files modified less than 2 seconds before the read are
    verified but not stamped.
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.trusted_manifest
"""

EXAMPLES = r"""
- name: Models | verify the staged model against the vendor lists
  atlas.serving.model_verify:
    path: /var/lib/atlas/models/qwen2.5-72b
    checksum_files:
      - /var/lib/atlas/models/qwen2.5-72b/md5sums.txt
      - /var/lib/atlas/models/qwen2.5-72b/sha256sums.txt

- name: Models | verify against the bundle manifest, stamps kept outside the model
  atlas.serving.model_verify:
    path: /var/lib/atlas/models/qwen2.5-72b
    manifest: /srv/atlas-bundle/manifest.json
    prefix: models/qwen2.5-72b
    stamp_file: /var/lib/atlas/stamps/qwen2.5-72b.json

- name: Models | force a full re-read
  atlas.serving.model_verify:
    path: /var/lib/atlas/models/qwen2.5-72b
    full: true
"""

RETURN = r"""
ok:
  description: True when no file failed (mismatch, missing, error, or extra without O(allow_extra)).
  returned: always
  type: bool
files:
  description: One entry per expected or extra file.
  returned: always
  type: list
  elements: dict
  sample:
    - path: model-00001-of-00002.safetensors
      status: mismatch
      source: read
      expected: {size: 1048576, md5: 0cc175b9c0f1b6a831c399e269772661, sha256: ca97...}
      actual: {size: 1048576, md5: 92eb5ffee6ae2fec3ad71c777531578f, sha256: 3e23...}
      mismatched: [md5, sha256]
      message: "md5 expected 0cc1..., actual 92eb...; sha256 expected ca97..., actual 3e23..."
totals:
  description: Counts and throughput.
  returned: always
  type: dict
  sample:
    files: 38
    ok: 38
    mismatch: 0
    missing: 0
    extra: 0
    error: 0
    from_stamps: 37
    bytes_read: 4294967296
    bytes_skipped: 135291469824
    seconds: 5.1
    mb_per_s: 842.1
    workers: 2
stamp_file:
  description: The stamp file used, or null when O(stamps=false).
  returned: always
  type: str
stamps_written:
  description: Whether the stamp file was (re)written in this run.
  returned: always
  type: bool
"""

# Imports follow the documentation blocks, as in ansible-core's modules.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.checksums import VerifyError, linked_trees  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.tree_check import check_tree  # noqa: E402


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            manifest=dict(type="path"),
            checksum_files=dict(type="list", elements="path", default=[], aliases=["checksums"]),
            prefix=dict(type="str", default="", aliases=["manifest_prefix"]),
            files=dict(type="list", elements="str", default=[]),
            allow_extra=dict(type="bool", default=False),
            full=dict(type="bool", default=False),
            links=dict(type="str", default="follow", choices=["follow", "refuse"]),
            linked_from=dict(type="list", elements="path", default=[]),
            linked_models_root=dict(type="path"),
            stamps=dict(type="bool", default=True),
            stamp_file=dict(type="path", aliases=["stamp_path"]),
            workers=dict(type="int"),
            manifest_sha256=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["workers"] is not None and p["workers"] < 1:
        module.fail_json(msg=f"workers must be at least 1, got {p['workers']}")
    try:
        report, stamp_path = check_tree(
            p["path"], p["manifest"], p["checksum_files"], prefix=p["prefix"], manifest_sha256=p["manifest_sha256"],
            stamps=p["stamps"], stamp_file=p["stamp_file"], full=p["full"], workers=p["workers"],
            allow_extra=p["allow_extra"], write_stamps=not module.check_mode, links=p["links"], files=p["files"],
            linked_from=list(p["linked_from"]) + linked_trees(p["linked_models_root"] or ""))
    except VerifyError as exc:
        module.fail_json(msg=str(exc))
    for warning in report.warnings:
        module.warn(warning)
    result = dict(
        changed=report.stamps_written or (module.check_mode and report.stamps_changed),
        ok=not report.failed,
        files=[r.as_dict() for r in report.results],
        totals=report.totals(),
        stamp_file=stamp_path,
        stamps_written=report.stamps_written,
    )
    if report.failed:
        module.fail_json(msg=report.failure_message(), **result)
    module.exit_json(**result)


def main():
    run_module()


if __name__ == "__main__":
    main()
