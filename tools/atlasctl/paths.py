"""Machine-wide locations (DESIGN.md), overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """The checkout atlasctl runs from (tools/atlasctl/ -> repository root)."""
    return Path(__file__).resolve().parents[2]


DEFAULT_CACHE_DIR = "/var/cache/atlas-serving"


def cache_dir() -> Path:
    return Path(os.environ.get("ATLAS_CACHE_DIR") or DEFAULT_CACHE_DIR)

