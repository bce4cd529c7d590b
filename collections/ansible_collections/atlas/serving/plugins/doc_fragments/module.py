# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every module of atlas.serving documents the same way: its authors and its attributes.

The support levels are those of every module here unless it states otherwise: check mode (each module
declares ``supports_check_mode=True``; ansible-test's validate-modules fails a module whose declaration
and ``check_mode`` support disagree), no diff (a module that returns one, as ``paths`` and
``hccn_config`` do, states ``diff_mode: support: full``). ``atlas.serving.module.facts`` adds the
``facts`` attribute of the fact modules. The authors have no GitHub account to name, which
``(!UNKNOWN)`` states (ansible-test's author format).
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options: {}
author:
  - atlas-serving contributors (!UNKNOWN)
attributes:
  check_mode:
    description: Can run in check mode and return the changed status it predicts without modifying the node.
    support: full
  diff_mode:
    description: Returns what it changed (or would change, in check mode) when run with C(--diff).
    support: none
"""

    FACTS = r"""
options: {}
attributes:
  facts:
    description: Returns an C(ansible_facts) dictionary that updates the host's facts.
    support: full
"""
