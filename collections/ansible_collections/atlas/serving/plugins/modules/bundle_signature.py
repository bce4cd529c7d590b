#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bundle_signature
short_description: Verify a bundle manifest's detached GPG signature against pinned fingerprints
description:
  - Runs on the controller (delegated to localhost) over the bytes of a node's C(manifest.json) and
    C(manifest.json.asc) read with M(ansible.builtin.slurp).
  - gpg runs with a throwaway C(--homedir) and C(--no-options); the public keys come from O(keyring) on the
    controller, never from the bundle or the user's C(~/.gnupg). The decision is read from gpg's C(--status-fd).
  - Accepts only a good signature (C(VALIDSIG)) whose signing key or its primary key is in O(fingerprints).
    Refuses, each with its own message, an unsigned manifest, a bad (or stale) signature, a revoked key, an
    expired key, an expired signature, an unknown key, and a good signature by a key that is not pinned.
  - Returns the sha256 of the verified bytes; the roles trust a node's manifest only when its sha256 is that one.
version_added: 0.1.0
options:
  manifest:
    description: C(manifest.json) content, base64 (the C(content) of M(ansible.builtin.slurp)).
    type: str
    required: true
  signature:
    description: C(manifest.json.asc) content, base64; empty or omitted when there is none.
    type: str
    default: ''
  keyring:
    description: Public keyring file on the controller (binary or armored C(gpg --export)).
    type: path
    default: ''
  fingerprints:
    description: Full 40-hex fingerprints of the trusted signing keys (primary keys, or signing subkeys).
    type: list
    elements: str
    default: []
  allow_unsigned:
    description: Skip the check (reported as a warning). For a lab or a transition only.
    type: bool
    default: false
  name:
    description: Where the manifest was read, for messages (C(node:/srv/atlas-bundle/manifest.json)).
    type: str
    default: manifest.json
extends_documentation_fragment:
  - atlas.serving.module
"""

EXAMPLES = r"""
- name: Verify the node's bundle manifest on the controller
  atlas.serving.bundle_signature:
    manifest: "{{ manifest_slurp.content }}"
    signature: "{{ signature_slurp.content | default('') }}"
    keyring: /etc/atlas/bundle-signing/trusted.gpg
    fingerprints: [0123456789ABCDEF0123456789ABCDEF01234567]
  delegate_to: localhost
  become: false
"""

RETURN = r"""
sha256:
  description: sha256 of the manifest bytes that were verified.
  returned: success
  type: str
signed:
  description: False only when O(allow_unsigned) skipped the check.
  returned: success
  type: bool
fingerprint:
  description: The key that made the signature (a subkey or the primary).
  returned: success
  type: str
primary_fingerprint:
  description: Its primary key's fingerprint.
  returned: success
  type: str
reason:
  description: >-
    On failure, one word (unsigned, bad, revoked, expired-key, expired-signature, unknown-key,
    untrusted, config).
  returned: failure
  type: str
"""

import base64  # noqa: E402
import binascii  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.signature import (  # noqa: E402
    SIGNATURE_NAME,
    SignatureError,
    verify_manifest,
)


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            manifest=dict(type="str", required=True),
            signature=dict(type="str", default=""),
            keyring=dict(type="path", default=""),
            fingerprints=dict(type="list", elements="str", default=[]),
            allow_unsigned=dict(type="bool", default=False),
            name=dict(type="str", default="manifest.json"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        manifest = base64.b64decode(p["manifest"], validate=True)
        signature = base64.b64decode(p["signature"], validate=True) if p["signature"] else None
    except (binascii.Error, ValueError) as exc:
        module.fail_json(msg=f"{p['name']}: manifest/signature must be base64 (slurp content): {exc}")
    sig_name = p["name"][: -len("manifest.json")] + SIGNATURE_NAME if p["name"].endswith("manifest.json") \
        else p["name"] + ".asc"
    try:
        verdict = verify_manifest(manifest, signature, keyring=p["keyring"], fingerprints=p["fingerprints"],
                                  manifest_name=p["name"], signature_name=sig_name,
                                  allow_unsigned=p["allow_unsigned"])
    except SignatureError as exc:
        module.fail_json(msg=str(exc), reason=exc.reason)
    for warning in verdict.warnings:
        module.warn(warning)
    module.exit_json(changed=False, **verdict.as_dict())


def main():
    run_module()


if __name__ == "__main__":
    main()
