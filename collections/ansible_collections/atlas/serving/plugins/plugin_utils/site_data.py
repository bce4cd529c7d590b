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
import math
import os
import re

from ansible_collections.atlas.serving.plugins.module_utils import compat, names
from ansible_collections.atlas.serving.plugins.module_utils.engine_lint import ENV_NAME, FLAG_NAME

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
    except ValueError as exc:  # a value PyYAML cannot build: a 5000-digit number, a date such as 2024-13-45
        reason = str(exc).split(";", maxsplit=1)[0]
        raise SiteDataError(f"{what} {path} has a value YAML cannot read: {reason} (quote it if it is text)") from None
    except RecursionError:
        raise SiteDataError(f"{what} {path} is nested too deeply to be a configuration file") from None


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
    """The file of profile ``name`` (a profile name: module_utils/names.py); an unknown name is an error
    listing the ones there are."""
    try:
        names.check(name, "profile", "serving_profile")
    except names.BadName as exc:
        raise SiteDataError(f"{exc}: {exc.rule}") from None
    files = profile_files(dirs, own_dir)
    if name not in files:
        where = ", ".join([*dirs, own_dir])
        raise SiteDataError(f"serving_profile {name!r} is not a profile in {where}. Choose one of: "
                            f"{', '.join(sorted(files))} (or add its directory to {PROFILE_DIRS_VAR})")
    return files[name]


def load_profile(path, read=None):
    """The profile mapping of a profile file (its ``__serving_profile``), as written and checked
    (:func:`check_profile`): whatever reads a profile reads it through here."""
    data = (read or _read_yaml)(path, "serving profile")
    profile = data.get(PROFILE_KEY) if isinstance(data, dict) else None
    if not isinstance(profile, dict):
        raise SiteDataError(f"serving profile {path} has no {PROFILE_KEY} mapping: a profile file holds "
                            f"{PROFILE_KEY}: {{engine, engine_release, port, command, flags, env}} "
                            "(see roles/serving/vars/profiles/*.yml)")
    check_profile(profile, path)
    return profile


def resolve_profile(name, dirs, own_dir, read=None):
    """What the serving role publishes as ``serving_profile_resolved``: the profile as written
    (``{{ }}`` placeholders unfilled) with its ``name`` and ``file``."""
    path = find_profile(name, dirs, own_dir)
    return {**load_profile(path, read), "name": name, "file": path}


# --- what a profile may hold ------------------------------------------------------------------
#
# A profile is data. The only templates in it are placeholders for what differs per host, filled by
# fill_placeholders (the serving role's tasks/profile.yml through the atlas.serving.profile_fill
# filter, and atlasctl config render): ``{{ NAME }}`` or ``{{ NAME | default('text') }}`` with NAME
# one of PLACEHOLDERS. Any other Jinja (an expression, a filter, a lookup, {% %}, {# #}) is refused
# when the profile is read, so no profile string is ever evaluated as a template, on the controller
# or anywhere else.

PLACEHOLDERS = ("serving_model_path", "serving_served_model_name", "serving_host", "__serving_port", "ansible_host")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\|\s*default\(\s*'([^'\\{}%#]*)'\s*\)\s*)?\}\}")
_TEMPLATE_MARK = re.compile(r"\{[{%#]")
_REQUIRED = ("engine", "engine_release", "port", "command", "flags", "env")
_PLACEHOLDER_FIX = ("a profile is data: its only templates are the placeholders "
                    + ", ".join(f"{{{{ {name} }}}}" for name in PLACEHOLDERS)
                    + " (optionally with | default('text')); write the value itself")


def _place(where, key):
    return f"{where}[{key!r}]" if where else str(key)


def _check_text(text, where, path):
    """``text`` holds no template but PLACEHOLDERS."""
    for match in _PLACEHOLDER.finditer(text):
        if match.group(1) not in PLACEHOLDERS:
            raise SiteDataError(f"serving profile {path}: {where}: {{{{ {match.group(1)} }}}} is not a placeholder "
                                f"a profile may use: {_PLACEHOLDER_FIX}")
    if _TEMPLATE_MARK.search(_PLACEHOLDER.sub("", text)):
        raise SiteDataError(f"serving profile {path}: {where}: {text!r} is a template: {_PLACEHOLDER_FIX}")


def _check_data(value, where, path):
    """Every string of ``value`` holds no template but PLACEHOLDERS (keys none at all); every number is finite."""
    if isinstance(value, str):
        _check_text(value, where, path)
    elif isinstance(value, float) and not math.isfinite(value):
        raise SiteDataError(f"serving profile {path}: {where} is {value}: write a finite number")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or _TEMPLATE_MARK.search(key):
                raise SiteDataError(f"serving profile {path}: {_place(where, key)}: the key {key!r} is not plain "
                                    "text: write a name (quoted if YAML would read it as something else)")
            _check_data(item, _place(where, key), path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_data(item, f"{where}[{index}]", path)
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise SiteDataError(f"serving profile {path}: {where} is a {type(value).__name__} ({value!r}): write "
                            "text, a number, true/false, a list or a mapping (quote a date)")


def _scalar(value):
    return value is None or isinstance(value, (str, bool, int, float))


def _flag_value(value):
    """A flag's value: one value, a list of values (argparse nargs) or a mapping (JSON)."""
    return _scalar(value) or isinstance(value, dict) or (
        isinstance(value, list) and all(_scalar(v) and v is not None for v in value))


def _whole(value, low, high=None):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)


def check_profile(profile, path):
    """Refuse a profile the serving role and atlasctl cannot use as data, naming the file, the field
    and the fix: a missing field, a field of the wrong kind, a template other than the placeholders,
    a number that is not finite. What an engine accepts is the lint's (module_utils/engine_lint.py)."""
    def bad(where, problem):
        raise SiteDataError(f"serving profile {path}: {where} {problem}")

    missing = [key for key in _REQUIRED if key not in profile]
    if missing:
        bad(PROFILE_KEY, f"lacks {', '.join(missing)}: a profile names engine, engine_release, port, command, "
                         "flags and env")
    _check_data(profile, "", path)
    for key, kind in (("engine", "engine"), ("engine_release", "engine"), ("model", "model")):
        value = profile.get(key)
        if (key != "model" or value is not None) and not names.is_name(value, kind):
            bad(key, f"is {names.shown(value)}: {names.problem(value, kind)}: write {names.KINDS[kind].rule} "
                     "(e.g. vllm, vllm-ascend-0.11.0, llama-2-70b-chat-hf)")
    if not _whole(profile["port"], 1, 65535):
        bad("port", f"is {profile['port']!r}: write the engine's TCP port, a whole number from 1 to 65535")
    hardware = profile.get("hardware")
    if hardware is not None and not isinstance(hardware, dict):
        bad("hardware", f"is {hardware!r}: write a mapping, e.g. {{npu_count: 8, hbm_mb: 65536}}")
    for key, value in (hardware or {}).items():
        if key in ("npu_count", "hbm_mb", "nodes") and not _whole(value, 1):
            bad(f"hardware.{key}", f"is {value!r}: write a whole number of at least 1 (hbm_mb: MB per NPU as "
                                   "npu-smi prints it, e.g. 65536)")
    for key in ("command", "cann_set_env", "image_entrypoint"):
        value = profile.get(key)
        listed = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
        if (key == "command" or value is not None) and not (listed and (value or key != "command")):
            bad(key, f"is {value!r}: write a list of non-empty strings (command: e.g. [bin/vllm, serve, "
                     "'{{ serving_model_path }}'])")
    mappings = (
        ("flags", FLAG_NAME, _flag_value, "flags: {--max-model-len: 2048}",
         "is not a flag: write it as the engine's command line spells it, --lower-case-with-dashes",
         "holds a list with a list, a mapping or null in it: write a value, a list of values, or a mapping "
         "(it becomes JSON)"),
        ("env", ENV_NAME, _scalar, "env: {HF_HUB_OFFLINE: 1}",
         "is not an environment variable name: letters, digits and _, not first a digit",
         "is not one value: an environment variable holds text, a number or true/false"))
    for field, pattern, value_ok, example, bad_name, bad_value in mappings:
        if not isinstance(profile[field], dict):
            bad(field, f"is a {type(profile[field]).__name__}, not a mapping: write one per line, e.g. {example}")
        for key, value in profile[field].items():
            if not pattern.fullmatch(key):
                bad(f"{field}[{key!r}]", bad_name)
            if not value_ok(value):
                bad(f"{field}[{key!r}]", bad_value)
    slo = profile.get("slo")
    if slo is not None and not isinstance(slo, dict):
        bad("slo", f"is {slo!r}: write a mapping, e.g. {{ttft_ms: 2000, tpot_ms: 100}}")


def fill_placeholders(profile, values, path=""):
    """``profile`` with its placeholders filled from ``values`` ({name: value}): a string that is one
    placeholder becomes the value itself (a port stays a number), others have it written in. A
    placeholder without a value takes its ``default('text')``; without one either it is an error. A value
    with a control or format character or a template delimiter (module_utils/names.py ``unsafe_text``) is an
    error. The result is data: nothing in it is evaluated again."""
    def value_of(match, where):
        name, default = match.group(1), match.group(2)
        value = values.get(name)
        if value is None:
            if default is None:
                raise SiteDataError(f"serving profile {path}: {where}: the placeholder {{{{ {name} }}}} has no "
                                    f"value here: set {name}, or write {{{{ {name} | default('text') }}}}")
            return default
        unsafe = names.unsafe_text(str(value))
        if unsafe:
            raise SiteDataError(f"serving profile {path}: {where}: the value of {{{{ {name} }}}} "
                                f"{names.shown(value)} cannot fill a placeholder: {unsafe}: set {name} to plain text")
        return value

    def fill(text, where):
        _check_text(text, where, path)
        whole = _PLACEHOLDER.fullmatch(text)
        if whole:
            return value_of(whole, where)
        return _PLACEHOLDER.sub(lambda match: str(value_of(match, where)), text)

    def walk(value, where):
        if isinstance(value, str):
            return fill(value, where)
        if isinstance(value, dict):
            return {key: walk(item, _place(where, key)) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return value

    return walk(profile, "")


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
