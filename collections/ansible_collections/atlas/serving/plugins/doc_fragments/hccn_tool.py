# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option of the modules that run hccn_tool (module_utils/hccn.py finds it)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  hccn_tool_path:
    description:
      - Path of C(hccn_tool). Default is C(hccn_tool) on E(PATH), then C(/usr/local/Ascend/driver/tools).
    type: path
"""
