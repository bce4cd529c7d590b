"""Filters of the release compatibility gate (logic in module_utils/compat.py, data in data/compat.yml).

``compat_plans``  play hosts + hostvars + {field: variable} -> {host: plan}
``compat_fleet``  {host: plan} -> verdict of the whole fleet (ok, groups, report)
``compat_check``  one plan -> its verdict
``compat_driver`` CANN version + node driver version -> '' or the sentence naming the mismatch
"""

from __future__ import annotations

import functools

import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import compat


@functools.lru_cache(maxsize=8)
def _load(path: str) -> dict:
    path = path or compat.default_table_path()
    try:
        with open(path, encoding="utf-8") as fh:
            table = yaml.safe_load(fh)
    except OSError as exc:
        raise AnsibleFilterError(f"compatibility table {path} cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        raise AnsibleFilterError(f"compatibility table {path} is not valid YAML: {exc}") from None
    try:
        return compat.check_table(table)
    except compat.CompatTableError as exc:
        raise AnsibleFilterError(f"{path}: {exc}") from None


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


def compat_fleet(plans: dict, table_path: str = "") -> dict:
    return compat.evaluate_fleet(plans, _load(table_path))


def compat_check(plan: dict, table_path: str = "") -> dict:
    return compat.evaluate(plan, _load(table_path))


def compat_driver(cann: str, driver: str, table_path: str = "") -> str:
    return compat.check_driver(_load(table_path), cann, driver) or ""


class FilterModule:
    def filters(self):
        return {
            "compat_plans": compat_plans,
            "compat_fleet": compat_fleet,
            "compat_check": compat_check,
            "compat_driver": compat_driver,
        }
