# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of fan-out staging (plugin_utils/fanout.py, docs/fleet-scale.md):

``fanout_plan``  the hosts to stage + the inventory's groups -> the fan-out tree: rounds, each node's round,
                 sources (parent first, then fallbacks) and receivers
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.plugin_utils import fanout


def fanout_plan(hosts, groups, fanout_per_source=fanout.DEFAULT_FANOUT, roots=fanout.DEFAULT_ROOTS,
                fallbacks=fanout.DEFAULT_FALLBACKS, branch_prefix=fanout.BRANCH_PREFIX):
    try:
        return fanout.inventory_plan(list(hosts or []), groups or {}, branch_prefix, fanout=fanout_per_source,
                                     roots=roots, fallbacks=fallbacks)
    except fanout.FanoutError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {"fanout_plan": fanout_plan}
