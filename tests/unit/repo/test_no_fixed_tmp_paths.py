"""No fixed /tmp or /var/tmp path in what runs as root: roles, playbooks, the collection, atlasctl,
the lab and benchmark helpers, and the shipped configuration (ansible.cfg: SSH control sockets).

A predictable path in a world-writable directory lets any local user plant a file or a symlink
there before root uses it. Temporary files come from tempfile/mkdtemp/mktemp (allowed on the
line); root-only work directories live under /var/lib/atlas (e.g. cann_work_dir, 0700).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("roles", "playbooks", "tools", "collections")
TOP_FILES = ("ansible.cfg", "site.yml", "execution-environment.yml")
SUFFIXES = {".py", ".yml", ".yaml", ".sh", ".j2", ".cfg", ".service", ".ini"}
FIXED_TMP = re.compile(r"(?<![\w$}.-])/(?:var/)?tmp/[\w.{-]")
SAFE_ON_LINE = re.compile(r"mktemp|mkdtemp|tempfile|TMPDIR|gettempdir")


def scanned_files() -> list[Path]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).is_file()]
    for top in SCANNED:
        files += sorted(p for p in (ROOT / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [p for p in files if p.suffix in SUFFIXES]


def offenders() -> list[str]:
    found = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if FIXED_TMP.search(line) and not SAFE_ON_LINE.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_fixed_tmp_paths_in_root_run_steps():
    assert offenders() == []


def test_the_scan_finds_a_fixed_tmp_path():
    assert FIXED_TMP.search('cann_work_dir: /var/tmp/atlas-cann') and FIXED_TMP.search('dest: "/tmp/x.run"')
    assert not FIXED_TMP.search("never a shared /tmp.") and not FIXED_TMP.search("{{ tmp }}/tmp/x")
    assert FIXED_TMP.search("control_path_dir = /tmp/.atlas-ansible-cp")
    assert ROOT / "ansible.cfg" in scanned_files()
