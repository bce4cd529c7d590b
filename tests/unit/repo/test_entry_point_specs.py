"""Every role entry point another role or playbook calls is typed: each ``include_role``/``import_role`` with
``tasks_from: X`` in the product (roles, playbooks, site.yml, the collection's roles and playbooks) names an entry
point ``X`` of that role's ``meta/argument_specs.yml``, so Ansible validates what the caller passes before the first
task runs. Ansible looks the spec up by the literal ``tasks_from`` value: ``X.yml`` would skip it, so call sites name
the bare entry point. Every role has a ``main`` entry (roles/layout too: its defaults are the node layout), every
entry point has its tasks file, and a spec default is the role default it documents."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
INCLUDES = {f"{prefix}{verb}_role" for prefix in ("", "ansible.builtin.", "ansible.legacy.")
            for verb in ("include", "import")}
TASKS_FROM_LINE = re.compile(r"^[^#]*\btasks_from:\s*\S")


class _Loader(yaml.SafeLoader):
    """Safe loading that keeps a tagged value (!vault, !unsafe) as its plain scalar."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)


def _load(path: Path) -> object:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)


def product_files(root: Path = ROOT) -> list[Path]:
    files = [*(root / "roles").rglob("*.yml"), *(root / "playbooks").rglob("*.yml"), root / "site.yml",
             *(root / "collections").glob("ansible_collections/*/*/roles/**/*.yml"),
             *(root / "collections").glob("ansible_collections/*/*/playbooks/**/*.yml")]
    return sorted(p for p in files if p.is_file() and ".venv" not in p.parts)


def _walk(node: object):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def call_sites(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(path, role, tasks_from) of every include_role/import_role with tasks_from in the product."""
    found = []
    for path in product_files(root):
        for node in _walk(_load(path)):
            for key in INCLUDES & node.keys():
                args = node[key]
                if isinstance(args, dict) and "tasks_from" in args:
                    found.append((str(path.relative_to(root)), str(args.get("name")), str(args["tasks_from"])))
    return found


def tasks_from_lines(root: Path = ROOT) -> int:
    return sum(1 for path in product_files(root) for line in path.read_text(encoding="utf-8").splitlines()
               if TASKS_FROM_LINE.match(line))


def entry_points(role: Path) -> dict:
    spec = role / "meta/argument_specs.yml"
    return ((_load(spec) or {}).get("argument_specs") or {}) if spec.is_file() else {}


def missing_specs(root: Path = ROOT) -> list[str]:
    problems = []
    for path, role, tasks_from in call_sites(root):
        where = f"{path}: {role} tasks_from {tasks_from}"
        if not (root / "roles" / role).is_dir():
            problems.append(f"{where}: no roles/{role}")
        elif tasks_from.endswith((".yml", ".yaml")):
            problems.append(f"{where}: name the entry point without the suffix (Ansible skips its spec)")
        elif tasks_from not in entry_points(root / "roles" / role):
            problems.append(f"{where}: no entry point {tasks_from!r} in roles/{role}/meta/argument_specs.yml")
    return problems


def test_every_tasks_from_entry_point_has_an_argument_spec():
    assert missing_specs() == []


def test_every_tasks_from_line_is_a_call_site_the_check_sees():
    sites = call_sites()
    assert sites and len(sites) == tasks_from_lines(), sites


def test_every_role_has_a_main_entry_and_every_entry_its_tasks_file():
    problems = []
    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()):
        specs = entry_points(role)
        if "main" not in specs:
            problems.append(f"roles/{role.name}: no main entry in meta/argument_specs.yml")
        for name, spec in specs.items():
            if name != "main" and not (role / "tasks" / f"{name}.yml").is_file():
                problems.append(f"roles/{role.name}: entry point {name} has no tasks/{name}.yml")
            if not (spec or {}).get("short_description"):
                problems.append(f"roles/{role.name}: entry point {name} has no short_description")
    assert problems == []


def test_a_spec_default_is_the_role_default():
    problems = []
    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()):
        defaults_file = role / "defaults/main.yml"
        defaults = (_load(defaults_file) or {}) if defaults_file.is_file() else {}
        for name, spec in entry_points(role).items():
            for option, attrs in ((spec or {}).get("options") or {}).items():
                if "default" not in attrs:
                    continue
                if attrs.get("required"):
                    problems.append(f"roles/{role.name} {name}: {option} is required and has a default")
                if option in defaults and defaults[option] != attrs["default"]:
                    problems.append(f"roles/{role.name} {name}: {option} default {attrs['default']!r}, "
                                    f"defaults/main.yml {defaults[option]!r}")
    assert problems == []


def test_the_check_sees_a_call_site_without_a_spec(tmp_path):
    (tmp_path / "roles/r/tasks").mkdir(parents=True)
    (tmp_path / "roles/r/meta").mkdir()
    (tmp_path / "roles/r/tasks/x.yml").write_text("---\n[]\n")
    (tmp_path / "roles/r/meta/argument_specs.yml").write_text(
        "---\nargument_specs:\n  main:\n    short_description: m\n  x:\n    short_description: x\n")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "site.yml").write_text("---\n- hosts: all\n  tasks:\n    - block:\n"
                                       "        - ansible.builtin.include_role: {name: r, tasks_from: y}\n"
                                       "      rescue:\n        - import_role:\n            name: r\n"
                                       "            tasks_from: x.yml\n"
                                       "    - ansible.builtin.include_role: {name: r, tasks_from: x}\n")
    assert tasks_from_lines(tmp_path) == 3 == len(call_sites(tmp_path))
    assert missing_specs(tmp_path) == [
        "site.yml: r tasks_from y: no entry point 'y' in roles/r/meta/argument_specs.yml",
        "site.yml: r tasks_from x.yml: name the entry point without the suffix (Ansible skips its spec)"]
