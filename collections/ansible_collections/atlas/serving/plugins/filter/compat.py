"""Filters of the release compatibility gate (logic in module_utils/compat.py, data in data/compat.yml
plus the inventory's extra tables, ``extra_tables``: absolute paths, plugin_utils/site_data.py).

``compat_plans``  play hosts + hostvars + {field: variable} -> {host: plan}
``compat_fleet``  {host: plan} -> verdict of the whole fleet (ok, groups, report)
``compat_check``  one plan -> its verdict
``compat_driver`` CANN version + node driver version -> '' or the sentence naming the mismatch
``compat_driver_outside``  CANN version + driver version -> '' or the sentence, only where the driver is outside
                  the CANN's known window (a pair mismatch with no window known is not said)
``compat_glibc``  ``getconf GNU_LIBC_VERSION`` output + engine + version -> '' or the sentence refusing a node whose
                  glibc is older than the release's engine wheel set needs
``compat_no_return``  levels before + after ({driver, cann, runtime}) -> why moving them cannot be rolled back
                  ([]: it can; plugin_utils/platform_plan.py ``no_return``)
"""

from __future__ import annotations

import functools

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import compat
from ansible_collections.atlas.serving.plugins.plugin_utils import platform_plan, site_data


@functools.lru_cache(maxsize=8)
def _load(path: str, extra: tuple = ()) -> dict:
    try:
        return site_data.load_compat(path, extra)
    except site_data.SiteDataError as exc:
        raise AnsibleFilterError(str(exc)) from None


def _extra(extra_tables) -> tuple:
    """The extra tables as absolute paths (preflight_compat_extra_tables: resolved by inventory_paths)."""
    if extra_tables in (None, "", []):
        return ()
    if not isinstance(extra_tables, (list, tuple)) or not all(isinstance(p, str) for p in extra_tables):
        raise AnsibleFilterError(f"compat filters: extra_tables must be a list of paths, not {extra_tables!r}")
    return tuple(extra_tables)


def compat_plans(hosts: list, hostvars, keys: dict) -> dict:
    """Build each host's plan from its inventory variables named in ``keys`` (field -> variable)."""
    if not isinstance(keys, dict):
        raise AnsibleFilterError("compat_plans: keys must map plan fields to variable names")
    plans = {}
    for host in hosts:
        hv = hostvars[host]
        plans[host] = {field: str(hv[var]) if var in hv and hv[var] not in (None, "") else ""
                       for field, var in keys.items()}
    return plans


def compat_fleet(plans: dict, table_path: str = "", extra_tables=None) -> dict:
    return compat.evaluate_fleet(plans, _load(table_path, _extra(extra_tables)))


def compat_check(plan: dict, table_path: str = "", extra_tables=None) -> dict:
    return compat.evaluate(plan, _load(table_path, _extra(extra_tables)))


def compat_driver(cann: str, driver: str, table_path: str = "", extra_tables=None) -> str:
    return compat.check_driver(_load(table_path, _extra(extra_tables)), cann, driver) or ""


def compat_driver_outside(cann: str, driver: str, table_path: str = "", extra_tables=None) -> str:
    table = _load(table_path, _extra(extra_tables))
    if compat.driver_in_window(table, cann, driver) is False:
        return compat.check_driver(table, cann, driver) or ""
    return ""


def compat_glibc(getconf_output: str, engine: str, version: str, node: str = "", os_label: str = "",
                 table_path: str = "", extra_tables=None) -> str:
    return compat.check_glibc(_load(table_path, _extra(extra_tables)), str(engine or ""), str(version or ""),
                              str(getconf_output or ""), str(node or ""), str(os_label or ""))


def compat_no_return(before: dict, after: dict, table_path: str = "", extra_tables=None) -> list:
    levels = ("driver", "firmware", "cann", "runtime")
    return platform_plan.no_return({k: str((before or {}).get(k) or "") for k in levels},
                                   {k: str((after or {}).get(k) or "") for k in levels},
                                   _load(table_path, _extra(extra_tables)))


class FilterModule:
    def filters(self):
        return {
            "compat_plans": compat_plans,
            "compat_fleet": compat_fleet,
            "compat_check": compat_check,
            "compat_driver": compat_driver,
            "compat_driver_outside": compat_driver_outside,
            "compat_glibc": compat_glibc,
            "compat_no_return": compat_no_return,
        }
