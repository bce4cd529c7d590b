"""No fixed /tmp or /var/tmp path in what runs as root: roles, playbooks, the collection, atlasctl.

A predictable path in a world-writable directory lets any local user plant a file or a symlink
there before root uses it. Temporary files come from tempfile/mkdtemp/mktemp (allowed on the
line); root-only work directories live under /var/lib/atlas (e.g. cann_work_dir, 0700).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("roles", "playbooks", "tools", "collections")
SUFFIXES = {".py", ".yml", ".yaml", ".sh", ".j2", ".cfg", ".service", ".ini"}
FIXED_TMP = re.compile(r"(?<![\w$}.-])/(?:var/)?tmp/[\w.{-]")
SAFE_ON_LINE = re.compile(r"mktemp|mkdtemp|tempfile|TMPDIR|gettempdir")
# Known, reviewed exceptions (path: why). Controller-side lab benchmarks, not node or product steps.
ALLOWED = {
    "tools/atlasctl/bench_accuracy.py": "lab benchmark: default location of a throwaway vLLM venv (env override)",
    "tools/atlasctl/rollout_bench.py": "lab benchmark: its own ssh ControlPath directory",
}


def offenders() -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix not in SUFFIXES or not path.is_file() or rel in ALLOWED or "__pycache__" in rel:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                if FIXED_TMP.search(line) and not SAFE_ON_LINE.search(line):
                    found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_no_fixed_tmp_paths_in_root_run_steps():
    assert offenders() == []


def test_the_scan_finds_a_fixed_tmp_path():
    assert FIXED_TMP.search('cann_work_dir: /var/tmp/atlas-cann') and FIXED_TMP.search('dest: "/tmp/x.run"')
    assert not FIXED_TMP.search("never a shared /tmp.") and not FIXED_TMP.search("{{ tmp }}/tmp/x")
    assert all((ROOT / rel).is_file() for rel in ALLOWED)
