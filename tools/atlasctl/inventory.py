"""Reading an Ansible inventory the way Ansible does: ``ansible-inventory -i INV --list``.

One place for running it and walking its groups; callers (doctor over fabric, bundle push
over rsync/ssh) turn host vars into their own connection settings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from atlasctl.errors import EnvironmentProblem, UsageError

SERVING_GROUP = "atlas_nodes"


def listing(inventory: Path, limit: str | None = None) -> dict[str, Any]:
    """The ``--list`` document (groups, and host vars under ``_meta``), narrowed by ``limit``."""
    beside = Path(sys.executable).parent / "ansible-inventory"
    exe = str(beside) if beside.is_file() else shutil.which("ansible-inventory")
    if exe is None:
        raise EnvironmentProblem("ansible-inventory is not on PATH", fix="activate the controller virtualenv (.venv)")
    argv = [exe, "-i", str(inventory), "--list"] + (["--limit", limit] if limit else [])
    # Every host variable (keys included) is in this output: never into an Ansible log file.
    env = {**os.environ, "ANSIBLE_LOG_PATH": "/dev/null"}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=env)
    if proc.returncode != 0:
        raise UsageError(f"ansible-inventory -i {inventory} failed: {proc.stderr.strip()[-800:]}",
                         fix="fix the inventory (ansible-inventory -i INV --graph shows what it reads)")
    try:
        return json.loads(proc.stdout)
    except ValueError as exc:
        raise UsageError(f"ansible-inventory -i {inventory} printed no JSON: {exc}") from None


def group_hosts(data: dict[str, Any], group: str, seen: set[str] | None = None) -> set[str]:
    """Every host of ``group`` and its child groups, however deep."""
    seen = seen if seen is not None else set()
    if group in seen or group not in data:
        return set()
    seen.add(group)
    entry = data[group] or {}
    hosts = set(entry.get("hosts") or [])
    for child in entry.get("children") or []:
        hosts |= group_hosts(data, child, seen)
    return hosts


def hostvars(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return (data.get("_meta") or {}).get("hostvars") or {}
