"""Every filter of atlas.serving documents itself as ansible-doc reads a filter's documentation.

A filter's documentation is the YAML file beside its plugin, ``plugins/filter/<filter name>.yml`` (DOCUMENTATION,
EXAMPLES, RETURN), as ansible-core documents its own filters. ``ansible-doc -t filter -l atlas.serving`` lists
every filter the FilterModule classes define, none UNDOCUMENTED, and ``ansible-doc -t filter atlas.serving.<name>``
renders each: a short description, its options (every description text, the documented keywords the function's
own), examples and the return value.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FILTERS = ROOT / "collections" / "ansible_collections" / "atlas" / "serving" / "plugins" / "filter"


def filter_functions() -> dict:
    """{filter name: its function}, from every plugin file's FilterModule."""
    found = {}
    for path in sorted(FILTERS.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"ansible_collections.atlas.serving.plugins.filter.{path.stem}")
        for name, function in module.FilterModule().filters().items():
            assert name not in found, f"filter {name} is defined twice ({path.name})"
            found[name] = function
    return found


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "-t", "filter", *args], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def functions() -> dict:
    return filter_functions()


@pytest.fixture(scope="module")
def rendered(functions) -> dict:
    """``ansible-doc -t filter --json`` of every filter."""
    proc = ansible_doc("--json", *[f"atlas.serving.{name}" for name in sorted(functions)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_list_has_every_filter_and_none_undocumented(functions):
    proc = ansible_doc("-l", "atlas.serving")
    assert proc.returncode == 0, proc.stderr[-3000:]
    listed = {}
    for line in proc.stdout.splitlines():
        if line.strip():
            name, _sep, summary = line.strip().partition(" ")
            listed[name] = summary.strip()
    undocumented = sorted(name for name, summary in listed.items() if "UNDOCUMENTED" in summary)
    assert undocumented == [], "no plugins/filter/<name>.yml (or one ansible-doc cannot read) for these"
    assert set(listed) == {f"atlas.serving.{name}" for name in functions}


def _texts(value) -> bool:
    texts = value if isinstance(value, list) else [value]
    return bool(value) and all(isinstance(t, str) and t.strip() for t in texts)


def _return_problems(entries: dict, where: str) -> list[str]:
    problems = []
    for key, spec in (entries or {}).items():
        if not _texts(spec.get("description")):
            problems.append(f"{where}.{key}: description is not text")
        problems += _return_problems(spec.get("contains"), f"{where}.{key}")
    return problems


def test_every_filter_renders_its_documentation(functions, rendered):
    """Each filter's page: its own name, a short description, text descriptions (a stray ``key: value`` in a
    sentence makes a mapping), every positional argument an option, examples, and what it returns."""
    assert sorted(rendered) == sorted(f"atlas.serving.{name}" for name in functions)
    problems = []
    for name in sorted(functions):
        page = rendered[f"atlas.serving.{name}"]
        doc = page.get("doc") or {}
        if doc.get("name") != name:
            problems.append(f"{name}: DOCUMENTATION names {doc.get('name')!r}")
        if not _texts(doc.get("short_description")):
            problems.append(f"{name}: no short_description")
        if not _texts(doc.get("description")):
            problems.append(f"{name}: no description")
        options = doc.get("options") or {}
        for option, spec in options.items():
            if not _texts(spec.get("description")):
                problems.append(f"{name}: option {option}: description is not text")
        positional = [p.strip() for p in str(doc.get("positional") or "").split(",") if p.strip()]
        problems += [f"{name}: positional {p} is not an option" for p in positional if p not in options]
        if not str(page.get("examples") or "").strip():
            problems.append(f"{name}: no EXAMPLES")
        returned = page.get("return") or {}
        if "_value" not in returned:
            problems.append(f"{name}: RETURN has no _value")
        problems += _return_problems(returned, f"{name}: RETURN")
    assert problems == []


def test_documented_keywords_are_the_functions_own(functions, rendered):
    """An option a call may name (not ``_input``, not a ``_positional`` label) is a parameter of the filter's
    function, unless the function takes any keyword (``**options``)."""
    problems = []
    for name, function in sorted(functions.items()):
        parameters = inspect.signature(function).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            continue
        options = (rendered[f"atlas.serving.{name}"].get("doc") or {}).get("options") or {}
        problems += [f"{name}: option {option} is no parameter of {function.__name__}" for option in options
                     if not option.startswith("_") and option not in list(parameters)[1:]]
    assert problems == []
