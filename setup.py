"""Build hook: the atlasctl wheel carries the suite it drives (atlasctl/suite/: site.yml, playbooks,
roles, the atlas.serving collection, ansible.cfg, report templates, the example inventory), read at run
time through importlib.resources (atlasctl.paths.suite_root), and puts that collection on the Python path
with a .pth file beside the package (COLLECTION_PTH), so atlasctl imports the collection's code with plain
``import ansible_collections.atlas.serving...`` statements. Metadata: pyproject.toml."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tools"))
from atlasctl.paths import copy_items  # noqa: E402  (one copy of the suite for the wheel and the bundle)

# Installed into site-packages; its line is a directory relative to site-packages that Python's site module adds
# to sys.path at start-up (https://docs.python.org/3/library/site.html). `make venv` writes the same file with the
# checkout's collections/ (an editable install has no build of its own to carry it).
COLLECTION_PTH = "atlas_serving_collection.pth"


class BuildPyWithSuite(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which is the suite
        dest = Path(self.build_lib) / "atlasctl" / "suite"
        shutil.rmtree(dest, ignore_errors=True)
        copy_items(ROOT, dest, missing_ok=False)
        (Path(self.build_lib) / COLLECTION_PTH).write_text("atlasctl/suite/collections\n", encoding="utf-8")


setup(cmdclass={"build_py": BuildPyWithSuite})
