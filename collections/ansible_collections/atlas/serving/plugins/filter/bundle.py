"""Filters of the bundle_trust role (logic in module_utils/bundle_record.py).

``bundle_record_check``  the verified manifest (slurp content) + its sha256 + the node's record (slurp result)
                         -> {problem, warning, record, record_text}: downgrade protection
"""

from __future__ import annotations

import base64
import binascii
import json

from ansible_collections.atlas.serving.plugins.module_utils import bundle_record


def bundle_record_check(content: str, sha256: str, record: dict, allow_downgrade: object = False,
                        where: str = "this node") -> dict:
    """``content``: the manifest bytes whose signature was verified (base64, as ``slurp`` returns them);
    ``record``: the ``slurp`` result of the node's ``atlas_bundle_record`` (failed when there is none)."""
    try:
        data = json.loads(base64.b64decode(str(content), validate=True).decode("utf-8"))
    except (binascii.Error, ValueError) as exc:
        return bundle_record.Judgement(problem=f"{where}: the verified manifest.json cannot be read: {exc}").as_dict()
    record = record if isinstance(record, dict) else {}
    text = None
    if "content" in record:
        try:
            text = base64.b64decode(str(record["content"]), validate=True).decode("utf-8")
        except (binascii.Error, ValueError) as exc:
            return bundle_record.Judgement(problem=f"{where}: its bundle record cannot be read: {exc}").as_dict()
    elif "not found" not in str(record.get("msg", "file not found")):
        return bundle_record.Judgement(problem=f"{where}: its bundle record cannot be read: {record.get('msg')}; "
                                               "check atlas_bundle_record").as_dict()
    allow = str(allow_downgrade).strip().lower() in ("true", "yes", "on", "1", "y")
    return bundle_record.judge(data, str(sha256), text, allow_downgrade=allow, where=str(where)).as_dict()


class FilterModule:
    def filters(self):
        return {"bundle_record_check": bundle_record_check}
