"""Filters of the engines role (logic in module_utils/wheel_hashes.py).

``wheel_requirements``  requirements.lock as read (slurp) + model_verify's files of the wheelhouse
                        -> the lock with each wheel's sha256 from the verified manifest (pip --require-hashes)
``speculative_problem`` the release's engine flags + requirements.lock as read (slurp)
                        -> '' or the refusal of a speculative method whose package the lock does not pin
                        (module_utils/speculative.py)
"""

from __future__ import annotations

import base64
import binascii

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils.speculative import (
    speculative_problem as _speculative_problem,
)
from ansible_collections.atlas.serving.plugins.module_utils.wheel_hashes import (
    LOCK,
    WHEEL_SUFFIX,
    LockError,
    hashed_requirements,
)


def wheel_requirements(content: str, verified_files: list, source: str) -> str:
    """``content``: the lock as ``slurp`` read it (base64); ``verified_files``: the ``files`` of
    atlas.serving.model_verify over the wheelhouse, each with the manifest's ``expected`` sha256."""
    try:
        lock = base64.b64decode(str(content), validate=True)
    except (binascii.Error, ValueError):
        raise AnsibleFilterError(f"{source}: the content read from the node is not base64 (not a slurp result)") \
            from None
    expected = {f["path"]: (f.get("expected") or {}).get("sha256") or "" for f in verified_files or []}
    wheels = {path: digest for path, digest in expected.items() if path.endswith(WHEEL_SUFFIX)}
    try:
        return hashed_requirements(lock, expected.get(LOCK, ""), wheels, source)
    except LockError as exc:
        raise AnsibleFilterError(str(exc)) from None


def speculative_problem(flags: dict, content: str, node: str, wheelset: str) -> str:
    """``flags``: the release's engine flags; ``content``: the wheel set's lock as ``slurp`` read it (base64)."""
    if flags is not None and not isinstance(flags, dict):
        raise AnsibleFilterError(f"speculative_problem expects a dict of engine flags, got {type(flags).__name__}")
    try:
        lock = base64.b64decode(str(content), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        raise AnsibleFilterError(f"{wheelset}: the requirements.lock read from the node is not base64 "
                                 "(not a slurp result)") from None
    return _speculative_problem(flags, lock, str(node), str(wheelset))


class FilterModule:
    def filters(self):
        return {"wheel_requirements": wheel_requirements, "speculative_problem": speculative_problem}
