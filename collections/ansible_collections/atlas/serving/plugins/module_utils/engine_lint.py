# Copyright: the atlas.serving authors. GNU General Public License v3.0+
"""Check an engine command line and environment against the schema of the release it targets.

Standard library only (runs in filters, modules and atlasctl). Data, not code, says what is real:

``schemas/<release>.json``   flags (``options``, ``type``, ``action``, ``nargs``, ``choices``) and ``env``
                             extracted from the pinned release's source (atlasctl config schema refresh)
``schemas/platform-env.json`` variables the Ascend platform and common libraries read, with value patterns
``schemas/fictions.json``     the deployment guide's fictional or invalid settings with the real alternative
``schemas/ranges.json``       value ranges the engine itself enforces, with the pinned source's file:line

Unknown flags and unknown environment variables are errors (the releases of the engine that have the flag are
named, and its replacement where ``fictions.json`` records one); so is a top-level ``--additional-config`` key
the release's platform plugin does not read (the schema's ``additional_config`` list, vllm-ascend); so is a
value the rendered one-argument-per-line ``.args`` file cannot carry (a control character such as a newline
adds lines, a leading ``#`` makes the launcher skip it); so is a control character in an environment value (the
environment file holds one variable per line). An API key in the argv or the environment (``--api-key``,
``VLLM_API_KEY``, ``SGLANG_API_KEY``) is an error naming ``serving_api_keys``: the serving role hands the keys
to the engine in its ``--config`` file, never on a command line or in the environment file (README.md, "API
keys"; docs/engine-facts.md). Secret values never appear in a message.

The environment file feeds a unit whose launcher starts as root (roles/serving, ``ExecStart=!``), so every
environment value is held to a grammar (:func:`env_value_findings`, the one checker for lint, render, plan and the
serving role): no shell metacharacter, white space, control, format (bidi) or separator character anywhere; no
variable the dynamic loader, bash or Podman acts on as root (``LD_*``, ``PATH``, ``BASH_ENV`` ...); no interpreter
variable (``PYTHONPATH``, ``PERL5LIB``, ``NODE_OPTIONS`` ...) unless the release's own schema lists it; and the
value matches its key's grammar: the pattern ``platform-env.json`` gives, else the one its name says (device lists,
interface lists, absolute paths), else the one its schema type says (SGLang's ``bool``/``int``/``float``), else
the default ``[A-Za-z0-9_.,:/=+@%-]*``. A character, loader or interpreter finding has kind ``unsafe`` (the serving
role refuses it even with ``serving_lint_override``); a value off its grammar has kind ``env``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import unicodedata

SECRET_FLAGS = frozenset(["--api-key"])
SECRET_ENV = frozenset(["VLLM_API_KEY", "SGLANG_API_KEY"])
# What a flag and an environment variable name look like (whole-string matches: ``fullmatch``).
FLAG_NAME = re.compile(r"--[a-z0-9][a-z0-9-]*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYS_FIX = ("set serving_api_keys (vaulted) in the inventory instead: the serving role hands the keys to the "
             "engine in its --config file (README.md, 'API keys'; docs/engine-facts.md)")
_BOOL_ACTIONS = frozenset(["store_true", "store_false", "BooleanOptionalAction", "store_const"])


class LintError(Exception):
    """The lint itself cannot run (missing or malformed schema)."""


def schema_dir_default():
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "schemas")


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        known = ", ".join(known_releases(os.path.dirname(path)))
        raise LintError(f"no schema file {path}: run `atlasctl config schema refresh` or pick a release that "
                        f"has one ({known})") from None
    except ValueError as exc:
        raise LintError(f"schema file {path} is not valid JSON: {exc}") from exc


def known_releases(schema_dir):
    skip = {"platform-env.json", "fictions.json", "ranges.json"}
    return sorted(n[:-5] for n in os.listdir(schema_dir) if n.endswith(".json") and n not in skip)


def load(release, schema_dir=None):
    """(schema, platform variables, fictions) for ``release`` (e.g. ``vllm-ascend-0.11.0``)."""
    schema_dir = schema_dir or schema_dir_default()
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", str(release)):
        raise LintError(f"engine_release {release!r} is not a release name like vllm-ascend-0.11.0")
    schema = _read_json(os.path.join(schema_dir, f"{release}.json"))
    platform = _read_json(os.path.join(schema_dir, "platform-env.json"))
    fictions = _read_json(os.path.join(schema_dir, "fictions.json"))
    return schema, platform, fictions


def load_ranges(release, schema_dir=None):
    """{dest: [range entry]} of ``release`` from ``schemas/ranges.json`` (empty when none is verified)."""
    path = os.path.join(schema_dir or schema_dir_default(), "ranges.json")
    if not os.path.exists(path):
        return {}
    entries = _read_json(path).get("releases", {}).get(str(release), {}).get("ranges", [])
    found = {}
    for entry in entries:
        found.setdefault(entry["dest"], []).append(entry)
    return found


def has_ranges(release, schema_dir=None):
    """Whether ``schemas/ranges.json`` holds the verified value ranges of ``release`` (an entry, even empty)."""
    path = os.path.join(schema_dir or schema_dir_default(), "ranges.json")
    return os.path.exists(path) and str(release) in _read_json(path).get("releases", {})


def ranges_note(release, schema_dir=None):
    """A sentence for a release with a schema and no verified ranges, else ``""``."""
    if has_ranges(release, schema_dir):
        return ""
    return (f"{release} has no verified value ranges (schemas/ranges.json): its values are checked for type and "
            "choices only; run `atlasctl config schema refresh` for the release to read them from its source")


_BOUNDS = (("gt", ">", lambda v, b: v > b), ("ge", ">=", lambda v, b: v >= b),
           ("lt", "<", lambda v, b: v < b), ("le", "<=", lambda v, b: v <= b))


def _range_error(flag_name, value, entries, release):
    """The first of ``entries`` (one flag's ranges) that ``value`` breaks, as a message; None when it keeps them all."""
    try:
        number = float(str(value).replace("_", ""))
    except ValueError:
        return None
    for entry in entries if isinstance(entries, list) else [entries]:
        if all(test(number, entry[key]) for key, _sign, test in _BOUNDS if key in entry) and not math.isnan(number):
            continue
        bounds = " and ".join(f"value {sign} {entry[key]:g}" for key, sign, _test in _BOUNDS if key in entry)
        return (f"`{flag_name} {value}` is out of range for {release}: the engine requires {bounds} "
                f"({entry['source']})")
    return None


def _control_character(text):
    """The first control character of ``text`` (None when there is none)."""
    return next((c for c in text if ord(c) < 32 or ord(c) == 127), None)


def _line_safety(argv):
    """Findings for tokens the ``.args`` file cannot carry: control characters (a newline makes extra
    arguments), and values starting with ``#`` (the launcher skips such lines: the value vanishes)."""
    findings, flag = [], "the command"
    for token in [str(t) for t in argv]:
        if token.startswith("--"):
            flag = token.partition("=")[0]
        bad = _control_character(token)
        if bad:
            findings.append(_finding("value", flag, f"`{flag}` has a control character (U+{ord(bad):04X}) in "
                                     "its value: the .args file holds one argument per line, so it would "
                                     "split into extra arguments; remove it"))
        elif token.startswith("#"):
            findings.append(_finding("value", flag, f"`{flag}` has a value starting with '#': the launcher "
                                     "skips .args lines starting with '#', so the value would vanish; change the "
                                     f"value, or in an .args file write `{flag}=<value>`"))
    return findings


def _flag_table(schema):
    table = {}
    for flag in schema.get("flags", []):
        for option in flag.get("options", []):
            if option.startswith("--"):
                table[option] = flag
    return table


def flag_options(release, schema_dir=None):
    """The ``--long`` options of ``release``'s schema (a set)."""
    return set(_flag_table(load(release, schema_dir)[0]))


def _fiction(fictions, kind, name, engine, value=None):
    for entry in fictions.get("entries", []):
        if entry["kind"] != kind or entry["name"] != name or engine not in entry["engines"]:
            continue
        if kind == "value" and str(entry.get("value")) != str(value):
            continue
        if kind == "envvalue" and entry["pattern"] not in str(value):
            continue
        return entry
    return None


def _fmt(entry, release, **extra):
    return entry["message"].format(release=release, **extra)


def _finding(kind, subject, message):
    return {"kind": kind, "subject": subject, "message": message}


def args_file_argv(text):
    """The argv in a rendered ``.args`` file as the launcher reads it: one argument per ``\\n``-separated
    line, lines starting with ``#`` skipped (empty lines are dropped here too)."""
    return [line for line in str(text).split("\n") if line and not line.startswith("#")]


def split_argv(argv):
    """[(flag, [values])] from an argv: everything before the first ``--x`` is the command."""
    pairs, current = [], None
    for token in [str(t) for t in argv]:
        if token.startswith("--"):
            name, eq, inline = token.partition("=")
            current = (name, [inline] if eq else [])
            pairs.append(current)
        elif current is not None:
            current[1].append(token)
    return pairs


def _check_value(flag_name, spec, values, release, engine, fictions, value_range=None):
    shown = "<secret>" if flag_name in SECRET_FLAGS else " ".join(values)
    action = spec.get("action") or "store"
    if action in _BOOL_ACTIONS:
        if values:
            return [f"`{flag_name}` takes no value in {release} (got {shown!r}): write it bare, or omit it"]
        return []
    if not values:
        return [f"`{flag_name}` needs a value in {release}"]
    nargs = spec.get("nargs")
    if nargs in (None, "?") and len(values) > 1:
        return [f"`{flag_name}` takes one value in {release}, got {len(values)} ({shown})"]
    errors = []
    for value in values:
        entry = _fiction(fictions, "value", flag_name, engine, value)
        choices = spec.get("choices")
        if entry is not None:
            errors.append(_fmt(entry, release, choices=", ".join(choices or [])))
        elif choices and str(value) not in [str(c) for c in choices]:
            errors.append("`{} {}` is not a choice in {}: {}".format(flag_name, shown, release, ", ".join(choices)))
        elif not _type_ok(spec.get("type"), value, spec.get("nullable")):
            errors.append("`{} {}` is not a valid {} for {}".format(flag_name, shown, spec.get("type"), release))
        elif value_range is not None and flag_name not in SECRET_FLAGS:
            error = _range_error(flag_name, value, value_range, release)
            if error:
                errors.append(error)
    return errors


def _type_ok(kind, value, nullable):
    if nullable and value == "None":
        return True
    try:
        if kind == "int":
            int(str(value).replace("_", ""), 10)
        elif kind == "float":
            float(value)
        elif kind in ("json", "json_list"):
            json.loads(value)
    except ValueError:
        return False
    return True


def lint_flags(argv, schema, fictions, release, ranges=None, schema_dir=None):
    engine = schema.get("engine", "")
    table = _flag_table(schema)
    ranges = load_ranges(release, schema_dir) if ranges is None else ranges
    findings = _line_safety(argv)
    unsafe = {f["subject"] for f in findings}
    for name, values in split_argv(argv):
        if name in unsafe:
            continue
        lookup = name if name in table else "--" + name[2:].replace("_", "-")
        if lookup in SECRET_FLAGS:
            findings.append(_finding("secret", name, f"`{lookup}` puts the API key on the engine's command line "
                                     f"(the process list, the journal): remove it and {_KEYS_FIX}"))
            continue
        entry = _fiction(fictions, "flag", lookup, engine)
        if entry is not None and lookup not in table:
            findings.append(_finding("flag", name, _fmt(entry, release)))
            continue
        spec = table.get(lookup)
        if spec is None:
            findings.append(_finding("flag", name, _unknown_flag(name, lookup, table, release, engine, schema_dir)))
            continue
        for message in _check_value(lookup, spec, values, release, engine, fictions, ranges.get(spec.get("dest"))):
            findings.append(_finding("value", name, message))
        if lookup == "--additional-config" and "additional_config" in schema:
            findings.extend(_finding("value", name, m) for m in _additional_config(values, schema, release))
    return findings


def _unknown_flag(name, lookup, table, release, engine, schema_dir):
    """The message for a flag ``release`` lacks: the releases of the same engine that have it, else close names."""
    having = [r for r in _engine_releases(engine, schema_dir) if r != release and lookup in flag_options(r, schema_dir)]
    if having:
        return (f"`{name}` is not a {release} flag (only {', '.join(having)} of this engine has it): drop it, or "
                "pin a release that has it")
    close = difflib.get_close_matches(lookup, list(table), n=3, cutoff=0.75)
    hint = "; did you mean {}?".format(" or ".join(f"`{c}`" for c in close)) if close else ""
    return f"`{name}` is not a {release} flag{hint}"


def _engine_releases(engine, schema_dir):
    prefix = {"vllm": ("vllm-",), "sglang": ("sglang-",)}.get(engine, ())
    return [r for r in known_releases(schema_dir or schema_dir_default()) if r.startswith(prefix)]


def _additional_config(values, schema, release):
    """Findings for the top-level keys of an ``--additional-config`` JSON object that the release's platform
    plugin does not read (its schema's ``additional_config`` list)."""
    known = [entry["name"] for entry in schema.get("additional_config", [])]
    out = []
    for value in values:
        try:
            data = json.loads(value)
        except ValueError:
            continue  # the type check reports it
        if not isinstance(data, dict):
            out.append(f"`--additional-config` must be a JSON object of {release}'s keys, got {type(data).__name__}")
            continue
        for key in sorted(data):
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=2, cutoff=0.75)
                hint = "; did you mean {}?".format(" or ".join(f"`{c}`" for c in close)) if close else ""
                out.append(f"`--additional-config` key `{key}` is not read by {release}{hint}")
    return out


# Characters no environment value carries anywhere: the shell's metacharacters, quoting, escaping and globbing,
# and white space (a value with one would need quoting in the environment file, and podman --env-file takes quotes
# literally).
SHELL_METACHARACTERS = frozenset("$`;&|<>#'\"\\(){}[]*?!~ \t")
# Unicode classes no environment value carries: control (Cc), format (Cf: bidi overrides and isolates, zero-width
# characters), separators (Zs, Zl, Zp), private use and surrogates (Co, Cs).
UNSAFE_CATEGORIES = frozenset(["Cc", "Cf", "Zs", "Zl", "Zp", "Co", "Cs"])
# Variables a process the unit starts as root acts on before the engine runs: the dynamic loader (every ``LD_*``),
# the C library, bash (the launcher, and the CANN scripts it sources), and Podman (a container release reads
# ``$XDG_CONFIG_HOME/containers`` and ``CONTAINERS_*``). Refused for every release: that a release's source reads
# one (vLLM reads LD_PRELOAD and LD_LIBRARY_PATH) does not make it safe in a file root reads first.
ROOT_ENV_PREFIXES = ("LD_", "BASH_FUNC_", "CONTAINERS_")
ROOT_ENV_NAMES = frozenset(["PATH", "HOME", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "CDPATH",
                            "GLOBIGNORE", "PROMPT_COMMAND", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH",
                            "HOSTALIASES", "RESOLV_HOST_CONF", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"])
# Variables an interpreter acts on (code or options loaded into the engine's process): refused unless the release's
# own schema (``env``, read from its source) lists the key, and then held to that key's grammar.
INTERPRETER_ENV_PREFIXES = ("PYTHON", "PERL5", "PERLLIB", "RUBY", "NODE_", "LUA_", "JAVA_", "_JAVA_", "JDK_JAVA_")
# The value grammars (whole-string matches).
DEFAULT_GRAMMAR = r"[A-Za-z0-9_.,:/=+@%-]*"
BOOL_GRAMMAR = r"0|1|[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]"
INT_GRAMMAR = r"-?[0-9]+"
FLOAT_GRAMMAR = r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?"
DEVICE_LIST_GRAMMAR = r"[0-9]+(,[0-9]+)*"
# HCCL's interface filter: ``eth,enp`` (prefixes), ``=eth0`` (exact), ``^...`` (exclude) (module_utils/comm_env.py)
IFNAME_LIST_GRAMMAR = r"\^?=?[A-Za-z0-9_.:@-]+(,[A-Za-z0-9_.:@-]+)*"
# One absolute path, or a colon-separated list of them (CANN's *_PATH variables), with no `..` component.
PATH_GRAMMAR = r"(?!.*(^|/)\.\.(/|:|$))/[A-Za-z0-9_.,+@%/-]*(:/[A-Za-z0-9_.,+@%/-]*)*"
# (name pattern, grammar, what it is): the grammar a key's name says, where platform-env.json gives no pattern.
NAME_GRAMMARS = (
    (r"[A-Z0-9_]*_VISIBLE_DEVICES", DEVICE_LIST_GRAMMAR, "comma-separated device ids"),
    (r"(HCCL|GLOO|TP|NCCL)_SOCKET_IFNAME", IFNAME_LIST_GRAMMAR, "a comma-separated interface filter"),
    (r"PYTHONHASHSEED", r"random|[0-9]+", "`random` or a whole number"),
    (r"[A-Z0-9_]*(_PATH|_DIR|_HOME|_ROOT|_FILE)", PATH_GRAMMAR, "an absolute path (or a ':'-separated list)"),
)
# SGLang's schema types (environ.py): the grammar each needs; a type not named here has the default grammar.
TYPE_GRAMMARS = {"bool": (BOOL_GRAMMAR, "0, 1, true or false"), "int": (INT_GRAMMAR, "a whole number"),
                 "float": (FLOAT_GRAMMAR, "a number")}


def _env_table(schema, platform):
    """{name: platform-env.json pattern or None} of the variables ``schema``'s release reads."""
    engine = schema.get("engine", "")
    table = {e["name"]: None for e in schema.get("env", [])}
    for var in platform.get("variables", []):
        if engine in var.get("engines", []):
            table[var["name"]] = var.get("values")
    return table


def _env_types(schema):
    """{name: schema type} of the release's own variables (SGLang's schemas carry them; vLLM's do not)."""
    return {e["name"]: e["type"] for e in schema.get("env", []) if e.get("type")}


def unsafe_character(text):
    """The first character of ``text`` no environment value carries, as ``(character, what it is)``; None when
    there is none."""
    for char in str(text):
        category = unicodedata.category(char)
        if category == "Cc":
            return char, "a control character"
        if char.isspace():
            return char, "white space"
        if char in SHELL_METACHARACTERS:
            return char, "a shell metacharacter"
        if category in UNSAFE_CATEGORIES:
            return char, "an invisible formatting or separator character"
    return None


def root_variable(name):
    """Whether ``name`` is a variable the root-started launcher, the loader or Podman acts on (never allowed)."""
    return name in ROOT_ENV_NAMES or name.startswith(ROOT_ENV_PREFIXES)


def interpreter_variable(name):
    """Whether ``name`` is a variable an interpreter acts on (allowed only where the release's schema lists it)."""
    return name.startswith(INTERPRETER_ENV_PREFIXES) or name in ("GEM_PATH", "GEM_HOME", "TCLLIBPATH")


def value_grammar(name, pattern, kind):
    """(grammar, what it is) of variable ``name``: the ``platform-env.json`` ``pattern``, else the grammar its name
    says, else the one its schema type ``kind`` says, else the default grammar."""
    if pattern:
        return pattern, "its pattern in platform-env.json"
    for name_pattern, grammar, what in NAME_GRAMMARS:
        if re.fullmatch(name_pattern, name):
            return grammar, what
    if kind in TYPE_GRAMMARS:
        return TYPE_GRAMMARS[kind]
    return DEFAULT_GRAMMAR, "letters, digits and _ . , : / = + @ % -"


def _value_text(value):
    """An environment value as the environment file writes it (booleans lower case, None empty)."""
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def env_value_findings(name, value, release, schema, platform):
    """Findings for variable ``name`` = ``value`` in ``release``'s environment file, the one checker of lint,
    render, plan and the serving role. Kind ``unsafe`` (never overridable): a character no value carries, a variable
    the root-started launcher acts on, an interpreter variable the release's schema does not list. Kind ``env``: a
    value off its key's grammar (:func:`value_grammar`). A variable the release does not read gets no grammar
    finding here (:func:`lint_env` reports it). Empty: safe to write."""
    text = _value_text(value)
    found = unsafe_character(text)
    if found:
        char, what = found
        code = f"U+{ord(char):04X} {unicodedata.name(char, '')}".strip()
        return [_finding("unsafe", name, f"`{name}` has {what} ({code}) in its value: the environment file holds "
                         "one plain value per line, read by the unit's launcher as root; remove it")]
    if root_variable(name):
        return [_finding("unsafe", name, f"`{name}` is acted on by the dynamic loader, bash or Podman, which the "
                         "serving unit starts as root before the engine: the environment file cannot carry it for "
                         "any release (docs/security.md)")]
    listed = {e["name"] for e in schema.get("env", [])}
    if interpreter_variable(name) and name not in listed:
        return [_finding("unsafe", name, f"`{name}` loads code or options into the engine's interpreter and "
                         f"{release} does not read it: the environment file cannot carry it")]
    table = _env_table(schema, platform)
    if name not in table:
        return []
    grammar, what = value_grammar(name, table[name], _env_types(schema).get(name))
    if not re.fullmatch(grammar, text):
        shown = "<secret>" if name in SECRET_ENV else text
        return [_finding("env", name, f"`{name}={shown}` does not match what {release} accepts ({what}: {grammar})")]
    return []


def _refused_outright(name, text, schema):
    """Whether ``name`` = ``text`` is refused before any other check (a character or a variable no release
    allows in the environment file)."""
    listed = {e["name"] for e in schema.get("env", [])}
    return bool(unsafe_character(text) or root_variable(name) or (interpreter_variable(name) and name not in listed))


def lint_env(env, schema, platform, fictions, release):
    """Findings for the environment ``env`` of ``release``: what no release allows (:func:`env_value_findings`),
    the deployment guide's fictions, variables the release does not read, values off their key's grammar."""
    engine = schema.get("engine", "")
    table = _env_table(schema, platform)
    findings = []
    for name in sorted(env or {}):
        value = _value_text(env[name])
        shown = "<secret>" if name in SECRET_ENV else value
        if _refused_outright(name, value, schema):
            findings.extend(env_value_findings(name, env[name], release, schema, platform))
            continue
        entry = _fiction(fictions, "env", name, engine)
        if entry is not None and name not in table:
            findings.append(_finding("env", name, _fmt(entry, release)))
            continue
        entry = _fiction(fictions, "envvalue", name, engine, value)
        if entry is not None:
            findings.append(_finding("env", name, _fmt(entry, release, value=shown)))
            continue
        if name not in table:
            findings.append(_finding("env", name, f"`{name}` is not read by {release} (not in its envs, the "
                                     "engine's source or platform-env.json): unknown variables are errors"))
            continue
        findings.extend(env_value_findings(name, env[name], release, schema, platform))
    return findings


def parse_env_file(text):
    """(environment, findings) of a rendered ``.env`` file as systemd's EnvironmentFile reads it: ``KEY=value``
    lines, ``#`` and ``;`` lines comments, a value in double quotes unquoted. A line that is none of these is an
    ``unsafe`` finding (systemd would skip or misread it)."""
    env, findings = {}, []
    for number, line in enumerate(str(text).split("\n"), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        key, eq, value = line.partition("=")
        if not eq or not ENV_NAME.fullmatch(key):
            findings.append(_finding("unsafe", f"line {number}", f"line {number} of the environment file is not "
                                     "KEY=value with KEY a variable name: remove it"))
            continue
        env[key] = value[1:-1] if len(value) > 1 and value.startswith('"') and value.endswith('"') else value
    return env, findings


def lint(argv, env, release, schema_dir=None):
    """Every finding for ``argv`` + ``env`` against ``release``; empty list when all is real."""
    schema, platform, fictions = load(release, schema_dir)
    ranges = load_ranges(release, schema_dir)
    env = env or {}
    keys = [_finding("secret", name, f"`{name}` puts the API key in the engine's environment file: remove it and "
                     + _KEYS_FIX) for name in sorted(env) if name in SECRET_ENV]
    rest = {name: value for name, value in env.items() if name not in SECRET_ENV}
    return (lint_flags(argv, schema, fictions, release, ranges, schema_dir) + keys
            + lint_env(rest, schema, platform, fictions, release))
