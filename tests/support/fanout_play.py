"""A playbook over a fan-out inventory of loopback nodes, with this checkout's roles and collection, and its recap
per node."""

from __future__ import annotations

import json
from pathlib import Path

from support.ansible_run import ansible_env, run_playbook

NODES = {"n1": ("127.0.0.1", "a"), "n2": ("127.0.0.2", "a"), "n3": ("127.0.0.3", "b"), "n4": ("127.0.0.4", "b")}


def play(tmp: Path, inventory: dict, playbook: str, extra: dict, *args: str) -> tuple[int, str]:
    """``playbook`` over ``inventory`` with this checkout's roles and collection: (exit status, its output)."""
    (tmp / "inventory.json").write_text(json.dumps(inventory))
    (tmp / "play.yml").write_text(playbook)
    proc = run_playbook(tmp / "inventory.json", tmp / "play.yml", "-e", json.dumps(extra), *args, cwd=tmp,
                        env=ansible_env(tmp), timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def recap(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in NODES and parts[1] == ":":
            out[parts[0]] = {k: int(v) for k, v in (p.split("=") for p in parts[2:])}
    return out
