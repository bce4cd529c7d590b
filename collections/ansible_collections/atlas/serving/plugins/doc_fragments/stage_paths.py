# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stage's paths as M(atlas.serving.paths) brings them to their state and M(atlas.serving.stage_state)
compares them (module_utils/paths.py, the same code)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  directories:
    description: Directories, parents before children.
    type: list
    elements: path
    default: []
  files:
    description:
      - Files, as C(dest), C(content) (text), C(mode) (octal string, default C(0644)), C(owner) and
        C(group) (default C(root)). Their directories must exist (list them in O(directories)).
    type: list
    elements: dict
    default: []
  links:
    description: Links, as C(dest) (the link) and C(src) (what it points at, stored as given).
    type: list
    elements: dict
    default: []
  inspect:
    description:
      - Paths read before anything is changed (a link's target, not followed), returned as RV(inspected);
        what a stage needs to know about paths it does not manage, in the same round trip.
    type: list
    elements: path
    default: []
  mode:
    description: Mode of the directories (octal string).
    type: str
    default: "0755"
  owner:
    description: Owner of the directories.
    type: str
    default: root
  group:
    description: Group of the directories.
    type: str
    default: root
"""
