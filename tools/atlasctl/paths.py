"""Where atlasctl finds the suite it drives and keeps what it writes (DESIGN.md, "Installing").

The suite is the Ansible content: ``site.yml``, ``playbooks/``, ``roles/``, the ``atlas.serving``
collection, ``ansible.cfg``, the report templates and the example inventory. atlasctl runs it from
``ATLAS_SUITE_DIR`` when that is set, else from the checkout it runs in (``make venv``), else from
the copy its wheel installed (package data ``atlasctl/suite``, read through importlib.resources).
"""

from __future__ import annotations

import importlib.resources
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from atlasctl.errors import EnvironmentProblem

# What the suite is: copied into the wheel (setup.py) and into a bundle's suite/ (bundle_sources).
SUITE_ITEMS = ("site.yml", "ansible.cfg", "playbooks", "roles", "collections/ansible_collections/atlas/serving",
               "templates", "inventory/example-bank", "requirements-controller.txt")
# The file that marks a directory as the suite.
_MARKER = "site.yml"
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


def copy_items(root: Path, dest: Path, items: Iterable[str] = SUITE_ITEMS, *, missing_ok: bool = True) -> None:
    """Copy ``items`` (directories and files, relative to ``root``: by default the suite) to the same paths
    under ``dest``, without caches or dot files, over what is there. The one copy of the suite: into the
    wheel (setup.py), into a bundle's suite/, and the wheel's sources into a fresh build directory."""
    for item in items:
        src, target = Path(root) / item, Path(dest) / item
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True, ignore=_SKIP)
        elif src.is_file() or not missing_ok:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def checkout_root() -> Path | None:
    """The source checkout atlasctl runs from (tools/atlasctl/ -> its root), or None when installed."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / _MARKER).is_file() and (root / "tools" / "atlasctl").is_dir() else None


def installed_suite() -> Path:
    """The suite the wheel installed beside the package."""
    return Path(str(importlib.resources.files("atlasctl") / "suite"))


def suite_root() -> Path:
    """The suite atlasctl runs: ATLAS_SUITE_DIR, else the checkout, else the installed copy."""
    override = os.environ.get("ATLAS_SUITE_DIR")
    root = Path(override).expanduser().resolve() if override else (checkout_root() or installed_suite())
    if not (root / _MARKER).is_file():
        where = "ATLAS_SUITE_DIR" if override else "the installed atlasctl package"
        raise EnvironmentProblem(f"{root}: no {_MARKER} there ({where}), so there is no suite to run",
                                 fix="unset ATLAS_SUITE_DIR or point it at a directory with site.yml, "
                                     "or reinstall atlasctl from its wheel (pip install --no-index ...)")
    return root


def repo_root() -> Path:
    """The suite's root (kept for the lab and the benchmarks, which run from a checkout)."""
    return suite_root()


DEFAULT_CACHE_DIR = "/var/cache/atlas-serving"


def cache_dir() -> Path:
    return Path(os.environ.get("ATLAS_CACHE_DIR") or DEFAULT_CACHE_DIR)


def state_dir() -> Path:
    """What atlasctl writes (runs, rollout reports, benchmark results): ATLAS_STATE_DIR, else the
    checkout's artifacts/, else $XDG_STATE_HOME/atlasctl (~/.local/state/atlasctl)."""
    override = os.environ.get("ATLAS_STATE_DIR")
    if override:
        return Path(override).expanduser()
    checkout = checkout_root()
    if checkout is not None:
        return checkout / "artifacts"
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "atlasctl"
