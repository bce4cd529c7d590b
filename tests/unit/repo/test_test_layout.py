"""The tests' own layout: tiers by what they run, shared code in tests/support, no test module importing another.

tests/unit runs no playbook (a module at most through ``ansible localhost -m``); tests/role is the tier that does,
every module there marked ``role``; tests/support holds no test. A test that needs another's helper finds it in
tests/support (``from support.x import y``) or in a conftest, never in the other test module.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
PLAYBOOK = "ansible-playbook"


def _modules(under: str) -> list[Path]:
    return sorted((TESTS / under).rglob("*.py"))


def _test_modules() -> list[Path]:
    return [p for p in TESTS.rglob("test_*.py") if p.is_file()]


def imported_test_modules(tree: ast.AST) -> list[str]:
    """The test modules (``test_*``) a module imports, by name."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.split(".")[-1].startswith("test_")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1].startswith("test_"):
            names.append(node.module)
    return names


def runs_a_playbook(tree: ast.AST) -> list[int]:
    """Lines that name the ansible-playbook executable as a path: ``x.with_name("ansible-playbook")`` or
    ``x / "ansible-playbook"``, the two ways a test finds the venv's command."""
    lines = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "with_name"
                and any(isinstance(a, ast.Constant) and a.value == PLAYBOOK for a in node.args)):
            lines.append(node.lineno)
        elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
              and node.right.value == PLAYBOOK):
            lines.append(node.lineno)
    return lines


def module_marks(tree: ast.Module) -> set[str]:
    """The marks of a module's ``pytestmark`` (``pytest.mark.x`` or a list of them, ``skipif`` and the like too)."""
    marks = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                    marks.add(sub.attr)
    return marks


def test_no_test_module_imports_another():
    found = {str(p.relative_to(TESTS)): imported_test_modules(ast.parse(p.read_text())) for p in TESTS.rglob("*.py")}
    assert {k: v for k, v in found.items() if v} == {}, "move the shared code into tests/support or a conftest"


def test_the_unit_tier_runs_no_playbook():
    found = {str(p.relative_to(TESTS)): runs_a_playbook(ast.parse(p.read_text())) for p in _modules("unit")}
    assert {k: v for k, v in found.items() if v} == {}, "a test that runs ansible-playbook belongs in tests/role"


def test_every_role_test_module_is_marked_role_and_no_unit_module_is():
    role = [p for p in _modules("role") if p.name.startswith("test_")]
    assert role, "tests/role holds the role tests"
    assert [p.name for p in role if "role" not in module_marks(ast.parse(p.read_text()))] == []
    marked = {p.name: module_marks(ast.parse(p.read_text())) & {"role", "slow", "lab"} for p in _modules("unit")}
    assert {k: v for k, v in marked.items() if v} == {}


def test_the_support_package_holds_no_test():
    assert [p.name for p in _modules("support") if p.name.startswith("test_")] == []
    for path in _modules("support"):
        tree = ast.parse(path.read_text())
        assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")] == []


def test_the_checks_see_what_they_look_for():
    """Each check above finds the thing it forbids in a module written to have it."""
    bad = ast.parse('from test_other import helper\nimport tests.unit.test_x\nfrom support.fanout import free_port\n'
                    'import pytest\nimport sys\nfrom pathlib import Path\n'
                    'pytestmark = [pytest.mark.role, pytest.mark.skipif(True, reason="x")]\n'
                    'A = Path(sys.executable).with_name("ansible-playbook")\n'
                    'B = Path(sys.executable).parent / "ansible-playbook"\nC = "ansible-playbook is named here"\n')
    assert imported_test_modules(bad) == ["test_other", "tests.unit.test_x"]
    assert runs_a_playbook(bad) == [8, 9]
    assert module_marks(bad) == {"role", "skipif"}
    assert len(_test_modules()) > 100
