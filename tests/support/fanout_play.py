"""A playbook over a fan-out inventory of loopback nodes, with this checkout's roles and collection, and its recap
per node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
NODES = {"n1": ("127.0.0.1", "a"), "n2": ("127.0.0.2", "a"), "n3": ("127.0.0.3", "b"), "n4": ("127.0.0.4", "b")}


def play(tmp: Path, inventory: dict, playbook: str, extra: dict, *args: str) -> tuple[int, str]:
    """``playbook`` over ``inventory`` with this checkout's roles and collection: (exit status, its output)."""
    (tmp / "inventory.json").write_text(json.dumps(inventory))
    (tmp / "play.yml").write_text(playbook)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp"),
           "ANSIBLE_STDOUT_CALLBACK": "default"}
    proc = subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(tmp / "inventory.json"), str(tmp / "play.yml"),
                           "-e", json.dumps(extra), *args], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def recap(text: str) -> dict[str, dict[str, int]]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in NODES and parts[1] == ":":
            out[parts[0]] = {k: int(v) for k, v in (p.split("=") for p in parts[2:])}
    return out
