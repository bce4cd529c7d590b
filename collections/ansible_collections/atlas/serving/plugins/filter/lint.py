"""Filters of the atlas.serving collection: engine configuration lint.

``engine_lint``  argv list -> list of findings (dicts: kind, subject, message) against the schema of the
                 release it targets; ``env`` and ``release`` are arguments. Empty list: every flag, value
                 and variable is real. Usage::

                     {{ __serving_argv | atlas.serving.engine_lint(__serving_env, 'vllm-ascend-0.11.0') }}

The logic is module_utils/engine_lint.py (shared with ``atlasctl config lint``).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import engine_lint as _lint


def engine_lint(argv: list, env: dict, release: str) -> list[dict]:
    try:
        return _lint.lint(list(argv), dict(env or {}), str(release))
    except _lint.LintError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {"engine_lint": engine_lint}
