"""The architecture contract is import-linter's: DESIGN.md's dependency rule over atlasctl, atlaslab and the
collection, as contracts in pyproject.toml ([tool.importlinter]), checked by `make lint` (lint-imports). These
tests show that the contract type the collection's rules use (tests/import_contracts.py, ``imports_only``) finds
a foreign import, and that no plugin directory of the collection is left without a contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PLUGINS = ROOT / "collections" / "ansible_collections" / "atlas" / "serving" / "plugins"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SHOP = {
    "shop/__init__.py": "",
    "shop/web.py": "",
    "shop/utils/__init__.py": "",
    "shop/utils/a.py": "import json\nimport os.path\n\nfrom shop.utils import b\n",
    "shop/utils/b.py": "import yaml\nfrom shop import web\n",
}


def lint_imports(tmp_path: Path, allowed: list[str], source: str = "shop.utils") -> subprocess.CompletedProcess:
    """lint-imports on the package ``shop`` with one ``imports_only`` contract, as pyproject.toml registers it."""
    for name, text in SHOP.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "contracts.toml").write_text(f"""\
[tool.importlinter]
root_packages = ["shop"]
include_external_packages = true
contract_types = ["imports_only: tests.import_contracts.ImportsOnlyContract"]

[[tool.importlinter.contracts]]
name = "shop.utils imports only what it may"
type = "imports_only"
source_modules = ["{source}"]
allowed_modules = {json.dumps(allowed)}
""")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--config", str(tmp_path / "contracts.toml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_imports_only_names_each_import_outside_the_standard_library_and_the_allowed(tmp_path):
    run = lint_imports(tmp_path, ["shop.utils"])
    assert run.returncode == 1, run.stdout + run.stderr
    assert "shop.utils.b is not allowed to import yaml (l.1)" in run.stdout
    assert "shop.utils.b is not allowed to import shop.web (l.2)" in run.stdout
    assert "shop.utils.a is not allowed" not in run.stdout  # the standard library and its own package


def test_imports_only_keeps_a_package_that_imports_what_it_may(tmp_path):
    run = lint_imports(tmp_path, ["shop.utils", "shop.web", "yaml"])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


def test_imports_only_refuses_a_source_that_is_not_there(tmp_path):
    run = lint_imports(tmp_path, [], source="shop.nothing")
    assert run.returncode != 0 and "shop.nothing" in run.stdout + run.stderr


def test_every_plugin_directory_of_the_collection_has_a_contract():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    sources = {source for contract in contracts for source in contract.get("source_modules", [])}
    kinds = {f"ansible_collections.atlas.serving.plugins.{d.name}" for d in PLUGINS.iterdir()
             if d.is_dir() and any(d.glob("*.py"))}
    assert kinds and kinds - sources == set()
