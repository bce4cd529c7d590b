"""Helpers for lab tests: run atlasctl and ansible-playbook, parse recaps, read the lab inventory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ATLASCTL = [sys.executable, "-m", "atlasctl"]
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONUNBUFFERED": "1",
       "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}


def lab_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("debootstrap", "systemd-nspawn", "ip", "nft"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make host-deps)"
    return None


def atlasctl(*args: str, timeout: int = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*ATLASCTL, *args], cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"atlasctl {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def playbook(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "inventory/lab", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=timeout)


def recap(output: str) -> dict[str, dict[str, int]]:
    """Parse the PLAY RECAP lines: host -> {ok, changed, unreachable, failed, skipped, rescued, ignored}."""
    stats: dict[str, dict[str, int]] = {}
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap and ":" in line and "=" in line:
            host, _, rest = line.partition(":")
            stats[host.strip()] = {k: int(v) for k, v in (kv.split("=") for kv in rest.split())}
    return stats


def changed_tasks(output: str) -> list[str]:
    """'TASK name: host' for every task that reported changed (for failure messages)."""
    found, task = [], ""
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]")[0] + line[line.index("]") + 1:].rstrip(" *")
        elif line.startswith("changed: ["):
            found.append(f"{task}: {line[10:].split(']')[0]}")
    return found


def lab_hosts() -> dict[str, dict]:
    data = yaml.safe_load((ROOT / "inventory/lab/hosts.yml").read_text())
    return data["all"]["children"]["atlas_nodes"]["hosts"]




LAB_LOCK = Path("/var/lib/atlas-lab.lock")


@contextlib.contextmanager
def lab_lock():
    """Only one lab exists on a machine: test modules (and engineers) take turns."""
    LAB_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LAB_LOCK, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def fresh_lab_session(*, bundle: bool):
    """A lab brought up from scratch (and its bundle built), always brought down after."""
    with lab_lock():
        atlasctl("lab", "down", check=False)
        try:
            atlasctl("lab", "up")
            if bundle:
                atlasctl("bundle", "build", "--spec", "inventory/lab/bundle.yml", timeout=1800)
            yield
        finally:
            atlasctl("lab", "down", check=False)
