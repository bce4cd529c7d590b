"""Programs the tests run: the venv's own (``make venv`` takes them out of their Debian packages, tests/deb_tool.sh),
else one on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def venv_tool(name: str) -> str | None:
    """The path of program ``name``: the venv's bin/ first, then PATH; None where neither has it."""
    return shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
