# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option of the modules that read the NPUs with npu-smi (module_utils/npu_smi.py finds it)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  npu_smi_path:
    description:
      - Path of C(npu-smi). Default is C(npu-smi) on E(PATH), then C(/usr/local/bin), C(/usr/local/sbin),
        C(/usr/local/Ascend/driver/tools).
    type: path
"""
