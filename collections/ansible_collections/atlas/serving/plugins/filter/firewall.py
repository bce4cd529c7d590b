# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the node firewall (plugin_utils/firewall.py):

``firewall_rules``  a host + the inventory -> the accepting rules of its nftables input chain
``firewall_sets``   anything -> the named sets the table declares (the fan-out staging peers)
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.plugin_utils import firewall


def firewall_rules(host, hostvars, groups, **options):
    try:
        return firewall.rules(host, hostvars, groups, **options)
    except firewall.FirewallError as exc:
        raise AnsibleFilterError(f"{host}: {exc}") from None


def firewall_sets(_unused=None):
    return firewall.sets()


class FilterModule:
    def filters(self):
        return {"firewall_rules": firewall_rules, "firewall_sets": firewall_sets}
