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
from atlasctl.paths import SUITE_ITEMS  # noqa: E402  (one list for the wheel and the bundle's suite/)

_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


class BuildPyWithSuite(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which is the suite
        dest = Path(self.build_lib) / "atlasctl" / "suite"
        shutil.rmtree(dest, ignore_errors=True)
        for item in SUITE_ITEMS:
            src = ROOT / item
            if src.is_dir():
                shutil.copytree(src, dest / item, ignore=_SKIP)
            else:
                (dest / item).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / item)


setup(cmdclass={"build_py": BuildPyWithSuite})
