# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An inventory's own additions to the suite's data: serving profiles and compatibility rows.

Controller only (never shipped to a node). Two inventory variables, documented in roles/serving
(README, meta/argument_specs.yml), roles/preflight and DESIGN.md ("An inventory's own data"):

``serving_profile_dirs``
    directories searched for ``<serving_profile>.yml`` before the serving role's own
    ``vars/profiles``; a profile name found in two places is an error naming both files.
``atlas_compat_extra_tables``
    table files (the format of ``data/compat.yml``, every row with its source) whose rows are
    added to the product's table; only such a file may hold a lab row (``lab: true``).

A relative path is relative to the inventory directory: the directory given with ``-i``, or the
one holding the file given (Ansible: the first of ``ansible_inventory_sources``; atlasctl: its
``-i``), so an inventory copied elsewhere keeps its additions beside it.

One implementation for the roles (the atlas.serving filters ``inventory_paths``,
``profile_resolve`` and the compat filters) and for atlasctl (``config``, ``compat``,
``doctor``). Files are read with PyYAML, a dependency of ansible-core, or with the caller's
``read(path, what)`` (atlasctl's own reader, whose errors name the file the same way as its others).
"""

from __future__ import annotations

import glob
import os

from ansible_collections.atlas.serving.plugins.module_utils import compat

# The mapping a profile file holds (the serving role's include_vars name for it).
PROFILE_KEY = "__serving_profile"
PROFILE_DIRS_VAR = "serving_profile_dirs"
COMPAT_TABLES_VAR = "atlas_compat_extra_tables"


class SiteDataError(ValueError):
    """A bad addition: the message names the variable or file and the fix."""


def inventory_dir(sources):
    """The directory relative paths are resolved against: the first inventory source if it is a
    directory, else the directory holding it. ``sources``: a path or ``ansible_inventory_sources``."""
    if isinstance(sources, (list, tuple)):
        sources = sources[0] if sources else ""
    if not sources:
        raise SiteDataError("no inventory source to resolve relative paths against: pass -i INV, or give "
                            "absolute paths")
    source = os.path.abspath(os.path.expanduser(str(sources)))
    return source if os.path.isdir(source) else os.path.dirname(source)


def resolve_paths(values, variable, sources):
    """``values`` (a list of paths; None or empty: none) as absolute paths, relative ones joined to
    the inventory directory of ``sources``."""
    if values in (None, "", []):
        return []
    if not isinstance(values, (list, tuple)):
        raise SiteDataError(f"{variable} must be a list of paths, not {type(values).__name__} {values!r}: "
                            f"write e.g. {variable}: [{'profiles' if variable == PROFILE_DIRS_VAR else 'compat.yml'}]")
    out = []
    for index, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise SiteDataError(f"{variable}[{index}] must be a path (a non-empty string), not {value!r}")
        path = os.path.expanduser(value.strip())
        if not os.path.isabs(path):
            path = os.path.join(inventory_dir(sources), path)
        path = os.path.normpath(path)
        if path not in out:
            out.append(path)
    return out


def _read_yaml(path, what):
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise SiteDataError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SiteDataError(f"{what} {path} is not UTF-8 text: {exc}") from None
    except yaml.YAMLError as exc:
        raise SiteDataError(f"{what} {path} is not valid YAML: {exc}") from None


# --- serving profiles -------------------------------------------------------------------------


def profile_files(dirs, own_dir):
    """{name: file} of every profile on the search path: ``dirs`` (absolute, from
    serving_profile_dirs) first, then ``own_dir`` (the serving role's vars/profiles)."""
    found = {}
    for directory in [*dirs, own_dir]:
        if not os.path.isdir(directory):
            raise SiteDataError(f"{PROFILE_DIRS_VAR}: {directory} is not a directory: create it, or remove it "
                                f"from {PROFILE_DIRS_VAR} (relative paths are relative to the inventory directory)")
        for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.yml"))):
            name = os.path.basename(path)[: -len(".yml")]
            if name in found:
                raise SiteDataError(f"serving profile {name!r} is in two places: {found[name]} and {path}; a "
                                    f"profile name must be unique over {PROFILE_DIRS_VAR} and the serving role's "
                                    "vars/profiles: rename or remove one")
            found[name] = path
    return found


def find_profile(name, dirs, own_dir):
    """The file of profile ``name``; an unknown name is an error listing the ones there are."""
    files = profile_files(dirs, own_dir)
    if name not in files:
        where = ", ".join([*dirs, own_dir])
        raise SiteDataError(f"serving_profile {name!r} is not a profile in {where}. Choose one of: "
                            f"{', '.join(sorted(files))} (or add its directory to {PROFILE_DIRS_VAR})")
    return files[name]


def load_profile(path, read=None):
    """The profile mapping of a profile file (its ``__serving_profile``), as written."""
    data = (read or _read_yaml)(path, "serving profile")
    profile = data.get(PROFILE_KEY) if isinstance(data, dict) else None
    if not isinstance(profile, dict):
        raise SiteDataError(f"serving profile {path} has no {PROFILE_KEY} mapping: a profile file holds "
                            f"{PROFILE_KEY}: {{engine, engine_release, port, command, flags, env}} "
                            "(see roles/serving/vars/profiles/*.yml)")
    return profile


def resolve_profile(name, dirs, own_dir, read=None):
    """What the serving role publishes as ``serving_profile_resolved``: the profile as written
    (``{{ }}`` placeholders unresolved) with its ``name`` and ``file``."""
    path = find_profile(name, dirs, own_dir)
    return {**load_profile(path, read), "name": name, "file": path}


# --- compatibility table ----------------------------------------------------------------------


def _check(table, path, extra):
    try:
        return compat.check_table(table, extra=extra)
    except compat.CompatTableError as exc:
        raise SiteDataError(f"{path}: {exc}") from None


def load_compat(table_path="", extra_paths=(), read=None):
    """The product's table (``table_path``, default the collection's data/compat.yml), checked, with
    the rows of each extra table (absolute paths from atlas_compat_extra_tables) added after its own."""
    read = read or _read_yaml
    base_path = table_path or compat.default_table_path()
    table = _check(read(base_path, "compatibility table"), base_path, extra=False)
    if not extra_paths:
        return table
    merged = {**table, "sources": dict(table.get("sources") or {})}
    origin = {key: base_path for key in merged["sources"]}
    for section in compat.TABLE_SECTIONS:
        merged[section] = list(table[section])
    rows = {(r["engine"], tuple(map(str, r["versions"]))): base_path for r in table["engines"]}
    for path in extra_paths:
        extra = _check(read(path, "compatibility table"), path, extra=True)
        for key, source in (extra.get("sources") or {}).items():
            if key in merged["sources"] and merged["sources"][key] != source:
                raise SiteDataError(f"{path}: source {key!r} is already defined differently in {origin[key]}: "
                                    "give the extra table's source a name of its own")
            merged["sources"][key] = source
            origin.setdefault(key, path)
        for index, row in enumerate(extra.get("engines") or []):
            key = (row["engine"], tuple(map(str, row["versions"])))
            if key in rows:
                raise SiteDataError(f"{path}: engines[{index}] ({row['engine']} {'/'.join(key[1])}) is already a row "
                                    f"of {rows[key]}: an extra table adds releases, it does not replace rows")
            rows[key] = path
        for section in compat.TABLE_SECTIONS:
            merged[section] += list(extra.get(section) or [])
    return merged
