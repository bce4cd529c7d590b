# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The option of the modules that read the installed CANN stack (module_utils/cann.py)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  install_path:
    description:
      - Root of the Ascend installation, as passed to the installers with C(--install-path).
    type: path
    default: /usr/local/Ascend
"""
