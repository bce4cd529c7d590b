"""Where the lab keeps its state and caches (see DESIGN.md, 'Machine-wide locations')."""

from __future__ import annotations

import os
from pathlib import Path

from atlasctl.paths import cache_dir, repo_root

DEFAULT_CONFIG = Path("inventory/lab/lab.yml")
DEFAULT_LAB_DIR = "/var/lib/atlas-lab"
__all__ = ["cache_dir", "lab_dir", "repo_root"]


def lab_dir() -> Path:
    return Path(os.environ.get("ATLAS_LAB_DIR") or DEFAULT_LAB_DIR)


def base_dir() -> Path:
    return lab_dir() / "base"


def nodes_dir() -> Path:
    return lab_dir() / "nodes"


def node_dir(name: str) -> Path:
    return nodes_dir() / name


def ssh_dir() -> Path:
    return lab_dir() / "ssh"


def private_key() -> Path:
    return ssh_dir() / "id_ed25519"


def known_hosts() -> Path:
    return ssh_dir() / "known_hosts"


def bundle_dir() -> Path:
    return lab_dir() / "bundle"


def fabric_dir() -> Path:
    """Where every node's hccn_tool double publishes its NPU addresses (bind-mounted into each node)."""
    return lab_dir() / "npu-fabric"


def state_file() -> Path:
    return lab_dir() / "state.json"


def resolve_config(path: str | os.PathLike[str] | None) -> Path:
    """Resolve a lab.yml path: absolute as given, else relative to the cwd, else to the repo root."""
    candidate = Path(path) if path else DEFAULT_CONFIG
    if candidate.is_absolute():
        return candidate
    for root in (Path.cwd(), repo_root()):
        if (root / candidate).is_file():
            return (root / candidate).resolve()
    return (repo_root() / candidate).resolve()
