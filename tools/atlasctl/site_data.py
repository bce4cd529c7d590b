"""An inventory's own additions to the suite's data, for the CLI (the roles read the same variables).

``serving_profile_dirs`` (profiles searched before the serving role's: ``atlasctl config``) and
``atlas_compat_extra_tables`` (rows added to the compatibility table: ``atlasctl compat``, ``doctor``),
read from the hosts' variables (``atlasctl.inventory``) and resolved, searched and merged by the
collection's plugin_utils/site_data.py: one implementation for the roles and the CLI.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atlasctl import inventory as shared
from atlasctl.errors import UsageError
from atlasctl.inputs import load_yaml
from atlasctl.runner import resolve_inventory

PROFILE_DIRS = "serving_profile_dirs"
COMPAT_TABLES = "atlas_compat_extra_tables"


def profile_dirs(inventory: str | Path | None, listing: dict[str, Any] | None = None) -> list[Path]:
    """The profile directories the inventory's hosts name (every host's, each once); none without one."""
    if not inventory:
        return []
    inv = resolve_inventory(inventory)
    return shared.path_list(inv, listing if listing is not None else shared.listing(inv), PROFILE_DIRS)


def compat_tables(inventory: str | Path | None, listing: dict[str, Any] | None = None) -> list[Path]:
    """The inventory's extra compatibility tables: one list for the whole inventory (as preflight's gate)."""
    if not inventory:
        return []
    inv = resolve_inventory(inventory)
    return shared.path_list(inv, listing if listing is not None else shared.listing(inv), COMPAT_TABLES,
                            same_on_every_host=True)


def load_compat(table: Path | None = None, extras: Sequence[Path] = ()) -> dict[str, Any]:
    """The compatibility table (``table``, default the collection's data/compat.yml), checked, with the
    rows of ``extras`` added after its own."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as site

    fix = "pass --table with a table like the collection's data/compat.yml"
    try:
        return site.load_compat(str(table or ""), [str(p) for p in extras],
                                lambda path, what: load_yaml(path, what, fix=fix))
    except site.SiteDataError as exc:
        raise UsageError(f"compatibility table {exc}", fix="every row needs engine, versions and a source its "
                         "table defines; a lab row (lab: true) belongs in an inventory's extra table") from None
