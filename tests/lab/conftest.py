"""Lab fixtures: a fresh lab per test module, always brought down afterwards."""

from __future__ import annotations

import pytest
from labtools import atlasctl, lab_hosts, lab_prerequisites


@pytest.fixture(scope="module")
def fresh_lab():
    reason = lab_prerequisites()
    if reason:
        pytest.skip(reason)
    atlasctl("lab", "down", check=False)
    try:
        atlasctl("lab", "up")
        atlasctl("bundle", "build", "--spec", "inventory/lab/bundle.yml", timeout=1800)
        yield lab_hosts()
    finally:
        atlasctl("lab", "down", check=False)
