# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the branch gateway (plugin_utils/gateway.py):

``gateway_keys_map``  the keys the branch's nodes accept -> the body of nginx's key map (0600 include file)
``gateway_keys_problem``  the same keys -> '' or why they are refused (never naming a key: not a secret)
``gateway_trusted_sources``  the monitoring hosts + gateway_backend_header_sources -> networks for nginx geo
``gateway_paths``     gateway_extra_paths + the members' service records -> the API paths the gateway forwards
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.plugin_utils import gateway


def gateway_keys_map(keys, allow_none=False, branch=""):
    try:
        return gateway.keys_map(keys, allow_none=bool(allow_none), branch=branch)
    except gateway.GatewayError as exc:
        raise AnsibleFilterError(str(exc)) from None


def gateway_keys_problem(keys, allow_none=False, branch=""):
    return gateway.keys_problem(keys, allow_none=bool(allow_none), branch=branch)


def gateway_paths(extra, records=None):
    """``records``: {node: its service record} (the gateway stage's first play reads them)."""
    try:
        return gateway.paths(extra, sorted((records or {}).items()))
    except gateway.GatewayError as exc:
        raise AnsibleFilterError(str(exc)) from None


def gateway_trusted_sources(monitoring_hosts, hostvars, extra=()):
    pairs = [(h, (hostvars.get(h) or {}).get("ansible_host") or h) for h in monitoring_hosts or []]
    try:
        return gateway.trusted_sources(pairs, extra)
    except gateway.GatewayError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"gateway_keys_map": gateway_keys_map, "gateway_keys_problem": gateway_keys_problem,
                "gateway_paths": gateway_paths, "gateway_trusted_sources": gateway_trusted_sources}
