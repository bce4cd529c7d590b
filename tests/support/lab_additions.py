"""The lab inventory's own data, for tests that need the lab's profiles, compatibility rows or branch hosts
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


def branch_hosts() -> dict:
    """Two hosts with the lab's variables: n1 of branch_east, n3 of branch_west (group_vars merged as Ansible does)."""
    group_vars = LAB / "group_vars"
    return {f"n{i}": LAB_VARS | yaml.safe_load((group_vars / f"{branch}.yml").read_text())
            for i, branch in ((1, "branch_east"), (3, "branch_west"))}
