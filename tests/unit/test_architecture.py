"""The product never imports the lab: no module of atlasctl (nor of the collection) names atlaslab.

`make lint` runs the same contract with import-linter (pyproject.toml, [tool.importlinter]); this test
reads the sources so it also covers the collection's plugins, which import-linter cannot load, and
checks the rest of DESIGN.md's dependency rule there (what modules, filters and module_utils import).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

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


# The dependency rule of DESIGN.md ("The parts and the dependency rule") for what import-linter cannot
# load: the collection's plugins.
COLLECTION = ROOT / "collections" / "ansible_collections" / "atlas" / "serving" / "plugins"
OWN_UTILS = "ansible_collections.atlas.serving.plugins.module_utils"
PLUGIN_UTILS = "ansible_collections.atlas.serving.plugins.plugin_utils"
ALLOWED = {
    "module_utils": (OWN_UTILS,),  # they ship to the nodes: the standard library and each other
    "modules": (OWN_UTILS, "ansible.module_utils"),
    "filter": (OWN_UTILS, PLUGIN_UTILS, "ansible", "yaml"),  # run on the controller
    # controller-side code the filters and atlasctl share; bcrypt (in the controller's pinned closure, a dependency
    # of paramiko) hashes the monitoring web passwords (plugin_utils/monitoring.py)
    "plugin_utils": (OWN_UTILS, "ansible", "yaml", "bcrypt"),
}


def imported(path: Path) -> list[tuple[int, str]]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
    return names


def foreign_imports(kind: str, root: Path = COLLECTION) -> list[str]:
    """Imports of ``plugins/<kind>/*.py`` that are neither the standard library nor allowed for the kind."""
    allowed = ALLOWED[kind]
    found = []
    for path in sorted((root / kind).glob("*.py")):
        for line, name in imported(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if not any(name == a or name.startswith(a + ".") for a in allowed):
                found.append(f"{path.name}:{line}: {name}")
    return found


@pytest.mark.parametrize("kind", sorted(ALLOWED))
def test_collection_plugins_import_only_what_the_rule_allows(kind):
    assert foreign_imports(kind) == []


def test_the_plugin_check_sees_a_foreign_import(tmp_path):
    (tmp_path / "module_utils").mkdir()
    (tmp_path / "module_utils" / "x.py").write_text("import os\nimport yaml\nfrom atlasctl import paths\n")
    assert foreign_imports("module_utils", tmp_path) == ["x.py:2: yaml", "x.py:3: atlasctl"]
