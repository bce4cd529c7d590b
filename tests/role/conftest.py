"""Fixtures the role tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.driver_nodes import DRIVER, FIRMWARE, make_bundle


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle with the HDK driver and firmware packages (Huawei's installers' doubles) and its manifest."""
    return make_bundle(tmp_path_factory.mktemp("bundle"), DRIVER, FIRMWARE)
