"""The lab inventory's own data, for unit tests that need the lab's profiles or compatibility rows
without a lab (inventory/lab has no hosts.yml until `atlas-lab up`): serving_profile_dirs and
atlas_compat_extra_tables of inventory/lab/group_vars/all.yml, resolved as the roles resolve them
(plugin_utils/site_data.py, relative to the inventory directory)."""

from __future__ import annotations

from pathlib import Path

import yaml
from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as _site

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "inventory/lab"
LAB_VARS = yaml.safe_load((LAB / "group_vars/all.yml").read_text())
PROFILE_DIRS = [Path(p) for p in _site.resolve_paths(LAB_VARS["serving_profile_dirs"], "serving_profile_dirs",
                                                     str(LAB))]
COMPAT_TABLES = [Path(p) for p in _site.resolve_paths(LAB_VARS["atlas_compat_extra_tables"],
                                                      "atlas_compat_extra_tables", str(LAB))]
