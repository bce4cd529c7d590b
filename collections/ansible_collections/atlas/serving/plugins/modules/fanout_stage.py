#!/usr/bin/python
# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fanout_stage
short_description: Receive a tree from verified peers, verify it, and serve it to planned receivers only
version_added: "0.1.0"
description:
  - Fan-out staging of a tree of files (the bundle, a model version) on a node (docs/fleet-scale.md).
  - V(pull) verifies the tree against the signed manifest (md5 + sha256 in one read, stamps), and when anything
    is missing or wrong pulls it with rsync from O(sources) in order, then O(origin); a file that fails
    verification is deleted and its source is not used again; a complete tree moves nothing. A bundle's
    C(manifest.json) comes from the source (its sha256 must be O(manifest_sha256)) and is put in place last.
    Once complete and verified, the tree is listed on the node's staging server.
  - V(serve) starts (or keeps) the node's read-only rsync daemon on O(address):O(port), admitting O(peers) only
    (its C(hosts allow), and the sets of the node's nftables table C(inet atlas) with a timeout); it serves only
    trees that verified on this node, and ends by itself after O(lifetime_s).
  - V(verify) says whether the tree is complete and verified as it is (stamps; nothing pulled or deleted), and
    lists a complete one on the node's staging server.
  - V(stop) stops the daemon and takes the peers out of the firewall.
options:
  action:
    description: What to do.
    type: str
    required: true
    choices: [pull, serve, stop, verify]
  server_dir:
    description: The staging server's own directory on the node (configuration, state), root only.
    type: path
    default: /run/atlas-fanout
  port:
    description: TCP port of the staging servers (the same on every node).
    type: int
    default: 8873
  address:
    description:
      - The node's address (its backend address, C(fanout_address)). V(serve) The daemon binds to it, where its
        receivers reach it. V(pull) The node's connections to its sources come from it (what their servers and
        firewalls admit).
    type: str
  peers:
    description: V(serve) Addresses of the node's planned receivers, the only ones it admits.
    type: list
    elements: str
    default: []
  max_connections:
    description: V(serve) Pulls served at once.
    type: int
    default: 2
  lifetime_s:
    description: V(serve) Seconds after which the daemon ends and the firewall drops the peers, whatever happens.
    type: int
    default: 21600
  firewall:
    description: V(serve) and V(stop) manage the peers in table C(inet atlas) (when the node has it).
    type: bool
    default: true
  name:
    description: V(pull) and V(verify) The tree's name on the staging servers (the same for V(path), V(manifest),
      V(prefix), V(stamp_file), V(links), V(linked_from), V(linked_models_root)).
    type: str
  path:
    description: V(pull) Where the tree lives on this node.
    type: path
  manifest:
    description:
      - V(pull) The signed manifest on this node that lists the tree (for a model, the bundle's C(manifest.json)).
        Empty for a bundle, whose manifest comes from the source.
    type: path
  prefix:
    description: V(pull) Use the manifest's entries under this directory, stripped (C(models/<name>/)).
    type: str
    default: ''
  stamp_file:
    description: V(pull) Verification stamps of the tree (those of C(model_verify) for the same tree).
    type: path
  links:
    description: V(pull) As C(model_verify)'s O(links).
    type: str
    choices: [follow, refuse]
    default: follow
  linked_from:
    description: V(pull) As C(model_verify)'s O(linked_from).
    type: list
    elements: path
    default: []
  linked_models_root:
    description: V(pull) As C(model_verify)'s O(linked_models_root).
    type: path
  chmod:
    description: V(pull) rsync's C(--chmod) for what is received (C(D0755,F0644) for a model version).
    type: str
    default: go-w
  delete:
    description: V(pull) Remove what the tree holds and its manifest does not list (never the node's own C(.atlas-*)).
    type: bool
    default: true
  link_dest:
    description: V(pull) Directories whose unchanged files are hard-linked instead of copied (rsync's C(--link-dest)).
    type: list
    elements: path
    default: []
  sources:
    description: V(pull) Peers to pull from, by inventory name, in order (the plan's parent, then its fallbacks).
    type: list
    elements: str
    default: []
  addresses:
    description: V(pull) Each source's address (its staging server), by name.
    type: dict
    default: {}
  origin:
    description: V(pull) A directory of this node holding the tree (the site's mirror share), tried last.
    type: path
  wait_s:
    description: V(pull) How long to wait for a busy source (its O(max_connections) reached).
    type: int
    default: 900
extends_documentation_fragment:
  - atlas.serving.module
  - atlas.serving.trusted_manifest
"""

EXAMPLES = r"""
- name: Serve verified trees to this node's planned receivers
  atlas.serving.fanout_stage:
    action: serve
    address: 10.21.0.11
    peers: [10.21.0.12, 10.22.0.11]

- name: Pull the bundle from the plan's parent, then a fallback
  atlas.serving.fanout_stage:
    action: pull
    name: bundle
    path: /srv/atlas-bundle
    manifest_sha256: "{{ atlas_bundle_manifest_sha256 }}"
    links: refuse
    stamp_file: /srv/atlas-bundle/.atlas-verified.json
    sources: [central-1, harbour-1]
    addresses: {central-1: 10.21.0.11, harbour-1: 10.22.0.11}

- name: Stop serving
  atlas.serving.fanout_stage:
    action: stop
"""

RETURN = r"""
source:
  description: V(pull) The source that completed the tree (empty when nothing was needed).
  returned: success
  type: str
verified:
  description: V(pull) Files verified.
  returned: success
  type: int
bytes_received:
  description: V(pull) Bytes received from the sources.
  returned: success
  type: int
tried:
  description: V(pull) Each source tried, its outcome (complete, refused, unavailable, busy, partial) and why.
  returned: success
  type: list
  elements: dict
refused:
  description: V(pull) Sources whose copy failed verification, with the files (never a source again in this pull).
  returned: success
  type: dict
complete:
  description: V(verify) Whether the tree is complete and verified on the node.
  returned: success
  type: bool
lacking:
  description: V(verify) Files missing, failing or extra (the first 20).
  returned: success
  type: list
  elements: str
firewall:
  description: V(serve) and V(stop) What was done in table C(inet atlas).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils import fanout_stage as stage  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.checksums import VerifyError  # noqa: E402
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError  # noqa: E402


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "required": True, "choices": ["pull", "serve", "stop", "verify"]},
            "server_dir": {"type": "path", "default": stage.SERVER_DIR},
            "port": {"type": "int", "default": stage.DEFAULT_PORT},
            "address": {"type": "str"},
            "peers": {"type": "list", "elements": "str", "default": []},
            "max_connections": {"type": "int", "default": stage.DEFAULT_MAX_CONNECTIONS},
            "lifetime_s": {"type": "int", "default": stage.DEFAULT_LIFETIME_S},
            "firewall": {"type": "bool", "default": True},
            "name": {"type": "str"},
            "path": {"type": "path"},
            "manifest": {"type": "path"},
            "manifest_sha256": {"type": "str"},
            "prefix": {"type": "str", "default": ""},
            "stamp_file": {"type": "path"},
            "links": {"type": "str", "default": "follow", "choices": ["follow", "refuse"]},
            "linked_from": {"type": "list", "elements": "path", "default": []},
            "linked_models_root": {"type": "path"},
            "chmod": {"type": "str", "default": "go-w"},
            "delete": {"type": "bool", "default": True},
            "link_dest": {"type": "list", "elements": "path", "default": []},
            "sources": {"type": "list", "elements": "str", "default": []},
            "addresses": {"type": "dict", "default": {}},
            "origin": {"type": "path"},
            "wait_s": {"type": "int", "default": stage.DEFAULT_WAIT_S},
        },
        required_if=[("action", "pull", ("name", "path", "manifest_sha256")),
                     ("action", "verify", ("name", "path", "manifest_sha256")), ("action", "serve", ("address",))],
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["action"] == "pull":
            tree = stage.tree_from_params(p)
            sources = stage.sources_from_params(p["sources"], p["addresses"], p["origin"] or "")
            result = stage.pull(tree, sources, port=p["port"], server_dir=p["server_dir"], address=p["address"] or "",
                                wait_s=p["wait_s"], check_mode=module.check_mode)
        elif p["action"] == "verify":
            result = stage.check(stage.tree_from_params(p), server_dir=p["server_dir"], check_mode=module.check_mode)
        elif module.check_mode:
            result = {"changed": False, "msg": f"check mode: the staging server would {p['action']}"}
        elif p["action"] == "serve":
            result = stage.serve(p["server_dir"], address=p["address"], port=p["port"], peers=p["peers"],
                                 max_connections=p["max_connections"], lifetime_s=p["lifetime_s"],
                                 firewall=p["firewall"])
        else:
            result = stage.stop(p["server_dir"], firewall=p["firewall"])
    except stage.StageError as exc:
        module.fail_json(msg=str(exc), **{k: v for k, v in exc.result.items() if k != "changed"})
    except (ManifestError, VerifyError, OSError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
