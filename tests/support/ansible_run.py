"""One way for the role tests to run ansible-playbook: this checkout's configuration, roles and collection, a
private temporary directory, and the plain callback whose lines the tests read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def ansible_env(tmp: Path, *, path: Path | str | None = None, nocolor: bool = False, callback: str | None = "default",
                **extra: str) -> dict[str, str]:
    """The environment of a role test's ansible-playbook run: ``path`` goes first on PATH (the test's stand-ins),
    ``extra`` adds variables (the stand-ins' own); ``callback`` None keeps ansible.cfg's (YAML) output."""
    env = {**os.environ,
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
           "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-local"),
           "ANSIBLE_REMOTE_TEMP": str(tmp / "ansible-remote")}
    if callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = callback
    if nocolor:
        env["ANSIBLE_NOCOLOR"] = "1"
    if path:
        env["PATH"] = f"{path}:{os.environ['PATH']}"
    return env | extra


def run_playbook(inventory: Path | str, playbook: Path | str, *args: str, cwd: Path, env: dict[str, str],
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """``ansible-playbook -i inventory playbook args`` in ``cwd``, its output captured."""
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), str(playbook), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
