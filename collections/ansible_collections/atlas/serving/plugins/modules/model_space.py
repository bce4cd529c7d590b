#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_space
short_description: Refuse to stage a model version that does not fit on the node
version_added: "0.1.0"
description:
  - Adds up the bytes staging must write for the model's files in the bundle manifest (files that the
    version directory or C(current) already hold with the size and modification second of the bundle's
    file, rsync's quick check, are not counted, as rsync keeps or
    hard-links them) and compares them with the free space of the filesystem that will hold the
    version, plus I(headroom_mib). The current version stays on disk for a rollback.
  - Where the bundle's model directory is on the version's mounted filesystem, its files of mode C(0644) are
    hard-linked into the version (one copy per node) and not counted; where it is not, every file is a second
    copy, and the module warns so, with the bytes.
  - Fails with the path, the need and the space free when it does not fit. Changes nothing.
options:
  manifest:
    description: The bundle's manifest.json on the node.
    type: path
    required: true
  model:
    description: The model's directory name under C(models/) in the bundle.
    type: str
    required: true
  version_dir:
    description: Where the new version will be staged.
    type: path
    required: true
  current:
    description: The model's C(current) link (its files are hard-linked, not copied).
    type: path
  source:
    description: The model's directory in the bundle (default C(models/<model>) beside I(manifest)).
    type: path
  headroom_mib:
    description: Space that must stay free after staging.
    type: int
    default: 1024
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: Room for the model
  atlas.serving.model_space:
    manifest: /srv/atlas-bundle/manifest.json
    model: atlas-tiny-llama
    version_dir: /var/lib/atlas/models/atlas-tiny-llama/versions/0123456789abcdef
    current: /var/lib/atlas/models/atlas-tiny-llama/current
"""

RETURN = r"""
need_bytes:
  description: Bytes staging must write.
  returned: always
  type: int
free_bytes:
  description: Free bytes of the filesystem that will hold the version.
  returned: always
  type: int
filesystem_of:
  description: The existing directory whose filesystem was measured.
  returned: always
  type: str
linked_bytes:
  description: Bytes hard-linked from the bundle (no space).
  returned: always
  type: int
same_filesystem:
  description: Whether the bundle's model directory is on the version's mounted filesystem (staged by hard links).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.model_space import check  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "manifest": {"type": "path", "required": True},
            "model": {"type": "str", "required": True},
            "version_dir": {"type": "path", "required": True},
            "current": {"type": "path"},
            "source": {"type": "path"},
            "headroom_mib": {"type": "int", "default": 1024},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = check(p["manifest"], p["model"], p["version_dir"], p["current"], p["headroom_mib"] * 1024 * 1024,
                       source_dir=p["source"])
    except (ManifestError, OSError) as exc:
        module.fail_json(msg=str(exc))
    if not result["ok"]:
        module.fail_json(msg=result.pop("message"), **result)
    result.pop("message")
    if result["note"]:
        module.warn(result["note"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
