"""Roles publish what others need as documented facts, not private variables: a variable starting with
``__<role>_`` belongs to that role, and no other role, playbook or site.yml reads or sets it (the serving
role's profile reaches preflight and the rollout as the fact ``serving_profile_resolved``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRIVATE = re.compile(r"\b__([a-z][a-z0-9_]*)")


def foreign_private_uses(root: Path | None = None) -> list[str]:
    """``path:line: __var`` for each mention of another role's private variable."""
    root = root or ROOT
    roles = sorted((p.name for p in (root / "roles").iterdir() if p.is_dir()), key=len, reverse=True)
    files = [(p, p.relative_to(root / "roles").parts[0]) for p in sorted((root / "roles").rglob("*"))
             if p.is_file() and p.suffix in (".yml", ".yaml", ".j2")]
    files += [(p, None) for p in [*sorted((root / "playbooks").rglob("*.yml")), root / "site.yml"] if p.is_file()]
    found = []
    for path, own in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for name in PRIVATE.findall(line):
                owner = next((r for r in roles if name.startswith(f"{r}_")), None)
                if owner is not None and owner != own:
                    found.append(f"{path.relative_to(root)}:{number}: __{name} (private to roles/{owner})")
    return found


def test_no_role_or_playbook_reads_another_role_private_variable():
    assert foreign_private_uses() == []


def test_the_check_sees_a_foreign_private_variable(tmp_path, monkeypatch):
    for role in ("serving", "preflight"):
        (tmp_path / "roles" / role / "tasks").mkdir(parents=True)
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "roles/serving/tasks/main.yml").write_text("x: '{{ __serving_profile.port }}'\n")  # its own
    (tmp_path / "roles/preflight/tasks/plan.yml").write_text("a: 1\nx: '{{ __serving_profile.flags }}'\n")
    (tmp_path / "playbooks/slo.yml").write_text("x: '{{ __serving_profile.slo }} {{ __rollout_slo }}'\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert foreign_private_uses() == [
        "roles/preflight/tasks/plan.yml:2: __serving_profile (private to roles/serving)",
        "playbooks/slo.yml:1: __serving_profile (private to roles/serving)",
    ]
