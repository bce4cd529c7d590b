#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: podman_image
short_description: Load a bundle's container image into Podman, pinned by its id
description:
  - Reads the bundle manifest (its bytes must have O(manifest_sha256), the verified manifest) and the entry of
    the image O(name) (C(images/<name>.tar), kind C(image), with C(image_id), C(variant), C(cann),
    C(engine_release)).
  - C(podman image exists <image_id>); only when the store lacks it, the archive's own image id (the sha256 of
    its config, read from the OCI layout or the docker-save C(manifest.json)) must be the manifest's, then
    C(podman load -i) and the id is checked in the store again. A loaded image whose id differs fails, naming both.
  - Names the image C(localhost/atlas-serving/<name>:<first 12 of the id>) so C(podman image prune) keeps it (a
    rollback's image is not in use); the service never runs a name, only the id.
  - Writes the image's record (name, image_id, variant, cann, engine_release, sha256) to O(record) when it differs,
    which the serving stage renders the release from when the engines stage did not run in the same play.
  - Verify the archive against the manifest first (M(atlas.serving.model_verify) with its C(files) option).
version_added: 0.1.0
options:
  name:
    description: The image's name in the bundle (C(images/<name>.tar)).
    type: str
    required: true
  bundle_dir:
    description: The bundle on the node.
    type: path
    required: true
  manifest:
    description: The bundle's C(manifest.json). Default C(<bundle_dir>/manifest.json).
    type: path
  record:
    description: Where the image's record is written (JSON, 0644).
    type: path
    required: true
  podman:
    description: The podman executable (the OS package).
    type: path
    default: /usr/bin/podman
  manifest_sha256:
    required: true
notes:
  - Check mode reads the store and reports what it would load, name or write; it changes nothing.
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.trusted_manifest
"""

EXAMPLES = r"""
- name: Engines | image | load and pin vllm-ascend-0.11.0
  atlas.serving.podman_image:
    name: vllm-ascend-0.11.0
    bundle_dir: /srv/atlas-bundle
    manifest_sha256: "{{ atlas_bundle_manifest_sha256 }}"
    record: /opt/atlas/engines/images/vllm-ascend-0.11.0.json
"""

RETURN = r"""
image:
  description: The manifest's entry for the image.
  returned: success
  type: dict
  sample: {name: vllm-ascend-0.11.0, path: images/vllm-ascend-0.11.0.tar, image_id: 3f4a..., variant: 910b,
           cann: 8.3.RC2, engine_release: vllm-ascend-0.11.0, sha256: 9b1c..., size: 16106127360}
loaded:
  description: Whether C(podman load) ran (in check mode, whether it would).
  returned: success
  type: bool
named:
  description: Whether the pinning name was added (or would be).
  returned: success
  type: bool
record_written:
  description: Whether the record was (or would be) written.
  returned: success
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.podman import PodmanError, ensure_image  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            bundle_dir=dict(type="path", required=True),
            manifest=dict(type="path"),
            manifest_sha256=dict(type="str", required=True),
            record=dict(type="path", required=True),
            podman=dict(type="path", default="/usr/bin/podman"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    manifest = p["manifest"] or f"{p['bundle_dir'].rstrip('/')}/manifest.json"

    def run(argv):
        return module.run_command(argv, check_rc=False)

    try:
        result = ensure_image(run, p["podman"], p["bundle_dir"], manifest, p["manifest_sha256"], p["name"],
                              p["record"], check_mode=module.check_mode)
    except PodmanError as exc:
        module.fail_json(msg=f"image {p['name']}: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
