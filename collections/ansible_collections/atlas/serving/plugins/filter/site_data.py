"""Filters of an inventory's own data (logic in plugin_utils/site_data.py).

``inventory_paths``  a list of paths + its variable's name + ansible_inventory_sources -> absolute paths
                     (relative ones against the inventory directory)
``profile_resolve``  serving_profile + serving_profile_dirs + ansible_inventory_sources + the serving
                     role's vars/profiles -> the profile as written, with its name and file
                     (the serving role's published fact serving_profile_resolved)
``profile_fill``     a resolved profile + {placeholder: value} -> the profile with its placeholders filled
                     (serving_model_path, serving_served_model_name, serving_host, __serving_port,
                     ansible_host): data, never evaluated as a template
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.plugin_utils import site_data


def inventory_paths(values, variable: str, sources) -> list:
    try:
        return site_data.resolve_paths(values, variable, sources)
    except site_data.SiteDataError as exc:
        raise AnsibleFilterError(str(exc)) from None


def profile_resolve(name: str, dirs, sources, own_dir: str) -> dict:
    try:
        found = site_data.resolve_paths(dirs, site_data.PROFILE_DIRS_VAR, sources)
        return site_data.resolve_profile(str(name), found, own_dir)
    except site_data.SiteDataError as exc:
        raise AnsibleFilterError(str(exc)) from None


def profile_fill(profile: dict, values: dict) -> dict:
    data = {key: value for key, value in profile.items() if key not in ("name", "file")}
    try:
        filled = site_data.fill_placeholders(data, dict(values or {}), str(profile.get("file", "")))
    except site_data.SiteDataError as exc:
        raise AnsibleFilterError(str(exc)) from None
    return {**profile, **filled}


class FilterModule:
    def filters(self):
        return {"inventory_paths": inventory_paths, "profile_resolve": profile_resolve, "profile_fill": profile_fill}
