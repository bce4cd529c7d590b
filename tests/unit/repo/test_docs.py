"""The documentation describes the tree as it is.

- DESIGN.md names no repository path that does not exist, and states the import-linter contracts.
- The collection's README lists every module and every filter, and nothing else.
- No tracked file outside docs/ cites a document that is not in this repository (the facts the code
  relies on, with their sources, are in docs/).
- The docs, configuration, code and tests describe the product, not the history of its development: no
  issue, stop or goal numbers (the history is in git).
- README.md's first screen has the quick start and where to go next; the reference tables are in docs/.

- `ansible-doc atlas.serving.<module>` renders every module, with its attributes and authors; what two
  modules share is described once, in a doc fragment (plugins/doc_fragments/).
"""

from __future__ import annotations

import ast
import glob
import importlib
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
COLLECTION = ROOT / "collections" / "ansible_collections" / "atlas" / "serving"

# --- DESIGN.md: every repository path it names exists -----------------------------------------

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`([^`\n]+)`")
_PLACEHOLDER = re.compile(r"<[^<>]*>")
_CIDR = re.compile(r"^\d+(\.\d+){3}/\d+$")


def _ignored(root: Path) -> tuple[str, ...]:
    """Root-anchored entries of .gitignore: generated outputs a document may name (dist/, artifacts/)."""
    lines = (root / ".gitignore").read_text().splitlines()
    return tuple(line[1:] for line in lines if line.startswith("/"))


def named_paths(text: str) -> list[str]:
    """Words of inline code spans (outside fenced blocks) that name a repository path: they contain a
    '/' or end in .yml/.py/.md. Not repository paths: absolute, home, URLs, CIDRs, and paths under a
    placeholder base (``<bundle>/``, ``<state>/``), which live outside the checkout."""
    found = []
    for span in _CODE.findall(_FENCE.sub("", text)):
        for word in _PLACEHOLDER.sub("<x>", span).split():
            word = word.rstrip(",;:")
            if not ("/" in word or re.search(r"\.(yml|py|md)$", word)):
                continue
            if word.startswith(("/", "~", "$", "<", "-")) or "://" in word or _CIDR.match(word):
                continue
            found.append(word)
    return found


def missing_paths(text: str, root: Path) -> list[str]:
    """The named repository paths that match nothing in ``root`` (``<x>`` placeholders match any name)."""
    generated = _ignored(root)
    missing = []
    for word in named_paths(text):
        if word.startswith(generated):
            continue
        pattern = _PLACEHOLDER.sub("*", word)
        if not glob.glob(str(root / pattern)):
            missing.append(word)
    return missing


def test_design_names_only_paths_that_exist():
    missing = missing_paths((ROOT / "DESIGN.md").read_text(), ROOT)
    assert missing == [], f"DESIGN.md names paths that are not in the tree: {missing}; fix DESIGN.md"


def test_design_names_many_paths():
    # the check reads what DESIGN.md names (a broken extraction would pass everything)
    words = named_paths((ROOT / "DESIGN.md").read_text())
    assert {"site.yml", "playbooks/gateway.yml", "roles/layout/defaults/main.yml"} <= set(words)


def test_the_path_check_finds_a_wrong_path(tmp_path):
    (tmp_path / ".gitignore").write_text("/dist/\n")
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks" / "cann.yml").write_text("")
    text = ("`playbooks/site/*.yml` and `playbooks/<stage>.yml`, `playbooks/cann.yml`, `missing.py`,\n"
            "`dist/x.whl`, `/usr/local/Ascend/`, `<bundle>/suite/`, `10.77.0.0/24`, `ansible-playbook x/y.yml`\n"
            "```\nplaybooks/in-a-fence.yml `not/checked.yml`\n```\n")
    assert missing_paths(text, tmp_path) == ["playbooks/site/*.yml", "missing.py", "x/y.yml"]


def test_design_states_every_import_linter_contract():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    design = (ROOT / "DESIGN.md").read_text()
    names = [contract["name"] for contract in config["contracts"]]
    assert names
    assert [n for n in names if n not in design] == [], "DESIGN.md, 'The parts and the dependency rule'"


# --- The collection's README: every module and filter ----------------------------------------


def collection_plugins(collection: Path = COLLECTION) -> dict[str, set[str]]:
    filters = set()
    for path in sorted((collection / "plugins" / "filter").glob("*.py")):
        module = importlib.import_module(f"ansible_collections.atlas.serving.plugins.filter.{path.stem}")
        filters |= set(module.FilterModule().filters())
    modules = {p.stem for p in (collection / "plugins" / "modules").glob("*.py") if not p.stem.startswith("_")}
    return {"module": modules, "filter": filters}


def readme_plugins(text: str) -> dict[str, set[str]]:
    """Names in the first column of the README's 'module' and 'filter' tables."""
    found: dict[str, set[str]] = {"module": set(), "filter": set()}
    kind = None
    for line in text.splitlines():
        header = re.match(r"^\|\s*(module|filter)\s*\|", line)
        if header:
            kind = header.group(1)
        elif not line.startswith("|"):
            kind = None
        elif kind and not line.startswith("|---"):
            found[kind] |= set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", line.split("|")[1]))
    return found


def test_collection_readme_lists_every_module_and_filter():
    listed = readme_plugins((COLLECTION / "README.md").read_text())
    real = collection_plugins()
    assert len(real["module"]) >= 10 and len(real["filter"]) >= 15
    for kind in ("module", "filter"):
        assert sorted(real[kind] - listed[kind]) == [], f"README.md misses these {kind}s: add a row each"
        assert sorted(listed[kind] - real[kind]) == [], f"README.md lists {kind}s that do not exist"


def test_the_readme_check_sees_a_missing_and_an_extra_name():
    text = "| module | what |\n|---|---|\n| `npu_facts` | x |\n\n| filter | file | what |\n|---|---|---|\n" \
           "| `engine_argv`, `gone` | `serving.py` | x |\n"
    assert readme_plugins(text) == {"module": {"npu_facts"}, "filter": {"engine_argv", "gone"}}


# --- No citation of documents outside this repository ----------------------------------------

# The project's working notes (PRODUCT.md, STYLE.md, domain/*.md) live outside the repository; what the
# code relies on from them is in docs/ with its sources.
OUTSIDE = re.compile(r"ascend-facts|multinode-facts|lab-notes|rollout-and-bench|PRODUCT\.md|STYLE\.md"
                     r"|(?<![\w.-])shared/")


def matching_lines(root: Path, files: list[str], pattern: re.Pattern, checked) -> list[str]:
    """'name:line: text' of every line matching ``pattern`` in the ``files`` for which ``checked(name)`` holds
    (this test module, which names the patterns, aside)."""
    found = []
    for name in files:
        path = root / name
        if not checked(name) or not path.is_file() or path.resolve() == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def outside_citations(root: Path, files: list[str]) -> list[str]:
    return matching_lines(root, files, OUTSIDE, lambda name: not name.startswith("docs/"))


def tracked_files(root: Path) -> list[str]:
    try:
        run = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"{root} is not a git checkout ({exc}): nothing tracked to check")
    return [name for name in run.stdout.decode().split("\0") if name]


def test_no_tracked_file_cites_a_document_outside_the_repository():
    found = outside_citations(ROOT, tracked_files(ROOT))
    assert found == [], "cite docs/ (docs/ascend-platform.md, docs/engine-facts.md) instead:\n" + "\n".join(found)


def test_the_citation_check_sees_one(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("from ascend-facts.md section 1\n")
    (tmp_path / "x.py").write_text("ok\n# see ascend-facts.md section 5\n")
    (tmp_path / "y.yml").write_text("# /work/shared/domain/lab-notes.md\n# /usr/lib/x-shared/ is fine\n")
    assert outside_citations(tmp_path, ["docs/a.md", "x.py", "y.yml"]) == [
        "x.py:2: # see ascend-facts.md section 5", "y.yml:1: # /work/shared/domain/lab-notes.md"]


MODULES = COLLECTION / "plugins" / "modules"


def module_names() -> list[str]:
    return sorted(p.stem for p in MODULES.glob("*.py") if p.stem != "__init__")


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), *args,
                           *[f"atlas.serving.{m}" for m in module_names()]], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def rendered() -> dict:
    """``ansible-doc --json`` of every module: its documentation with the doc fragments merged in."""
    proc = ansible_doc("--json")
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_every_module_documents_itself_as_ansible_doc_reads_it(rendered):
    """`ansible-doc atlas.serving.<module>` works for every module: its DOCUMENTATION and RETURN are YAML whose
    descriptions are text (a stray `key: value` inside a sentence turns it into a mapping, and ansible-doc
    and ansible-lint then cannot read the module)."""
    assert sorted(rendered) == [f"atlas.serving.{m}" for m in module_names()]

    def text(value):
        return all(isinstance(t, str) for t in (value if isinstance(value, list) else [value]))

    for name, doc in rendered.items():
        assert text(doc["doc"]["description"]), name
        for option, spec in (doc["doc"].get("options") or {}).items():
            assert text(spec.get("description")), (name, option)


# --- The product, not the history of its development -----------------------------------------

HISTORY = re.compile(r"stop [0-9]|issue [0-9]|goal [0-9]", re.IGNORECASE)
DESCRIBED = ("docs/", "README.md", "DESIGN.md", "ansible.cfg", "Makefile", "roles/", "collections/", "tools/",
             "inventory/", "tests/", "playbooks/", "site.yml")


def history_lines(root: Path, files: list[str]) -> list[str]:
    return matching_lines(root, files, HISTORY, lambda name: name.startswith(DESCRIBED))


def test_nothing_tells_the_history_of_its_development():
    found = history_lines(ROOT, tracked_files(ROOT))
    assert found == [], "state what the product does and why; the history stays in git:\n" + "\n".join(found)


def test_the_history_check_sees_one(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("ok\n### Stop 29: what was cut\n")
    (tmp_path / "Makefile").write_text("# see issue 16\n")
    (tmp_path / "notes.md").write_text("goal 1 outside the described files\n")
    assert history_lines(tmp_path, ["docs/a.md", "Makefile", "notes.md"]) == [
        "docs/a.md:2: ### Stop 29: what was cut", "Makefile:1: # see issue 16"]


# --- README.md: one screen to start ------------------------------------------------------------

SCREEN = 50


def test_the_readme_starts_with_the_quick_start_and_where_to_go_next():
    first = (ROOT / "README.md").read_text().splitlines()[:SCREEN]
    text = "\n".join(first)
    for wanted in ("make demo", "make test", "make unit", "docs/reference.md", "docs/lab.md", "DESIGN.md"):
        assert wanted in text, f"README.md's first {SCREEN} lines lack {wanted!r}"
    assert not [line for line in first if line.startswith("|")], "reference tables belong in docs/reference.md"
    for name in ("reference.md", "lab.md", "performance.md"):
        assert (ROOT / "docs" / name).is_file(), name

def test_ansible_doc_renders_every_module_as_text():
    """What a user reads: `ansible-doc atlas.serving.<module>`, each page with its options and authors."""
    proc = ansible_doc()
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, proc.stderr[-3000:]
    pages = re.split(r"^> MODULE ", proc.stdout, flags=re.MULTILINE)[1:]
    assert [page.split()[0] for page in pages] == [f"atlas.serving.{m}" for m in module_names()]
    for page in pages:
        assert "AUTHOR: " in page and "ATTRIBUTES:" in page, page[:200]


def test_every_module_states_its_attributes_and_authors(rendered):
    """Each module states its check mode and diff support; what they mean and who wrote the modules come from
    the collection's doc fragment (plugins/doc_fragments/module.py), as ansible-test's validate-modules wants."""
    for name, entry in rendered.items():
        doc = entry["doc"]
        assert doc.get("author"), name
        attributes = doc.get("attributes") or {}
        assert {"check_mode", "diff_mode"} <= set(attributes), name
        for attribute, spec in attributes.items():
            assert spec.get("description") and spec.get("support") in ("full", "partial", "none"), (name, attribute)


def own_docs(folder: Path = MODULES) -> dict[str, dict]:
    """Each module's own DOCUMENTATION, before its doc fragments are merged in."""
    docs = {}
    for path in sorted(folder.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
                docs[path.stem] = yaml.safe_load(node.value.value)
    return docs


def repeated_options(docs: dict[str, dict]) -> list[str]:
    """Options that two modules describe with the same words: their one description belongs in a doc
    fragment (plugins/doc_fragments/) that both extend."""
    seen: dict[tuple[str, str], list[str]] = {}
    for module, doc in docs.items():
        for option, spec in ((doc or {}).get("options") or {}).items():
            words = spec.get("description") if isinstance(spec, dict) else None
            if words:
                text = " ".join(" ".join(words if isinstance(words, list) else [words]).split())
                seen.setdefault((option, text), []).append(module)
    return sorted(f"{option}: {', '.join(modules)}" for (option, _), modules in seen.items() if len(modules) > 1)


def test_no_two_modules_repeat_an_option_description():
    # the check sees a repeat (a list or a folded string, the same words), and an override is none
    sample = {"a": {"options": {"tool_path": {"description": ["Path of  the tool."]}, "x": {"description": "X."}}},
              "b": {"options": {"tool_path": {"description": "Path of the\n tool."}, "x": {"description": "Y."}}},
              "c": {"options": {"tool_path": {"required": True}}}}
    assert repeated_options(sample) == ["tool_path: a, b"]
    docs = own_docs()
    assert len(docs) == len(module_names())
    assert repeated_options(docs) == [], "move each into plugins/doc_fragments/ and extend it"
    assert all("atlas.serving.module" in doc.get("extends_documentation_fragment", []) for doc in docs.values())
