"""Every test session runs this checkout's collection.

``import ansible_collections.atlas.serving...`` resolves through the Python path: the venv's
``atlas_serving_collection.pth`` (``make venv``) names the checkout the venv was made for. A checkout that
shares another's venv (a git worktree) puts its own ``collections/`` first on ``PYTHONPATH``, as it does its
``tools/``; without it the tests would run the other checkout's collection and say nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

# No per-example time limit for the property tests: `make test` runs them beside the lab tests at the lowest CPU
# priority (tests/make_test.py), where one example can wait hundreds of milliseconds for a core; a speed target is a
# benchmark figure, not a test's verdict. Loaded for every session; @settings on a test still sets its own.
settings.register_profile("atlas", deadline=None)
settings.load_profile("atlas")


def pytest_configure(config: pytest.Config) -> None:
    fix = f"run `make venv` in {ROOT}, or put {ROOT / 'collections'} first on PYTHONPATH"
    try:
        import ansible_collections.atlas.serving.plugins.module_utils as module_utils
    except ModuleNotFoundError:
        pytest.exit(f"the atlas.serving collection is not on the Python path: {fix}", returncode=2)
    found = Path(next(iter(module_utils.__path__))).resolve()
    if not found.is_relative_to(ROOT):
        pytest.exit(f"{found}: the atlas.serving collection on the Python path is not this checkout's: {fix}",
                    returncode=2)
