"""The callback atlas.serving.filter_preload: the collection's filter plugins are loaded once, in
ansible-playbook's main process, and its workers inherit them instead of loading them again each."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.callback import filter_preload

ROOT = Path(__file__).resolve().parents[2]
FILTERS = ROOT / "collections/ansible_collections/atlas/serving/plugins/filter"
pytestmark = pytest.mark.role
# Installed with PYTHONPATH in ansible-playbook's main process, inherited by every worker it forks: a line with the
# process id each time a process compiles module_utils/hdk.py, which the hdk filter file imports (CPython's "compile"
# audit event; Ansible's collection loader compiles a collection's modules from source, with no .pyc).
SITECUSTOMIZE = """\
import os, sys
def _hook(event, args):
    if event == "compile" and len(args) > 1 and str(args[1]).endswith("plugins/module_utils/hdk.py"):
        with open(os.environ["ATLAS_COMPILE_LOG"], "a") as log:
            log.write(f"{os.getpid()}\\n")
sys.addaudithook(_hook)
"""


def test_preload_imports_every_filter_file():
    names = filter_preload.preload()
    files = sorted(p.stem for p in FILTERS.glob("*.py") if p.stem != "__init__")
    assert sorted(n.rsplit(".", 1)[1] for n in names) == files
    assert all(name in sys.modules for name in names)


def test_the_shipped_ansible_cfg_enables_it():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    enabled = [c.strip() for c in cfg.get("defaults", "callbacks_enabled").split(",")]
    assert "atlas.serving.filter_preload" in enabled


def _hdk_compiles(tmp_path: Path, preload: bool) -> tuple[set[str], subprocess.CompletedProcess]:
    """Three tasks that template an atlas.serving filter (a worker each), with the shipped ansible.cfg or
    (``preload`` False) that file without its callbacks_enabled line: the processes that compiled what it imports."""
    run = tmp_path / ("with" if preload else "without")
    run.mkdir()
    config = ROOT / "ansible.cfg"
    if not preload:
        config = run / "ansible.cfg"
        lines = (ROOT / "ansible.cfg").read_text().splitlines(keepends=True)
        config.write_text("".join(line for line in lines if not line.startswith("callbacks_enabled")).replace(
            "./collections", str(ROOT / "collections")).replace("./roles", str(ROOT / "roles")))
    (run / "sitecustomize.py").write_text(SITECUSTOMIZE)
    play = run / "play.yml"
    play.write_text(textwrap.dedent("""\
        - hosts: localhost
          gather_facts: false
          tasks:
            - ansible.builtin.debug:
                msg: "{{ '25.5.0' | atlas.serving.hdk_same_version('25.5.0') }}"
            - ansible.builtin.debug:
                msg: "{{ '25.5.0' | atlas.serving.hdk_same_version('25.5.1') }}"
            - ansible.builtin.debug:
                msg: "{{ '7.8.0.2.212' | atlas.serving.hdk_same_version('7.8.0.2.212') }}"
        """))
    log = run / "compiles"
    env = {**os.environ, "ANSIBLE_CONFIG": str(config), "ANSIBLE_NOCOLOR": "1", "PYTHONPATH": str(run),
           "ATLAS_COMPILE_LOG": str(log), "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(play)], cwd=ROOT, env=env,
                          text=True, capture_output=True, timeout=300)
    return (set(log.read_text().split()) if log.exists() else set()), proc


def test_workers_inherit_the_filters_instead_of_compiling_them(tmp_path):
    compiled, proc = _hdk_compiles(tmp_path, True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "callback plugin" not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert len(compiled) == 1, f"compiled in {len(compiled)} processes: once, in the main process, expected"
    compiled, proc = _hdk_compiles(tmp_path, False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert len(compiled) >= 3, f"compiled in {len(compiled)} processes: without the callback each worker does"
