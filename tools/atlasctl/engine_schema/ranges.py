"""Value ranges an engine's own source states, and the committed ``schemas/ranges.json`` that holds them.

A bound is read, never assumed: a pydantic ``Field(gt=, ge=, lt=, le=)`` (vLLM's config dataclasses, read by
:func:`atlasctl.engine_schema.vllm.field_ranges`), or an unconditional check in a method that runs when the
configuration is built: a statement of the method's own body (not under another ``if``) that raises on a
plain comparison of ``self.<field>`` with a number (``if self.x > 1.0: raise ...`` -> ``le 1.0``) or asserts
one (``assert self.x >= 0`` -> ``ge 0``). Each entry carries the file and line of the statement and its text.
``atlasctl config schema refresh`` writes the entries of each release it refreshes into ``ranges.json``.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

TEXT_MAX = 160
BOUND_KEYS = ("gt", "ge", "lt", "le")
# The comparison that raises -> the bound the value must keep (``if self.x > 1: raise`` -> le 1).
_RAISES_TO_BOUND = {ast.Gt: "le", ast.GtE: "lt", ast.Lt: "ge", ast.LtE: "gt"}
# The comparison an assert keeps -> the bound (``assert self.x >= 0`` -> ge 0).
_ASSERT_TO_BOUND = {ast.Gt: "gt", ast.GtE: "ge", ast.Lt: "lt", ast.LtE: "le"}
_MIRROR = {ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Lt: ast.Gt, ast.LtE: ast.GtE}
# Methods that run when the config is built: pydantic validators, __post_init__ and the verify/check helpers.
_CHECK_METHOD = re.compile(r"^(__post_init__|_?verify\w*|_?check\w*|_?validate\w*)$")
_VALIDATORS = {"model_validator", "field_validator"}


def _number(node: ast.expr) -> float | int | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def line_text(source: str, node: ast.AST) -> str:
    text = " ".join((ast.get_source_segment(source, node) or ast.unparse(node)).split())
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 1].rstrip() + "…"


def _field_call_bounds(node: ast.expr | None) -> dict[str, Any]:
    """gt/ge/lt/le of a ``Field(...)`` call (the field's value, or an ``Annotated`` metadata item)."""
    bounds: dict[str, Any] = {}
    if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Field":
        for kw in node.keywords:
            if kw.arg in BOUND_KEYS and _number(kw.value) is not None:
                bounds[kw.arg] = _number(kw.value)
    return bounds


def declared_bounds(stmt: ast.AnnAssign) -> dict[str, Any]:
    bounds = _field_call_bounds(stmt.value)
    annotation = stmt.annotation
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).split(".")[-1] == "Annotated":
        items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        for item in items[1:]:
            bounds.update(_field_call_bounds(item))
    return bounds


def comparison_bound(test: ast.expr, subject: str, raises: bool, receivers: frozenset[str] = frozenset({"self"})
                     ) -> tuple[str, Any] | None:
    """(bound key, number) a plain comparison of ``self.<subject>`` with a number states: the bound the
    value keeps when ``test`` is an assert's condition (``raises`` False) or raises when true (True).
    ``receivers``: the names that stand for the configuration record (``self``, or a check function's
    ``cfg = resolving_view(server_args)``)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _MIRROR):
        return None
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if _number(left) is not None:  # ``0 > self.x`` -> ``self.x < 0``
        left, right, op = right, left, _MIRROR[op]
    number = _number(right)
    if number is None or not (isinstance(left, ast.Attribute) and left.attr == subject
                              and isinstance(left.value, ast.Name) and left.value.id in receivers):
        return None
    return (_RAISES_TO_BOUND if raises else _ASSERT_TO_BOUND)[op], number


def _raises(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Raise)


def _is_check(func: ast.FunctionDef) -> bool:
    decorators = {ast.unparse(d.func if isinstance(d, ast.Call) else d).split(".")[-1] for d in func.decorator_list}
    return bool(_CHECK_METHOD.match(func.name)) or bool(decorators & _VALIDATORS)


def checks_of_class(cls: ast.ClassDef, source: str, where: str, subjects: set[str] | None = None
                    ) -> dict[str, list[dict[str, Any]]]:
    """{field: [entry]} of every unconditional check in ``cls``'s check methods (``subjects``: only those
    fields); ``where`` is the file as the entries name it."""
    found: dict[str, list[dict[str, Any]]] = {}
    for func in cls.body:
        if not (isinstance(func, ast.FunctionDef) and _is_check(func)):
            continue
        for name, entries in checks_of_function(func, source, where, subjects).items():
            found.setdefault(name, []).extend(entries)
    return found


def checks_of_function(func: ast.FunctionDef, source: str, where: str, subjects: set[str] | None = None,
                       receivers: frozenset[str] = frozenset({"self"})) -> dict[str, list[dict[str, Any]]]:
    """{field: [entry]} of the unconditional checks in ``func``'s own body on ``<receiver>.<field>``."""
    found: dict[str, list[dict[str, Any]]] = {}
    for stmt in func.body:
        test, raises = (stmt.test, True) if isinstance(stmt, ast.If) and _raises(stmt.body) and not stmt.orelse \
            else (stmt.test, False) if isinstance(stmt, ast.Assert) else (None, False)
        if test is None:
            continue
        for name in _subjects(test, receivers):
            if subjects is not None and name not in subjects:
                continue
            bound = comparison_bound(test, name, raises, receivers)
            if bound is not None:
                found.setdefault(name, []).append({bound[0]: bound[1], "source": f"{where}:{stmt.lineno}",
                                                   "text": line_text(source, stmt)})
    return found


def _subjects(test: ast.expr, receivers: frozenset[str] = frozenset({"self"})) -> list[str]:
    return [n.attr for n in ast.walk(test) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in receivers]


def write_ranges(path: Path, release: str, dist: str, enforced_by: str, entries: list[dict[str, Any]]) -> Path:
    """Put ``release``'s entries into the ranges file at ``path`` (the other releases are kept), sorted by
    flag and source line, deterministic."""
    doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"releases": {}}
    ordered = sorted(entries, key=lambda e: (e["flag"], _line_of(e["source"]), e["source"]))
    doc.setdefault("releases", {})[release] = {"dist": dist, "enforced_by": enforced_by,
                                                "extracted_by": EXTRACTED_BY, "ranges": ordered}
    doc = {"note": RANGES_NOTE, "releases": {name: doc["releases"][name] for name in sorted(doc["releases"])}}
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _line_of(source: str) -> int:
    tail = source.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


EXTRACTED_BY = "atlasctl config schema refresh (tools/atlasctl/engine_schema/ranges.py)"
RANGES_NOTE = ("Value ranges the engines themselves enforce, read in each release's source by atlasctl config schema "
               "refresh (file:line of that release). Keys gt/ge/lt/le as in pydantic. A release with a schema and no "
               "entry here has no verified ranges; see docs/engine-value-ranges.md.")
