# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A speculative decoding method against the wheel set that would run it: a method that needs a Python package
the set's ``requirements.lock`` does not pin is refused before the environment is installed.

The method is the ``method`` of the engine flag ``--speculative-config`` (a JSON object, as a string or as a
mapping). A value that is not a JSON object is not judged here: the engine's lint names it.

Standard library and this collection's module_utils only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import json
import re

from ansible_collections.atlas.serving.plugins.module_utils.wheel_hashes import canonical

FLAG = "--speculative-config"

# Speculative method -> the Python package (project name) the engine imports for it.
# vLLM v0.23.0: vllm/config/speculative.py (SpeculativeConfig._validate_suffix_decoding refuses the method
# "suffix" unless has_arctic_inference(), vllm/utils/import_utils.py) and vllm/v1/spec_decode/suffix_decoding.py
# (`from arctic_inference.suffix_decoding import SuffixDecodingCache`).
METHOD_PACKAGES: dict[str, str] = {
    "suffix": "arctic-inference",
}

_PIN_NAME = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)")


def lock_projects(lock_text: str) -> set[str]:
    """The projects a ``requirements.lock`` pins (canonical names); comments and blank lines skipped."""
    names = set()
    for raw in lock_text.splitlines():
        line = raw.split("#", 1)[0].strip()
        match = _PIN_NAME.match(line) if line and not line.startswith("-") else None
        if match:
            names.add(canonical(match["name"]))
    return names


def speculative_method(flags: dict | None) -> str | None:
    """The ``method`` of ``--speculative-config`` in ``flags``; None when the flag is absent, removed (false or
    null), not a JSON object, or names no method."""
    value = (flags or {}).get(FLAG)
    if value is None or value is False:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    method = value.get("method")
    return method if isinstance(method, str) and method else None


def speculative_problem(flags: dict | None, lock_text: str, node: str, wheelset: str) -> str:
    """``''``, or the sentence refusing ``node``'s release: the speculative method its flags ask for needs a
    package that ``wheelset``'s lock (``lock_text``) does not pin."""
    method = speculative_method(flags)
    package = METHOD_PACKAGES.get(method or "")
    if package is None or canonical(package) in lock_projects(lock_text):
        return ""
    return (f"{node}: refused before installing wheel set {wheelset}: the release's {FLAG} asks for the speculative "
            f"method {method!r}, which needs the Python package {package}, and the set's requirements.lock has no "
            f"{package}. Choose another speculative method (e.g. \"mtp\" or \"ngram\") or drop {FLAG}, or serve "
            f"a wheel set that carries {package} (e.g. vllm-ascend-0.23.0.post1, its wheels from Huawei's Ascend "
            "mirror)")
