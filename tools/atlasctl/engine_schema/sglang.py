"""The command line of a pinned SGLang release, extracted statically from its source.

SGLang cannot run on the controller (its Ascend path needs torch_npu), yet the project must template only
real flags and the lab's stand-in must accept exactly the real command line. This module reads
``sglang/srt/server_args.py`` with :mod:`ast` (no import of sglang, no torch) and writes one JSON document:

``{"engine", "version", "source": {"dist", "file", "sha256"[, "files"]}, "launch", "flags": [...], "env": [...],
"metrics": [...]}``

Flags come from ``ServerArgs.add_cli_args``: its ``add_argument`` calls and, from SGLang releases that declare
their arguments as annotated dataclass fields (``field: A[T, "help" | Arg(...)] = default``, registered by
``add_cli_args_from_dataclass``, ``sglang/srt/arg_groups/arg_utils.py``), those fields, read the way that
function reads them. From 0.5.23 ``ServerArgs`` declares no field itself: server_args.py lists namespace classes
(``_INPUT_NAMESPACES``, msgspec Structs in ``sglang/srt/arg_groups/fields/``) whose annotated fields it collects, and
those are read the same way (the files are recorded in ``source.files`` with their sha256).
:func:`server_args_ranges` reads the bounds ``ServerArgs``'s checks state (:mod:`atlasctl.engine_schema.ranges`),
following ``check_server_args`` into the functions it hands the record to (0.5.23: ``arg_groups/validation_hook.py``).

Each flag: ``options`` (all spellings), ``dest``, ``type`` (``str``/``int``/``float``/``bool``/``json``/
``json_list``/``nullable_str``/``null``), ``action``, ``nargs``, ``const``, ``choices`` with
``choices_source`` (``literal``, ``constant:<NAME>`` or ``runtime:<expression>`` when the choices are only
known when SGLang runs), ``default`` (the ``ServerArgs`` dataclass field default where the flag uses one)
with ``default_expr`` when it is not a literal, ``required`` and ``help``.

``env`` lists the ``SGLANG_*`` variables the release reads (``envs`` fields of ``sglang/srt/environ.py``,
``os.environ``/``os.getenv``/``get_bool_env_var``/``get_int_env_var`` reads); ``metrics`` lists the
``sglang:*`` Prometheus families of ``sglang/srt/metrics/collector.py`` (``srt/observability/metrics_collector.py``
in later releases).
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import engine_lint
from ansible_collections.atlas.serving.plugins.module_utils.checksums import file_sha256

from atlasctl.engine_schema import ranges
from atlasctl.errors import AtlasError, EnvironmentProblem

ENGINE = "sglang"
PINNED_VERSION = "0.5.6"
SERVER_ARGS_FILE = "sglang/srt/server_args.py"
LAUNCH = "python -m sglang.launch_server"

_ENV_NAME = re.compile(r"^SGLANG_[A-Z0-9_]+$")
_ENV_READERS = {"getenv", "get", "get_bool_env_var", "get_int_env_var", "get_float_env_var", "pop"}
_TYPE_NAMES = {"str": "str", "int": "int", "float": "float", "json_list_type": "json_list",
               "nullable_str": "nullable_str", "loads": "json"}


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


class _Unresolved(Exception):
    """An expression whose value is only known when SGLang runs."""


def schema_path(version: str = PINNED_VERSION) -> Path:
    """Where the committed schema of ``version`` lives."""
    return Path(engine_lint.schema_dir_default()) / f"sglang-{version}.json"


def load_schema(version: str = PINNED_VERSION) -> dict[str, Any]:
    """The committed schema of ``version``; fails naming the file and how to create it."""
    path = schema_path(version)
    if not path.is_file():
        raise AtlasError(f"no SGLang schema for {version} at {path}",
                         fix=f"run refresh_sglang_schema({version!r}, {str(path)!r}) with PyPI reachable")
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass
class _Resolver:
    """Evaluates constant expressions of server_args.py, following its imports inside the package."""

    package_root: Path
    module: ast.Module
    field_defaults: dict[str, ast.expr | None] = field(default_factory=dict)
    local_names: dict[str, ast.expr] = field(default_factory=dict)
    _modules: dict[str, ast.Module | None] = field(default_factory=dict)
    # Fields ServerArgs collects from its namespace classes (later releases): name -> (default, its module).
    namespace_defaults: dict[str, tuple[ast.expr | None, ast.Module]] = field(default_factory=dict)
    _paths: dict[int, Path] = field(default_factory=dict)

    def value(self, node: ast.expr, where: ast.Module | None = None) -> Any:
        where = where or self.module
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Set):
            return [self.value(elt, where) for elt in node.elts]
        if isinstance(node, ast.Tuple):
            return tuple(self.value(elt, where) for elt in node.elts)
        if isinstance(node, ast.Dict):
            pairs = zip(node.keys, node.values, strict=True)
            return {self.value(k, where): self.value(v, where) for k, v in pairs if k is not None}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.value(node.operand, where)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](self.value(node.left, where), self.value(node.right, where))
        if isinstance(node, ast.JoinedStr):
            return "".join(self._fstring_part(part, where) for part in node.values)
        if isinstance(node, ast.Name):
            return self._name(node.id, where)
        if isinstance(node, ast.Attribute):
            return self._attribute(node, where)
        if isinstance(node, ast.Call):
            return self._call(node, where)
        raise _Unresolved(ast.unparse(node))

    def _fstring_part(self, part: ast.expr, where: ast.Module) -> str:
        if isinstance(part, ast.Constant):
            return str(part.value)
        if isinstance(part, ast.FormattedValue):
            return str(self.value(part.value, where))
        raise _Unresolved(ast.unparse(part))

    def _name(self, name: str, where: ast.Module) -> Any:
        if where is self.module and name in self.local_names:
            return self.value(self.local_names[name], where)
        for stmt in where.body:
            target = _assigned(stmt, name)
            if target is not None:
                return self.value(target, where)
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return stmt
        imported = self._import_of(name, where)
        if imported is None:
            raise _Unresolved(name)
        return self._name(name, imported)

    def _attribute(self, node: ast.Attribute, where: ast.Module) -> Any:
        if isinstance(node.value, ast.Name) and node.value.id == "ServerArgs" and where is self.module:
            return self._server_args_default(node.attr, ast.unparse(node))
        owner = self.value(node.value, where)
        if isinstance(owner, ast.ClassDef):
            for stmt in owner.body:
                target = _assigned(stmt, node.attr)
                if target is not None:
                    return self.value(target, self._module_of_class(owner) or where)
        raise _Unresolved(ast.unparse(node))

    def _call(self, node: ast.Call, where: ast.Module) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "list" and len(node.args) == 1:
            return list(self.value(node.args[0], where))
        if isinstance(func, ast.Attribute) and func.attr == "keys" and not node.args:
            mapping = self.value(func.value, where)
            if isinstance(mapping, dict):
                return list(mapping)
        # server_args.py's own helper that returns a ServerArgs field's default (releases whose fields live in
        # namespace classes): ``default=_declared_default("sampling_backend")``.
        if (isinstance(func, ast.Name) and func.id == "_declared_default" and where is self.module
                and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):
            return self._server_args_default(str(node.args[0].value), ast.unparse(node))
        raise _Unresolved(ast.unparse(node))

    def _server_args_default(self, name: str, text: str) -> Any:
        if name in self.field_defaults:
            default = self.field_defaults[name]
            return None if default is None else self.value(default, self.module)
        if name in self.namespace_defaults:
            default, module = self.namespace_defaults[name]
            return None if default is None else self.value(default, module)
        raise _Unresolved(text)

    def _module_of_class(self, cls: ast.ClassDef) -> ast.Module | None:
        for module in [self.module, *[m for m in self._modules.values() if m is not None]]:
            if cls in module.body:
                return module
        return None

    def _import_of(self, name: str, where: ast.Module) -> ast.Module | None:
        for stmt in where.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                if any((alias.asname or alias.name) == name for alias in stmt.names):
                    return self._load(stmt.module)
        return None

    def _load(self, dotted: str) -> ast.Module | None:
        if dotted not in self._modules:
            base = self.package_root / dotted.replace(".", "/")
            candidates = [base.with_suffix(".py"), base / "__init__.py"]
            found = next((p for p in candidates if p.is_file()), None)
            self._modules[dotted] = ast.parse(found.read_text(encoding="utf-8")) if found else None
            if found is not None:
                self._paths[id(self._modules[dotted])] = found
        return self._modules[dotted]

    def file_of(self, module: ast.Module) -> Path | None:
        """The file a module loaded by :meth:`_load` was read from."""
        return self._paths.get(id(module))


def _assigned(stmt: ast.stmt, name: str) -> ast.expr | None:
    if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
        return stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
        return stmt.value
    return None


def _find_class(module: ast.Module, name: str) -> ast.ClassDef:
    for stmt in module.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return stmt
    raise AtlasError(f"class {name} not found in {SERVER_ARGS_FILE}",
                     fix="the SGLang release changed its layout; adapt atlasctl.engine_schema.sglang")


def _field_defaults(cls: ast.ClassDef) -> dict[str, ast.expr | None]:
    defaults: dict[str, ast.expr | None] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            value = stmt.value
            if isinstance(value, ast.Call) and ast.unparse(value.func) in {"field", "dataclasses.field",
                                                                            "msgspec.field"}:
                kw = {k.arg: k.value for k in value.keywords}
                value = kw.get("default")
                if value is None and "default_factory" in kw:
                    value = ast.Call(func=kw["default_factory"], args=[], keywords=[])
            defaults[stmt.target.id] = value
    return defaults


def _add_cli_args(cls: ast.ClassDef) -> ast.FunctionDef:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "add_cli_args":
            return stmt
    raise AtlasError(f"ServerArgs.add_cli_args not found in {SERVER_ARGS_FILE}",
                     fix="the SGLang release changed its layout; adapt atlasctl.engine_schema.sglang")


def _add_argument_calls(func: ast.FunctionDef) -> Iterator[ast.Call]:
    for node in ast.walk(func):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            yield node


def _local_assignments(func: ast.FunctionDef) -> dict[str, ast.expr]:
    names: dict[str, ast.expr] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            names[node.targets[0].id] = node.value
    return names


def _flag_type(kw: dict[str, ast.expr]) -> str:
    action = kw.get("action")
    if isinstance(action, ast.Constant) and action.value in {"store_true", "store_false"}:
        return "bool"
    if "type" not in kw:
        return "str"
    name = ast.unparse(kw["type"]).split(".")[-1]
    return _TYPE_NAMES.get(name, f"custom:{ast.unparse(kw['type'])}")


def _flag(call: ast.Call, resolver: _Resolver) -> dict[str, Any]:
    options = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    long = next((o for o in options if o.startswith("--")), options[0])
    action_node = kw.get("action")
    action = (action_node.value if isinstance(action_node, ast.Constant)
              else f"custom:{ast.unparse(action_node)}" if action_node is not None else "store")
    flag: dict[str, Any] = {
        "options": options,
        "dest": resolver.value(kw["dest"]) if "dest" in kw else long.lstrip("-").replace("-", "_"),
        "type": _flag_type(kw),
        "action": action,
        "nargs": resolver.value(kw["nargs"]) if "nargs" in kw else None,
        "required": bool(resolver.value(kw["required"])) if "required" in kw else False,
    }
    if "const" in kw:
        flag["const"] = resolver.value(kw["const"])
    flag.update(_choices(kw.get("choices"), resolver))
    flag.update(_default(kw, action, resolver))
    flag["help"] = _help(kw.get("help"), resolver)
    return flag


def _choices(node: ast.expr | None, resolver: _Resolver) -> dict[str, Any]:
    if node is None:
        return {"choices": None}
    source = f"constant:{node.id}" if isinstance(node, ast.Name) else "literal"
    try:
        return {"choices": list(resolver.value(node)), "choices_source": source}
    except _Unresolved:
        return {"choices": None, "choices_source": f"runtime:{ast.unparse(node)}"}


def _default(kw: dict[str, ast.expr], action: str, resolver: _Resolver) -> dict[str, Any]:
    node = kw.get("default")
    if node is None:
        return {"default": action == "store_false" if action in {"store_true", "store_false"} else None}
    try:
        return {"default": resolver.value(node)}
    except _Unresolved as exc:
        return {"default": None, "default_expr": str(exc)}


def _help(node: ast.expr | None, resolver: _Resolver) -> str:
    if node is None:
        return ""
    try:
        value = resolver.value(node)
    except _Unresolved:
        return ast.unparse(node)
    return value if isinstance(value, str) else str(value)


def _flags(source: str, package_root: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """The flags and the files besides server_args.py they were read in (the namespace modules)."""
    module = ast.parse(source)
    cls = _find_class(module, "ServerArgs")
    func = _add_cli_args(cls)
    resolver = _Resolver(package_root, module, _field_defaults(cls), _local_assignments(func))
    annotated: list[dict[str, Any]] = []
    files: list[Path] = []
    if _uses_dataclass_args(func):
        namespaces = _input_namespaces(module, resolver)
        if namespaces:
            annotated, files = _namespace_flags(namespaces, resolver)
        else:
            annotated = _annotated_flags(cls, resolver)
    return annotated + [_flag(call, resolver) for call in _add_argument_calls(func)], files


# Later releases (0.5.23) declare no field on ServerArgs itself: server_args.py lists namespace classes
# (``_INPUT_NAMESPACES = [Model, ...]``, each a msgspec Struct in ``sglang/srt/arg_groups/fields/``), collects
# their annotated fields (``collect_input_fields``, in ``POSITIONAL_FIELD_ORDER`` of
# ``sglang/srt/arg_groups/field_order.py``, then the others in declaration order) and builds ServerArgs from them.
_NAMESPACE_LIST = "_INPUT_NAMESPACES"
_FIELD_ORDER = ("sglang.srt.arg_groups.field_order", "POSITIONAL_FIELD_ORDER")


def _input_namespaces(module: ast.Module, resolver: _Resolver) -> list[tuple[ast.ClassDef, ast.Module]]:
    """(class, its module) of each namespace ``ServerArgs`` collects its fields from; [] when it has none."""
    node = next((_assigned(stmt, _NAMESPACE_LIST) for stmt in module.body
                 if _assigned(stmt, _NAMESPACE_LIST) is not None), None)
    if not isinstance(node, ast.List | ast.Tuple):
        return []
    out = []
    for elt in node.elts:
        cls = resolver.value(elt) if isinstance(elt, ast.Name) else None
        owner = resolver._module_of_class(cls) if isinstance(cls, ast.ClassDef) else None
        if owner is None:
            raise AtlasError(f"namespace {ast.unparse(elt)} of {_NAMESPACE_LIST} not found from {SERVER_ARGS_FILE}",
                             fix="the SGLang release changed its layout; adapt atlasctl.engine_schema.sglang")
        out.append((cls, owner))
    return out


def _namespace_flags(namespaces: list[tuple[ast.ClassDef, ast.Module]], resolver: _Resolver
                     ) -> tuple[list[dict[str, Any]], list[Path]]:
    by_field: dict[str, dict[str, Any]] = {}
    declared: list[str] = []
    files: list[Path] = []
    for cls, owner in namespaces:
        defaults = _field_defaults(cls)
        for name, default in defaults.items():
            resolver.namespace_defaults[name] = (default, owner)
        path = resolver.file_of(owner)
        if path is not None and path not in files:
            files.append(path)
        ns_resolver = _Resolver(resolver.package_root, owner, defaults, {}, resolver._modules)
        ns_resolver.namespace_defaults, ns_resolver._paths = resolver.namespace_defaults, resolver._paths
        for flag in _annotated_flags(cls, ns_resolver):
            by_field[flag["dest"]] = flag
        declared.extend(name for name in defaults if name not in declared)
    order_module = resolver._load(_FIELD_ORDER[0])
    try:
        positional = list(resolver._name(_FIELD_ORDER[1], order_module)) if order_module is not None else []
    except _Unresolved:
        positional = []
    if order_module is not None and resolver.file_of(order_module) is not None:
        files.append(resolver.file_of(order_module))  # type: ignore[arg-type]
    known = [n for n in positional if n in declared]
    ordered = known + [n for n in declared if n not in set(positional)]
    return [by_field[n] for n in ordered if n in by_field], files


def _uses_dataclass_args(func: ast.FunctionDef) -> bool:
    return any(isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_cli_args_from_dataclass")
               for node in ast.walk(func))


_ANNOTATED = {"A", "Annotated"}
_ACTION_BOOL = {"store_true", "store_false", "BooleanOptionalAction"}


def _annotated_flags(cls: ast.ClassDef, resolver: _Resolver) -> list[dict[str, Any]]:
    """The flags ``add_cli_args_from_dataclass`` registers for the ``A[T, "help" | Arg(...)]`` fields of ``cls``."""
    flags: dict[str, dict[str, Any] | None] = {}
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        found = _annotated_meta(stmt.annotation)
        # A field declared twice is one dataclass field: the last declaration, in the first one's place.
        if found is None or _meta_value(found[1], "no_cli", resolver) is True:
            flags[stmt.target.id] = None
            continue
        flags[stmt.target.id] = _annotated_flag(stmt, *found, resolver)
    return [flag for flag in flags.values() if flag is not None]


def _annotated_meta(annotation: ast.expr) -> tuple[ast.expr, dict[str, ast.expr]] | None:
    """(inner type, Arg keywords) of ``A[T, "help"]`` / ``A[T, Arg(...)]``; None for other annotations."""
    if not (isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value).split(".")[-1] in _ANNOTATED):
        return None
    items = list(annotation.slice.elts) if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    for item in items[1:]:
        if isinstance(item, ast.Call) and ast.unparse(item.func).split(".")[-1] == "Arg":
            return items[0], {k.arg: k.value for k in item.keywords if k.arg}
        if isinstance(item, ast.Constant | ast.JoinedStr | ast.BinOp):
            return items[0], {"help": item}
    return None


def _meta_value(meta: dict[str, ast.expr], key: str, resolver: _Resolver) -> Any:
    if key not in meta:
        return None
    try:
        return resolver.value(meta[key])
    except _Unresolved:
        return None


def _unwrap_optional(node: ast.expr) -> tuple[ast.expr, bool]:
    """``Optional[X]``, ``X | None``, ``Union[X, None]`` -> (X, True); anything else -> (node, False)."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Optional":
        return node.slice, True
    members = None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        members = [node.left, node.right]
    elif isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] == "Union":
        members = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if members is not None:
        rest = [m for m in members if ast.unparse(m) != "None"]
        if len(rest) == 1 and len(rest) < len(members):
            return rest[0], True
    return node, False


def _head(node: ast.expr) -> str:
    return ast.unparse(node.value if isinstance(node, ast.Subscript) else node).split(".")[-1]


def _scalar_type(node: ast.expr) -> str:
    return {"str": "str", "int": "int", "float": "float"}.get(_head(node), "str")


def _annotated_flag(stmt: ast.AnnAssign, inner: ast.expr, meta: dict[str, ast.expr], resolver: _Resolver
                    ) -> dict[str, Any]:
    name = stmt.target.id  # type: ignore[union-attr]
    cli = _meta_value(meta, "cli_name", resolver) or "--" + name.replace("_", "-")
    options = [cli, *(_meta_value(meta, "aliases", resolver) or [])]
    default = _default({"default": stmt.value} if stmt.value is not None else {}, "store", resolver)
    flag: dict[str, Any] = {"options": options, "dest": name, "type": "str", "action": "store", "nargs": None,
                            "required": False}
    typ, optional = _unwrap_optional(inner)
    parser = meta.get("type_parser")
    action = meta.get("action")
    if action is not None:
        text = action.value if isinstance(action, ast.Constant) else ast.unparse(action).split(".")[-1]
        flag["action"] = text if text in _ACTION_BOOL else f"custom:{ast.unparse(action)}"
        if text in _ACTION_BOOL:
            flag["type"] = "bool"
        if text == "BooleanOptionalAction":
            flag["options"] = options + [f"--no-{o[2:]}" for o in options if o.startswith("--")]
        extra = _meta_value(meta, "action_kwargs", resolver) or {}
        if isinstance(extra, dict) and extra.get("nargs"):
            flag["nargs"] = extra["nargs"]
    elif _head(typ) == "Literal":
        items = list(typ.slice.elts) if isinstance(typ.slice, ast.Tuple) else [typ.slice]  # type: ignore[attr-defined]
        values = [resolver.value(i) for i in items]
        flag["type"] = _TYPE_NAMES.get(ast.unparse(parser).split(".")[-1], f"custom:{ast.unparse(parser)}") \
            if parser is not None else {int: "int", float: "float"}.get(type(values[0]) if values else str, "str")
        meta = {"choices": ast.List(elts=items, ctx=ast.Load()), **meta}
    elif _head(typ) in {"List", "list"} and parser is None:
        elem = typ.slice if isinstance(typ, ast.Subscript) else None
        flag["type"] = _scalar_type(elem) if elem is not None else "str"
        flag["nargs"] = _meta_value(meta, "nargs", resolver) or "+"
    elif _head(typ) == "bool":
        flag["type"], flag["action"] = "bool", "store_true"
    else:
        flag["type"] = (_TYPE_NAMES.get(ast.unparse(parser).split(".")[-1], f"custom:{ast.unparse(parser)}")
                        if parser is not None else _scalar_type(typ))
        flag["nargs"] = _meta_value(meta, "nargs", resolver)
        required = _meta_value(meta, "required", resolver)
        flag["required"] = required is True or (required is None and stmt.value is None)
    if optional and flag["type"] == "str" and parser is None:
        flag["nullable"] = True
    if "const" in meta:
        flag["const"] = _meta_value(meta, "const", resolver)
    flag.update(_choices(meta.get("choices"), resolver))
    flag.update(default)
    flag["help"] = _help(meta.get("help"), resolver)
    return flag


def server_args_ranges(source_file: Path, flags: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The range entries of the numeric ``flags`` that ``ServerArgs``'s checks bound (``check_server_args`` and
    the other check methods: an unconditional assert or raise on a plain comparison with a number)."""
    source = Path(source_file).read_text(encoding="utf-8")
    module = ast.parse(source)
    cls = _find_class(module, "ServerArgs")
    numeric = {f["dest"]: f for f in flags if f.get("type") in ("int", "float")}
    found = ranges.checks_of_class(cls, source, SERVER_ARGS_FILE, set(numeric))
    package_root = Path(source_file).resolve().parents[2]
    for dest, entries in _delegated_checks(cls, module, package_root, set(numeric)).items():
        found.setdefault(dest, []).extend(entries)
    out = []
    for dest, entries in found.items():
        long = next(o for o in numeric[dest]["options"] if o.startswith("--"))
        out.extend({"flag": long, "dest": dest, **entry} for entry in entries)
    return out


_VIEW = "resolving_view"  # ``cfg = resolving_view(server_args)``: the record as the checks read it
_DELEGATE_DEPTH = 3


def _delegated_checks(cls: ast.ClassDef, module: ast.Module, package_root: Path, subjects: set[str]
                      ) -> dict[str, list[dict[str, Any]]]:
    """The checks of the functions ``ServerArgs.check_server_args`` hands the record to (later releases:
    ``from sglang.srt.arg_groups.validation_hook import check_server_args; check_server_args(self)``), and of
    the functions those call in turn with it, each called unconditionally (a statement of the caller's own
    body). In each function the record is its first parameter and the names bound to
    ``resolving_view(<record>)`` in its own body; the rules are those of :func:`ranges.checks_of_function`."""
    method = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "check_server_args"), None)
    found: dict[str, list[dict[str, Any]]] = {}
    if method is None:
        return found
    resolver = _Resolver(package_root, module)
    resolver._paths[id(module)] = package_root / SERVER_ARGS_FILE
    seen: set[tuple[str, str]] = set()
    todo = [(callee, module, method, 0) for callee in _record_calls(method, frozenset({"self"}))]
    while todo:
        name, where_module, caller, depth = todo.pop(0)
        target = _function_named(name, caller, where_module, resolver)
        if target is None or depth >= _DELEGATE_DEPTH:
            continue
        func, owner, path = target
        key = (path.as_posix(), func.name)
        if key in seen:
            continue
        seen.add(key)
        rel = path.resolve().relative_to(package_root.resolve()).as_posix()
        receivers = _receivers(func)
        text = path.read_text(encoding="utf-8")
        for dest, entries in ranges.checks_of_function(func, text, rel, subjects, receivers).items():
            found.setdefault(dest, []).extend(entries)
        todo.extend((callee, owner, func, depth + 1) for callee in _record_calls(func, receivers))
    return found


def _receivers(func: ast.FunctionDef) -> frozenset[str]:
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    if not params:
        return frozenset()
    names = {params[0]}
    for stmt in func.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func) == _VIEW
                and len(stmt.value.args) == 1 and isinstance(stmt.value.args[0], ast.Name)
                and stmt.value.args[0].id == params[0]):
            names.add(stmt.targets[0].id)
    return frozenset(names)


def _record_calls(func: ast.FunctionDef, receivers: frozenset[str]) -> list[str]:
    """Functions ``func``'s own body calls, as a statement, with the record as their only argument."""
    out = []
    for stmt in func.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and len(call.args) == 1
                and not call.keywords and isinstance(call.args[0], ast.Name) and call.args[0].id in receivers):
            out.append(call.func.id)
    return out


def _function_named(name: str, caller: ast.FunctionDef, where: ast.Module, resolver: _Resolver
                    ) -> tuple[ast.FunctionDef, ast.Module, Path] | None:
    """The module-level function ``name`` as ``caller`` sees it: imported in its body or its module, or
    defined in its module."""
    for scope in (caller.body, where.body):
        for stmt in scope:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                alias = next((a for a in stmt.names if (a.asname or a.name) == name), None)
                if alias is None:
                    continue
                owner = resolver._load(stmt.module)
                path = resolver.file_of(owner) if owner is not None else None
                func = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == alias.name),
                            None) if owner is not None else None
                return (func, owner, path) if func is not None and path is not None else None  # type: ignore[return-value]
    func = next((f for f in where.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    path = resolver.file_of(where)
    return (func, where, path) if func is not None and path is not None else None


def _env_from_envs_class(path: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return found
    rel = path.as_posix().split("/sglang/", 1)[-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        if not isinstance(node.targets[0], ast.Name):
            continue
        name, value = node.targets[0].id, node.value
        if _ENV_NAME.match(name) and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            default: Any = None
            if value.args:
                try:
                    default = ast.literal_eval(value.args[0])
                except ValueError:
                    default = ast.unparse(value.args[0])
            kind = value.func.id.removeprefix("Env").lower()
            found[name] = {"name": name, "type": kind, "default": default, "read_by": [f"sglang/{rel}:envs"]}
    return found


def _env_reads(tree: ast.AST) -> Iterator[tuple[str, Any]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0].value
            if fname in _ENV_READERS and isinstance(arg, str) and _ENV_NAME.match(arg):
                second = node.args[1] if len(node.args) > 1 else None
                yield arg, second.value if isinstance(second, ast.Constant) else None
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            arg = node.slice.value
            if isinstance(arg, str) and _ENV_NAME.match(arg) and "environ" in ast.unparse(node.value):
                yield arg, None
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            arg = node.left.value
            container = ast.unparse(node.comparators[0])
            if isinstance(arg, str) and _ENV_NAME.match(arg) and "environ" in container:
                yield arg, None


def _env(package_root: Path) -> list[dict[str, Any]]:
    found = _env_from_envs_class(package_root / "sglang/srt/environ.py")
    for path in sorted((package_root / "sglang").rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        rel = path.relative_to(package_root).as_posix()
        for name, default in _env_reads(tree):
            entry = found.setdefault(name, {"name": name, "type": "str", "default": default, "read_by": []})
            if rel not in entry["read_by"]:
                entry["read_by"].append(rel)
    return [found[name] for name in sorted(found)]


def _metrics(package_root: Path) -> list[dict[str, Any]]:
    # The collector moved from srt/metrics/ to srt/observability/ (metrics_collector.py) in later releases.
    path = next((p for p in (package_root / "sglang/srt/metrics/collector.py",
                             package_root / "sglang/srt/observability/metrics_collector.py") if p.is_file()), None)
    if path is None:
        return []
    metrics: dict[str, dict[str, Any]] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in {"Gauge", "Counter", "Histogram", "Summary"}):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        name = kw.get("name")
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            doc = kw.get("documentation")
            metrics[name.value] = {
                "name": name.value,
                "type": node.func.id.lower(),
                "documentation": doc.value if isinstance(doc, ast.Constant) else "",
                "extra_labels": _extra_labels(kw.get("labelnames")),
            }
    return [metrics[n] for n in sorted(metrics)]


def _extra_labels(node: ast.expr | None) -> list[str]:
    if isinstance(node, ast.BinOp) and isinstance(node.right, ast.List):
        return [e.value for e in node.right.elts if isinstance(e, ast.Constant)]
    return []


def extract_sglang_schema(source_file: Path, version: str) -> dict[str, Any]:
    """The schema of ``version`` from its ``sglang/srt/server_args.py`` (the package tree around it is scanned
    for imported constants, ``SGLANG_*`` environment variables and metric names)."""
    source_file = Path(source_file)
    if not source_file.is_file():
        raise AtlasError(f"SGLang source file {source_file} does not exist",
                         fix=f"pass the {SERVER_ARGS_FILE} of an unpacked sglang=={version} distribution")
    data = source_file.read_bytes()
    package_root = source_file.resolve().parents[2]
    flags, files = _flags(data.decode("utf-8"), package_root)
    source: dict[str, Any] = {"dist": f"sglang=={version}", "file": SERVER_ARGS_FILE,
                              "sha256": hashlib.sha256(data).hexdigest()}
    if files:  # the namespace modules the flags were declared in (later releases), each with its sha256
        source["files"] = {p.resolve().relative_to(package_root).as_posix(): file_sha256(p) for p in files}
    return {
        "engine": ENGINE,
        "version": version,
        "source": source,
        "launch": LAUNCH,
        "flags": flags,
        "env": _env(package_root),
        "metrics": _metrics(package_root),
    }


def _download(version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps",
           "--only-binary", ":all:", "-d", str(dest), f"sglang=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("sglang-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise EnvironmentProblem(f"pip download of sglang=={version} failed: {proc.stderr.strip()[-400:]}",
                                 fix="check that PyPI is reachable and that the version exists")
    return wheels[0]


def refresh_sglang_schema(version: str, out: Path) -> Path:
    """Download ``sglang==version`` (wheel, no dependencies) into a temporary directory, extract its schema
    and write it to ``out``. Returns ``out``."""
    return refresh_sglang(version, out)[0]


def refresh_sglang(version: str, out: Path) -> tuple[Path, list[dict[str, Any]], str]:
    """As :func:`refresh_sglang_schema`; also the value ranges of the release (:func:`server_args_ranges`) and
    the wheel they were read in (``sglang==V (file, sha256 H)``)."""
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="sglang-schema-") as tmp:
        wheel = _download(version, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            members = [n for n in zf.namelist() if n.startswith("sglang/") and n.endswith(".py")]
            zf.extractall(tmp, members=members)
        schema = extract_sglang_schema(Path(tmp) / SERVER_ARGS_FILE, version)
        found = server_args_ranges(Path(tmp) / SERVER_ARGS_FILE, schema["flags"])
        dist = f"sglang=={version} ({wheel.name}, sha256 {file_sha256(wheel)})"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(schema, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out, found, dist


def main(argv: list[str] | None = None) -> int:
    """``python -m atlasctl.engine_schema.sglang [VERSION [OUT]]``: refresh a committed schema."""
    args = list(sys.argv[1:] if argv is None else argv)
    version = args[0] if args else PINNED_VERSION
    out = Path(args[1]) if len(args) > 1 else schema_path(version)
    print(refresh_sglang_schema(version, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
