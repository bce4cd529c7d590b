# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-out staging (module_utils/fanout_stage.py, docs/fleet-scale.md): what a node stages and from where. A tree
(where it lives, the signed manifest it must match, how it is written), a source (a peer's staging server or a
directory of the node), the staging's own paths and limits, its error, and the module's options read into them.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass

from ansible_collections.atlas.serving.plugins.module_utils.checksums import linked_trees

SERVER_DIR = "/run/atlas-fanout"
DEFAULT_PORT = 8873
DEFAULT_MAX_CONNECTIONS = 2
DEFAULT_LIFETIME_S = 6 * 3600
DEFAULT_WAIT_S = 900
PARTIAL_DIR = ".rsync-partial"
OWN_FILES = "/.atlas-*"  # the node's own files in a tree: stamps, a manifest on its way in
MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.asc"
IO_TIMEOUT_S = 300
TREE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class StageError(Exception):
    """The staging could not be done; the message names the tree, what is wrong and the fix; ``result``: what a
    pull did before it gave up (sources tried, refused)."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result or {}


@dataclass(frozen=True)
class Tree:
    """A tree this node stages: where it lives, what it must hold (the manifest, restricted to ``prefix``, whose
    bytes must have ``manifest_sha256``) and how it is written."""

    name: str
    path: str
    manifest_sha256: str
    manifest: str = ""  # the manifest on this node; '' for a bundle: it comes from the source (manifest_from_source)
    prefix: str = ""
    stamp_file: str = ""
    links: str = "follow"
    linked_from: tuple = ()
    chmod: str = "go-w"
    delete: bool = True
    link_dest: tuple = ()

    @property
    def manifest_from_source(self) -> bool:
        return not self.manifest


@dataclass(frozen=True)
class Source:
    """Where a tree can come from: a peer's server (``address``) or a directory of this node (``path``)."""

    name: str
    address: str = ""
    path: str = ""

    def url(self, tree: str, port: int) -> str:
        if self.path:
            return self.path.rstrip("/") + "/"
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"rsync://{host}:{port}/{tree}/"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not TREE_NAME.fullmatch(name):
        raise StageError(f"tree name {name!r}: use letters, digits, '.', '_' and '-' (at most 128), it names the "
                         "tree on the staging servers")
    return name


def check_address(value: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(str(value).strip("[]")))
    except ValueError:
        raise StageError(f"{what} {value!r} is not an IP address: the staging server binds to it and the firewall "
                         "admits addresses (set fanout_address, or ansible_host, to the node's IP address)") from None


def incoming_dir(server_dir: str, tree: Tree) -> str:
    return os.path.join(server_dir, "incoming", tree.name)


def tree_from_params(params: dict) -> Tree:
    """A :class:`Tree` from the module's options (one place for their names)."""
    linked = list(params.get("linked_from") or [])
    if params.get("linked_models_root"):
        linked += linked_trees(params["linked_models_root"])
    if not params.get("manifest_sha256"):
        raise StageError("manifest_sha256 is required: the sha256 of the manifest whose signature was verified")
    return Tree(name=check_name(params["name"]), path=params["path"], manifest_sha256=params["manifest_sha256"],
                manifest=params.get("manifest") or "", prefix=params.get("prefix") or "",
                stamp_file=params.get("stamp_file") or "", links=params.get("links") or "follow",
                linked_from=tuple(linked), chmod=params.get("chmod") or "go-w",
                delete=bool(params.get("delete", True)), link_dest=tuple(params.get("link_dest") or ()))


def sources_from_params(names, addresses, origin: str = "") -> list[Source]:
    """The peers ``names`` (in order) at their ``addresses`` ({name: address}), then ``origin`` (a directory)."""
    out = []
    for name in names or []:
        if name not in (addresses or {}):
            raise StageError(f"source {name}: no address given for it (addresses)")
        out.append(Source(str(name), address=check_address(addresses[name], f"source {name}'s address")))
    if origin:
        out.append(Source("origin", path=origin))
    return out
