"""Lab fixtures: a fresh lab per test module, always brought down afterwards."""

from __future__ import annotations

import pytest
from labtools import fresh_lab_session, lab_hosts, lab_prerequisites


@pytest.fixture(scope="module")
def fresh_lab():
    """Fresh lab with the lab bundle built; yields the inventory's atlas_nodes hosts."""
    reason = lab_prerequisites()
    if reason:
        pytest.skip(reason)
    with fresh_lab_session(bundle=True):
        yield lab_hosts()
