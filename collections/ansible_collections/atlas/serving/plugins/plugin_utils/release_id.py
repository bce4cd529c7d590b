# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Release ids (``atlas_release_id``): one rule for ``atlasctl rollout --release`` and the serving role.

A release id names a directory on every node (``<serving_release_dir>/<id>``) and the rollout's report
files on the controller, so it is one path component: letters, digits, ``.``, ``_`` and ``-``, starting with
a letter or digit, at most 64 characters, never containing ``..``. The whole id is matched
(``re.fullmatch``): ``$`` would let a trailing newline through.

Controller only (never shipped to a node): the atlas.serving filter ``release_id_problem`` and atlasctl.
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils import names

# The grammar is module_utils/names.py's "release" kind (the one implementation of names).
RELEASE_ID = names.KINDS["release"].pattern
RULE = "one name of letters, digits and . _ - (at most 64 characters, no '..', no '/')"
EXAMPLE = "bank-2026.12.0"


def problem(value: object) -> str:
    """'' when ``value`` is a release id; else why not, the value escaped (``repr``: control characters show)."""
    if names.is_name(value, "release"):
        return ""
    return f"{names.shown(value)} is not a release id: {RULE}; it names a directory on every node"
