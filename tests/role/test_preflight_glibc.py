"""Preflight's glibc check (roles/preflight/tasks/glibc.yml) on localhost, read-only and in check mode: the node's
`getconf GNU_LIBC_VERSION` against the glibc the release's engine wheel set needs. This machine's own glibc (Debian
12: 2.36) takes the vllm-ascend 0.23.0 set; a getconf stand-in printing `glibc 2.28` is refused naming the node, its
OS (read only for the refusal), its glibc, the set's need and the set that fits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.ansible_run import ansible_env, run_playbook

pytestmark = pytest.mark.role

PLAYBOOK = """
- name: preflight glibc test
  hosts: localhost
  gather_facts: false
  tasks:
    - name: glibc
      ansible.builtin.include_role: {name: preflight, tasks_from: glibc.yml}
    - name: reached
      ansible.builtin.debug: {msg: GLIBC PASSED}
"""


def _run(tmp_path: Path, getconf: str | None = None) -> subprocess.CompletedProcess:
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "inventory.ini").write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    bindir = None
    if getconf is not None:  # the command module finds getconf on the PATH the local connection passes on
        bindir = tmp_path / "bin"
        bindir.mkdir()
        (bindir / "getconf").write_text(f"#!/bin/sh\necho '{getconf}'\n")
        (bindir / "getconf").chmod(0o755)
    run = run_playbook(tmp_path / "inventory.ini", tmp_path / "play.yml", "--check", "-e", "engines_name=vllm-ascend",
                       "-e", "engines_version=0.23.0", cwd=tmp_path,
                       env=ansible_env(tmp_path, path=bindir, nocolor=True, callback=None), timeout=180)
    run.stdout = " ".join(run.stdout.split())  # the YAML callback folds long strings
    return run


def test_this_machines_glibc_takes_the_0_23_set(tmp_path):
    run = _run(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "GLIBC PASSED" in run.stdout


def test_glibc_2_28_is_refused_naming_the_node_its_os_and_the_set_that_fits(tmp_path):
    run = _run(tmp_path, "glibc 2.28")
    assert run.returncode != 0 and "GLIBC PASSED" not in run.stdout
    assert "localhost (Debian 12" in run.stdout  # the OS, read for the refusal
    assert "has glibc 2.28; the vllm-ascend 0.23.0 wheel set needs glibc 2.34 or newer" in run.stdout
    assert "Wheel sets that fit glibc 2.28: vllm-ascend 0.11.0 (glibc 2.28)." in run.stdout
    assert "Nothing was changed." in run.stdout
