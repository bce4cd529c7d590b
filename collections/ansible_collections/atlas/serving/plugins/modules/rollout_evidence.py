#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollout_evidence
short_description: Write a rollout's evidence pack on the controller, signed by the controller's key
description:
  - Runs on the controller (delegated to localhost). Writes the directory O(dir) whole (a new one swapped in
    for the old) with C(evidence.json), the record; C(SHA256SUMS), the sha256 of every other file of the pack;
    and C(SHA256SUMS.asc), a detached signature of C(SHA256SUMS) by O(signing_key) from O(gnupg_home).
  - The record is O(record) (what the playbook gathered; its C(nodes) come from the filter
    C(atlas.serving.rollout_evidence_nodes), which picks each node's values by name and withholds secrets),
    with the outcome, the rollbacks, the bundle's manifest sha256 and signer across the nodes, and who wrote it
    on which controller (user, hostname) and when, added.
  - The record is bound to its rollout (format 2, C(binding)). It names the rollout (the name of O(dir) without
    C(.evidence)) and the folder of the inventory's rollouts it is written in; C(atlasctl rollout) adds the
    sha256 of the report beside it. C(atlasctl evidence verify) refuses a pack that sits elsewhere.
  - Without O(signing_key) the pack is written unsigned and the record and a warning say so. A key that cannot
    sign fails the task when O(strict), else leaves the pack unsigned, saying why.
  - C(atlasctl evidence verify DIR) checks a pack; docs/evidence.md says how to check one with gpgv and
    sha256sum alone.
version_added: 0.1.0
options:
  dir:
    description: The pack's directory (its parents are created).
    type: path
    required: true
  record:
    description: >-
      What the playbook gathered: C(release), C(inventory), C(plan), C(resumed_from), C(started_at), C(complete)
      (the last write of the run), C(nodes).
    type: dict
    required: true
  signing_key:
    description: >-
      Full 40-hex fingerprint of the controller's evidence key (C(atlas_evidence_signing_key)); empty for none.
    type: str
    default: ''
  gnupg_home:
    description: gpg home directory holding the secret part of O(signing_key) (C(atlas_evidence_gnupg_home)).
    type: path
    default: ''
  strict:
    description: Fail when O(signing_key) cannot sign (instead of writing the pack unsigned).
    type: bool
    default: false
attributes:
  check_mode:
    details: In check mode nothing is written.
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: Rollout | evidence | write the pack
  atlas.serving.rollout_evidence:
    dir: "{{ rollout_evidence_path }}"
    signing_key: "{{ atlas_evidence_signing_key | default('') }}"
    gnupg_home: "{{ atlas_evidence_gnupg_home | default('') }}"
    record:
      release: "{{ atlas_release_id }}"
      plan: "{{ rollout_plan }}"
      nodes: "{{ hostvars | atlas.serving.rollout_evidence_nodes(rollout_plan) }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
dir:
  description: The pack's directory.
  returned: always
  type: str
signed:
  description: Whether C(SHA256SUMS.asc) was written.
  returned: always
  type: bool
sha256:
  description: sha256 of C(evidence.json) (null in check mode).
  returned: always
  type: str
status:
  description: The rollout's status in the record (C(ok), C(failed), C(in progress)).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import evidence  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "record": {"type": "dict", "required": True},
            "signing_key": {"type": "str", "default": "", "no_log": False},
            "gnupg_home": {"type": "path", "default": ""},
            "strict": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    record = evidence.build_record(p["record"], signing_key=p["signing_key"], gnupg_home=p["gnupg_home"])
    if module.check_mode:
        module.exit_json(changed=True, dir=p["dir"], signed=bool(p["signing_key"]), sha256=None,
                         status=record["status"])
    try:
        written = evidence.write_pack(p["dir"], record, signing_key=p["signing_key"], gnupg_home=p["gnupg_home"])
    except (evidence.EvidenceError, OSError) as exc:
        module.fail_json(msg=f"evidence pack {p['dir']}: {exc}")
    if written["error"]:
        if p["strict"]:
            module.fail_json(msg=f"evidence pack {p['dir']}: {written['error']}", **written)
        module.warn(f"evidence pack {written['dir']} is UNSIGNED: {written['error']}")
    elif not written["signed"]:
        module.warn(f"evidence pack {written['dir']}: {evidence.UNSIGNED_NOTE}")
    module.exit_json(changed=True, dir=written["dir"], signed=written["signed"], sha256=written["sha256"],
                     status=written["status"])


if __name__ == "__main__":
    main()
