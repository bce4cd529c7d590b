"""Make the atlas.serving collection's module_utils importable from atlasctl and its tests.

The collection lives in ``<repo>/collections/ansible_collections/atlas/serving``; its
module_utils are plain standard-library Python, imported under the same name Ansible uses
(``ansible_collections.atlas.serving.plugins.module_utils.<name>``), so the CLI and the
modules run one implementation. ``ATLAS_COLLECTIONS_DIR`` overrides the location.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

from atlasctl.errors import EnvironmentProblem
from atlasctl.paths import suite_root

COLLECTION_PACKAGE = "ansible_collections.atlas.serving"


def collections_dir() -> Path:
    """``<suite>/collections`` (atlasctl.paths.suite_root: the checkout or the installed suite)."""
    override = os.environ.get("ATLAS_COLLECTIONS_DIR")
    if override:
        return Path(override)
    return suite_root() / "collections"


def ensure_on_path() -> Path:
    path = collections_dir()
    if not (path / "ansible_collections" / "atlas" / "serving").is_dir():
        raise EnvironmentProblem(
            f"{path}: the atlas.serving collection is not there",
            fix="reinstall atlasctl from its wheel (it carries the collection), or set ATLAS_COLLECTIONS_DIR",
        )
    text = str(path)
    if text not in sys.path:
        sys.path.insert(0, text)
    return path


def module_utils(name: str) -> ModuleType:
    """Import ``ansible_collections.atlas.serving.plugins.module_utils.<name>``."""
    ensure_on_path()
    return importlib.import_module(f"{COLLECTION_PACKAGE}.plugins.module_utils.{name}")


def plugin_utils(name: str) -> ModuleType:
    """Import ``ansible_collections.atlas.serving.plugins.plugin_utils.<name>`` (controller-side code the filters
    and atlasctl share; unlike module_utils it may use PyYAML, and it never ships to the nodes)."""
    ensure_on_path()
    return importlib.import_module(f"{COLLECTION_PACKAGE}.plugins.plugin_utils.{name}")
