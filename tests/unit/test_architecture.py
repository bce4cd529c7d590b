"""The product never imports the lab: no module of atlasctl (nor of the collection) names atlaslab.

`make lint` runs the same contract with import-linter (pyproject.toml, [tool.importlinter]); this test
reads the sources so it also covers the collection's plugins, which import-linter cannot load.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (ROOT / "tools" / "atlasctl", ROOT / "collections")


def lab_imports() -> list[str]:
    found = []
    for top in PRODUCT:
        for path in sorted(top.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                          if n.split(".")[0] in ("atlaslab",)]
    return found


def test_the_product_never_imports_the_lab():
    assert lab_imports() == []


def test_the_check_sees_an_import(tmp_path, monkeypatch):
    bad = tmp_path / "tools" / "atlasctl" / "x.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from atlaslab import api\n")
    monkeypatch.setattr(sys.modules[__name__], "PRODUCT", (tmp_path / "tools" / "atlasctl",))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert lab_imports() == ["tools/atlasctl/x.py:1: atlaslab"]
