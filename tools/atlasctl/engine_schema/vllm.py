"""vLLM's ``vllm serve`` command line and environment, read statically from an unpacked wheel.

No import of vLLM (it needs torch). The flags come from every ``add_argument`` call in
``vllm/engine/arg_utils.py`` (EngineArgs/AsyncEngineArgs), the file that defines ``make_arg_parser``
(FrontendArgs and the serve-only flags) and ``vllm/entrypoints/cli/serve.py``. Arguments built with
``**get_kwargs(SomeConfig)["field"]`` take their type, choices and default from the field of the config
dataclass, the way vLLM's ``_compute_kwargs`` does: a dataclass -> JSON, ``bool`` -> ``--x/--no-x``,
``Literal`` -> choices (``"None"`` added when optional), list/tuple -> ``nargs='+'``, then int, float,
dict -> JSON, str. Fields of FrontendArgs (and its bases) become ``--field-name`` flags.

:func:`field_ranges` reads the bounds a flag's config field states (:mod:`atlasctl.engine_schema.ranges`):
the ``Field(gt=, ge=, lt=, le=)`` of its pydantic dataclass and the unconditional checks of its validators,
each with its file and line.
:func:`extract_additional_config` lists the top-level ``--additional-config`` keys a platform plugin
(vllm-ascend) reads.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atlasctl.engine_schema import ranges
from atlasctl.errors import AtlasError

HELP_MAX = 160
_ENV_RE = re.compile(r"""(?:os\.environ\.get|os\.getenv|os\.environ\.setdefault|environ\.get|getenv)\(\s*["']"""
                     r"""([A-Z][A-Z0-9_]{2,})["']|environ\[\s*["']([A-Z][A-Z0-9_]{2,})["']\s*\]""")
_SCALARS = {"bool", "int", "float", "str", "dict", "list", "tuple", "Any"}


@dataclass
class PackageIndex:
    """Module-level assignments and classes of the vLLM modules the flags refer to."""

    root: Path
    assigns: dict[str, ast.expr] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # class name -> the file that defines it
    sources: dict[Path, str] = field(default_factory=dict)

    @classmethod
    def build(cls, root: Path, subdirs: tuple[str, ...]) -> PackageIndex:
        index = cls(root)
        for sub in subdirs:
            base = root / sub
            paths = [base] if base.is_file() else sorted(base.rglob("*.py")) if base.is_dir() else []
            for path in paths:
                text = path.read_text(encoding="utf-8")
                index.sources[path] = text
                index.add(ast.parse(text), path)
        return index

    def add(self, module: ast.Module, path: Path | None = None) -> None:
        for stmt in module.body:
            if isinstance(stmt, ast.ClassDef):
                self.classes.setdefault(stmt.name, stmt)
                if path is not None:
                    self.files.setdefault(stmt.name, path)
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self.assigns.setdefault(stmt.targets[0].id, stmt.value)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                if ast.unparse(stmt.annotation) in {"TypeAlias", "typing.TypeAlias"}:
                    self.assigns.setdefault(stmt.target.id, stmt.value)
            elif type(stmt).__name__ == "TypeAlias":  # ``type X = ...`` (Python >= 3.12 sources)
                self.assigns.setdefault(stmt.name.id, stmt.value)  # type: ignore[attr-defined]

    def fields(self, class_name: str) -> dict[str, ast.AnnAssign]:
        """Annotated fields of a class and its bases known to the index (bases first)."""
        cls = self.classes.get(class_name)
        if cls is None:
            return {}
        found: dict[str, ast.AnnAssign] = {}
        for base in cls.bases:
            found.update(self.fields(ast.unparse(base).split(".")[-1]))
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if not ast.unparse(stmt.annotation).startswith("ClassVar"):
                    found[stmt.target.id] = stmt
        return found

    def is_dataclass(self, name: str) -> bool:
        cls = self.classes.get(name)
        if cls is None:
            return False
        decos = {ast.unparse(d).split("(")[0].split(".")[-1] for d in cls.decorator_list}
        return bool(decos & {"dataclass", "config"})


@dataclass
class Hint:
    """What vLLM's type-hint analysis sees in an annotation."""

    kinds: set[str] = field(default_factory=set)
    literals: list[Any] = field(default_factory=list)
    optional: bool = False
    dataclass: bool = False


def analyse(node: ast.expr | None, index: PackageIndex, depth: int = 0) -> Hint:
    hint = Hint()
    if node is None or depth > 12:
        return hint
    _walk_hint(node, index, hint, depth)
    return hint


def _walk_hint(node: ast.expr, index: PackageIndex, hint: Hint, depth: int) -> None:
    if isinstance(node, ast.Constant):
        if node.value is None:
            hint.optional = True
        elif isinstance(node.value, str):
            try:
                _walk_hint(ast.parse(node.value, mode="eval").body, index, hint, depth + 1)
            except SyntaxError:
                hint.kinds.add("str")
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        _walk_hint(node.left, index, hint, depth)
        _walk_hint(node.right, index, hint, depth)
        return
    if isinstance(node, ast.Subscript):
        _subscript_hint(node, index, hint, depth)
        return
    name = ast.unparse(node).split(".")[-1]
    if name == "None":
        hint.optional = True
    elif name in _SCALARS:
        hint.kinds.add(name)
    elif name in {"List", "Dict", "Tuple"}:
        hint.kinds.add(name.lower())
    elif name in index.assigns:
        _walk_hint(index.assigns[name], index, hint, depth + 1)
    elif index.is_dataclass(name):
        hint.dataclass = True
    else:
        hint.kinds.add("str")


def _subscript_hint(node: ast.Subscript, index: PackageIndex, hint: Hint, depth: int) -> None:
    head = ast.unparse(node.value).split(".")[-1]
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if head == "Literal":
        hint.kinds.add("literal")
        for arg in args:
            try:
                hint.literals.append(ast.literal_eval(arg))
            except ValueError:
                hint.literals.append(ast.unparse(arg))
    elif head in {"Optional", "Union"}:
        if head == "Optional":
            hint.optional = True
        for arg in args:
            _walk_hint(arg, index, hint, depth + 1)
    elif head in {"Annotated", "SkipValidation", "InitVar", "Final", "Required", "NotRequired"}:
        _walk_hint(args[0], index, hint, depth + 1)
    elif head.lower() in {"list", "tuple", "dict", "set", "sequence"}:
        kind = {"set": "list", "sequence": "list"}.get(head.lower(), head.lower())
        hint.kinds.add(kind)
        if kind in {"list", "tuple"}:
            inner = analyse(args[0], index, depth + 1)
            if "literal" in inner.kinds:
                hint.literals.extend(inner.literals)
    else:
        hint.kinds.add("str")


def kwargs_from_field(name: str, stmt: ast.AnnAssign, index: PackageIndex) -> dict[str, Any]:
    """The argparse kwargs vLLM's ``_compute_kwargs`` derives from one dataclass field."""
    hint = analyse(stmt.annotation, index)
    out: dict[str, Any] = {"default": _field_default(stmt), "help": ""}
    if hint.dataclass and not hint.kinds - {"str"}:
        out["type"] = "json"
    elif "bool" in hint.kinds:
        out["action"] = "BooleanOptionalAction"
        out["type"] = "bool"
    elif "literal" in hint.kinds and not ({"list", "tuple"} & hint.kinds):
        out["type"] = "str"
        out["choices"] = [str(v) for v in hint.literals] + (["None"] if hint.optional else [])
    elif {"list", "tuple"} & hint.kinds:
        out["type"] = "str"
        out["nargs"] = "+"
        if hint.literals:
            out["choices"] = [str(v) for v in hint.literals]
    elif "int" in hint.kinds:
        out["type"] = "int"
    elif "float" in hint.kinds:
        out["type"] = "float"
    elif "dict" in hint.kinds or hint.dataclass:
        out["type"] = "json"
    else:
        out["type"] = "str"
    out["nullable"] = hint.optional
    return out


def _field_default(stmt: ast.AnnAssign) -> Any:
    value = stmt.value
    if value is None:
        return None
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in {"field", "Field"}:
        kw = {k.arg: k.value for k in value.keywords if k.arg}
        if "default" in kw:
            value = kw["default"]
        elif "default_factory" in kw:
            factory = ast.unparse(kw["default_factory"])
            return {"list": [], "dict": {}}.get(factory, f"<{factory}()>")
        else:
            return None
    try:
        return ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError):
        return f"<{ast.unparse(value)}>"


def _kwargs_sources(func: ast.FunctionDef) -> dict[str, str]:
    """``model_kwargs = get_kwargs(ModelConfig)`` -> {'model_kwargs': 'ModelConfig'}."""
    sources: dict[str, str] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            call = node.value
            if isinstance(call, ast.Call) and ast.unparse(call.func).endswith("get_kwargs") and call.args:
                sources[node.targets[0].id] = ast.unparse(call.args[0])
    return sources


def _explicit(kw: dict[str, ast.expr]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    action = kw.get("action")
    if action is not None:
        text = action.value if isinstance(action, ast.Constant) else ast.unparse(action).split(".")[-1]
        out["action"] = text
        if text in {"store_true", "store_false", "BooleanOptionalAction"}:
            out["type"] = "bool"
    if "type" in kw:
        tname = ast.unparse(kw["type"]).split(".")[-1]
        out["type"] = {"int": "int", "float": "float", "str": "str", "loads": "json"}.get(tname, "str")
        if tname.startswith("optional_type") or "optional" in tname:
            out["nullable"] = True
    for key in ("nargs", "default", "choices"):
        if key in kw:
            try:
                out[key] = ast.literal_eval(kw[key])
            except (ValueError, TypeError, SyntaxError):
                out[f"{key}_expr"] = ast.unparse(kw[key])
    if "choices" in out and out["choices"] is not None:
        out["choices"] = [str(c) for c in out["choices"]]
    return out


def _spread(call: ast.Call, sources: dict[str, str], index: PackageIndex) -> dict[str, Any]:
    """Resolve ``**model_kwargs["dtype"]`` / ``**get_kwargs(X)["f"]`` against the config field."""
    spreads = [kw.value for kw in call.keywords if kw.arg is None]
    for node in list(spreads):
        if isinstance(node, ast.Dict):  # **{**scheduler_kwargs["x"], "default": ...}
            spreads += [v for k, v in zip(node.keys, node.values, strict=True) if k is None]
    for value in spreads:
        if not isinstance(value, ast.Subscript):
            continue
        target, key = value.value, value.slice
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        if isinstance(target, ast.Name) and target.id in sources:
            cls = sources[target.id]
        elif isinstance(target, ast.Call) and target.args:
            cls = ast.unparse(target.args[0])
        else:
            continue
        stmt = index.fields(cls.split(".")[-1]).get(key.value)
        if stmt is not None:
            return {**kwargs_from_field(key.value, stmt, index), "field": (cls.split(".")[-1], key.value)}
        return {"type": "str", "unresolved": f"{cls}.{key.value}"}
    return {}


def _dict_overrides(call: ast.Call) -> dict[str, ast.expr]:
    """Literal keys of ``**{**x_kwargs["f"], "default": 8}`` (they override the field's)."""
    found: dict[str, ast.expr] = {}
    for kw in call.keywords:
        if kw.arg is None and isinstance(kw.value, ast.Dict):
            for key, value in zip(kw.value.keys, kw.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    found[key.value] = value
    return found


def _help(kw: dict[str, ast.expr]) -> str:
    node = kw.get("help")
    if node is None:
        return ""
    try:
        text = str(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError):
        parts = [p.value for p in ast.walk(node) if isinstance(p, ast.Constant) and isinstance(p.value, str)]
        text = "".join(parts)
    return _short(text)


def _short(text: str) -> str:
    text = " ".join(text.split()).replace("%%", "%")
    return text if len(text) <= HELP_MAX else text[: HELP_MAX - 1].rstrip() + "…"


def _flag_entry(options: list[str], spec: dict[str, Any], help_text: str) -> dict[str, Any]:
    long = next((o for o in options if o.startswith("--")), options[0])
    action = spec.get("action", "store")
    if action == "BooleanOptionalAction":
        options = options + [f"--no-{o[2:]}" for o in options if o.startswith("--")]
    entry = {
        "options": options,
        "dest": long.lstrip("-").replace("-", "_"),
        "type": spec.get("type", "str"),
        "action": action,
        "nargs": spec.get("nargs"),
        "choices": spec.get("choices"),
        "nullable": bool(spec.get("nullable", False)),
        "default": spec.get("default"),
        "help": help_text or spec.get("help", ""),
    }
    for extra in ("default_expr", "choices_expr", "unresolved", "field"):
        if extra in spec:
            entry[extra] = spec[extra]
    return entry


def flags_of_function(func: ast.FunctionDef, index: PackageIndex, frontend: list[str]) -> list[dict[str, Any]]:
    """Every argument ``func`` registers. Loops over ``get_kwargs(...)`` register the fields of
    ``frontend`` classes (FrontendArgs and its bases)."""
    sources = _kwargs_sources(func)
    flags: list[dict[str, Any]] = []
    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        options = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if not options or any(isinstance(a, ast.JoinedStr) for a in node.args):
            flags.extend(_loop_flags(frontend, index))
            continue
        if not options[0].startswith("-"):
            continue  # positional (model_tag)
        spec = _spread(node, sources, index)
        spec.update(_explicit(_dict_overrides(node)))
        spec.update(_explicit(kw))
        flags.append(_flag_entry(options, spec, _help(kw)))
    return flags


def _loop_flags(frontend: list[str], index: PackageIndex) -> list[dict[str, Any]]:
    flags = []
    for cls in frontend:
        for name, stmt in index.fields(cls).items():
            spec = {**kwargs_from_field(name, stmt, index), "field": (cls, name)}
            flags.append(_flag_entry([f"--{name.replace('_', '-')}"], spec, ""))
    return flags


def _functions(path: Path, names: set[str]) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in names]


def serve_parser_files(root: Path) -> list[Path]:
    """arg_utils.py, the module defining ``make_arg_parser`` and cli/serve.py of an unpacked vLLM."""
    arg_utils = root / "vllm/engine/arg_utils.py"
    if not arg_utils.is_file():
        raise AtlasError(f"{arg_utils} not found", fix="pass the root of an unpacked vLLM wheel")
    files = [arg_utils]
    for path in sorted((root / "vllm/entrypoints").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "def make_arg_parser" in text and "FrontendArgs" in text and "run_batch" not in path.name:
            files.append(path)
    serve = root / "vllm/entrypoints/cli/serve.py"
    if serve.is_file():
        files.append(serve)
    return files


def package_index(root: Path) -> PackageIndex:
    """The modules of an unpacked vLLM that its ``vllm serve`` flags refer to."""
    return PackageIndex.build(root, ("vllm/config", "vllm/engine/arg_utils.py", "vllm/attention",
                                     "vllm/entrypoints/openai/cli_args.py", "vllm/entrypoints/launchers",
                                     "vllm/logger.py", "vllm/utils"))


def extract_flags(root: Path, index: PackageIndex | None = None) -> tuple[list[dict[str, Any]], list[Path]]:
    """All ``vllm serve`` flags of the unpacked wheel at ``root`` (merged by long option, sorted). A flag
    built from a config dataclass field carries ``field``: (class, field name), for :func:`field_ranges`."""
    files = serve_parser_files(root)
    index = index or package_index(root)
    frontend = [n for n in index.classes if n.endswith("FrontendArgs") and "Batch" not in n]
    merged: dict[str, dict[str, Any]] = {}
    wanted = {"add_cli_args", "make_arg_parser", "subparser_init"}
    for path in files:
        for func in _functions(path, wanted):
            for flag in flags_of_function(func, index, frontend):
                key = next((o for o in flag["options"] if o.startswith("--")), flag["options"][0])
                merged.setdefault(key, flag)
    return [merged[k] for k in sorted(merged)], files


def extract_env(root: Path, package: str, table: str) -> list[dict[str, Any]]:
    """Variables of ``<package>/envs.py``'s ``table`` dict, plus every literal ``os.environ``/``getenv``
    read anywhere in the package (``read_by`` names the files)."""
    found: dict[str, dict[str, Any]] = {}
    envs_py = root / package / "envs.py"
    if envs_py.is_file():
        for node in ast.walk(ast.parse(envs_py.read_text(encoding="utf-8"))):
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
                node.target if isinstance(node, ast.AnnAssign) else None)
            if isinstance(target, ast.Name) and target.id == table and isinstance(node.value, ast.Dict):
                for key in node.value.keys:
                    if isinstance(key, ast.Constant) and isinstance(key.value, str):
                        found[key.value] = {"name": key.value, "read_by": [f"{package}/envs.py:{table}"]}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for match in _ENV_RE.finditer(path.read_text(encoding="utf-8", errors="replace")):
            name = match.group(1) or match.group(2)
            entry = found.setdefault(name, {"name": name, "read_by": []})
            if rel not in entry["read_by"] and len(entry["read_by"]) < 3:
                entry["read_by"].append(rel)
    return [found[n] for n in sorted(found)]


# --- value ranges and --additional-config keys ------------------------------------------------------------

def field_ranges(index: PackageIndex, cls_name: str, name: str, extra_classes: tuple[str, ...] = ()
                 ) -> list[dict[str, Any]]:
    """The bounds the source states for field ``name`` of config class ``cls_name`` (and its bases; checks
    also in ``extra_classes``, e.g. EngineArgs): one entry per statement, {bounds, source file:line, text}."""
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()

    def visit(name_of_class: str, declared: bool) -> None:
        cls = index.classes.get(name_of_class)
        if cls is None or name_of_class in seen:
            return
        seen.add(name_of_class)
        path = index.files.get(name_of_class)
        source = index.sources.get(path, "") if path else ""
        where = path.relative_to(index.root).as_posix() if path else name_of_class
        if declared:
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                    bounds = ranges.declared_bounds(stmt)
                    if bounds:
                        entries.append({**bounds, "source": f"{where}:{stmt.lineno}",
                                        "text": ranges.line_text(source, stmt)})
        entries.extend(ranges.checks_of_class(cls, source, where, {name}).get(name, []))
        for base in cls.bases:
            visit(ast.unparse(base).split(".")[-1], declared)

    visit(cls_name, True)
    for extra in extra_classes:
        visit(extra, False)
    return entries


def flag_ranges(flags: list[dict[str, Any]], index: PackageIndex) -> list[dict[str, Any]]:
    """The range entries of ``flags`` (from :func:`extract_flags`) whose numeric config field states bounds."""
    out = []
    for flag in flags:
        if "field" not in flag or flag.get("type") not in ("int", "float"):
            continue
        cls_name, name = flag["field"]
        long = next(o for o in flag["options"] if o.startswith("--"))
        for entry in field_ranges(index, cls_name, name, ("EngineArgs", "AsyncEngineArgs")):
            out.append({"flag": long, "dest": flag["dest"], **entry})
    return out


def extract_additional_config(root: Path, package: str) -> list[dict[str, Any]]:
    """Top-level keys of vLLM's ``--additional-config`` that ``package`` reads: ``<...>additional_config.get("k")``,
    ``<...>additional_config["k"]``, ``"k" in <...>additional_config`` and a call passing the dict and then the
    key (``self._get_config_value(additional_config, "k", ...)``); ``read_by`` names up to three files."""
    found: dict[str, dict[str, Any]] = {}

    def is_dict(node: ast.expr) -> bool:
        return ast.unparse(node).split(".")[-1] == "additional_config"

    def add(key: Any, rel: str) -> None:
        if isinstance(key, str) and key:
            entry = found.setdefault(key, {"name": key, "read_by": []})
            if rel not in entry["read_by"] and len(entry["read_by"]) < 3:
                entry["read_by"].append(rel)

    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and is_dict(node.func.value) and node.args and isinstance(node.args[0], ast.Constant):
                add(node.args[0].value, rel)
            elif isinstance(node, ast.Subscript) and is_dict(node.value) and isinstance(node.slice, ast.Constant):
                add(node.slice.value, rel)
            elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In) \
                    and is_dict(node.comparators[0]) and isinstance(node.left, ast.Constant):
                add(node.left.value, rel)
            elif isinstance(node, ast.Call):
                for first, second in zip(node.args, node.args[1:], strict=False):
                    if is_dict(first) and isinstance(second, ast.Constant):
                        add(second.value, rel)
    return [found[k] for k in sorted(found)]
