"""Build hook: the atlasctl wheel carries the suite it drives (atlasctl/suite/: site.yml, playbooks,
roles, the atlas.serving collection, ansible.cfg, report templates, the example inventory), read at run
time through importlib.resources (atlasctl.paths.suite_root). Metadata: pyproject.toml."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
from atlasctl.paths import copy_items  # noqa: E402  (one copy of the suite for the wheel and the bundle)


class BuildPyWithSuite(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which is the suite
        dest = Path(self.build_lib) / "atlasctl" / "suite"
        shutil.rmtree(dest, ignore_errors=True)
        copy_items(ROOT, dest, missing_ok=False)


setup(cmdclass={"build_py": BuildPyWithSuite})
