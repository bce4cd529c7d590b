# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load the collection's filter plugins once in ansible-playbook's main process, before it forks its workers."""

from __future__ import annotations

DOCUMENTATION = r"""
name: filter_preload
type: aggregate
short_description: Load the atlas.serving filter plugins once, before the workers fork
description:
  - Ansible forks a worker process per host and task. A worker that templates an C(atlas.serving) filter finds it
    by loading the collection's filter plugin files and the module_utils they import (compiled from source, the
    collection loader keeps no C(.pyc)) in that worker, and the work is lost when the worker exits. On a fleet
    run that is a quarter of the controller's CPU time.
  - This callback imports every filter plugin file of the collection once, in the main process, when the
    playbook starts; every worker forked after that inherits them (Ansible's plugin loader reuses a module
    already in C(sys.modules)). It prints nothing and changes no result.
  - The suite's C(ansible.cfg) enables it (C(callbacks_enabled)).
requirements: []
"""

import importlib  # noqa: E402
import pkgutil  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402

FILTER_PACKAGE = "ansible_collections.atlas.serving.plugins.filter"


def preload(package: str = FILTER_PACKAGE) -> list[str]:
    """Import every module of ``package`` (not its subpackages); the names imported, in order."""
    pkg = importlib.import_module(package)
    names = [info.name for info in pkgutil.iter_modules(pkg.__path__, prefix=package + ".") if not info.ispkg]
    for name in names:
        importlib.import_module(name)
    return names


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "atlas.serving.filter_preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        preload()
