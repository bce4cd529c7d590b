"""roles/fanout through ansible-playbook, on four "nodes" of this machine (local connection, loopback addresses
127.0.0.1-4, a bundle directory and a staging server directory each) in two branches: the root's bundle reaches
every node along the plan, each node verifies it before it serves it, the servers are gone after; a second run
moves nothing and starts nothing; a node whose copy rotted and a node that was down are made whole."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

from support.fanout import free_port, make_bundle, same_tree
from support.fanout_play import NODES, play, recap

pytestmark = [pytest.mark.role,
              pytest.mark.skipif(not shutil.which("rsync") or os.geteuid() != 0,
                                   reason="needs rsync, and root (the staging server runs as root, chrooted)")]

PLAYBOOK = """
- name: Fan-out role test
  hosts: all
  gather_facts: false
  tasks:
    - name: The bundle along the fan-out plan
      ansible.builtin.include_role:
        name: fanout
      vars:
        fanout_tree:
          name: bundle
          path: "{{ tree_path }}"
          links: refuse
          stamp_file: "{{ tree_path }}/.atlas-verified.json"
        fanout_manifest_sha256: "{{ sha }}"
        fanout_firewall: false
"""


def run(tmp: Path, sha: str, *args: str) -> tuple[int, str]:
    port = free_port()
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "ansible_host": address, "tree_path": str(tmp / name / "bundle"),
                    "atlas_fanout_server_dir": str(tmp / name / "run"), "atlas_fanout_port": port}
             for name, (address, _branch) in NODES.items()}
    inventory = {"all": {"children": {"atlas_nodes": {"children": {
        f"branch_{b}": {"hosts": {n: hosts[n] for n, (_a, branch) in NODES.items() if branch == b}}
        for b in ("a", "b")}}}}}
    return play(tmp, inventory, PLAYBOOK, {"sha": sha}, *args)



@pytest.mark.slow
def test_the_root_bundle_reaches_every_node_verified_and_a_second_run_moves_nothing(tmp_path):
    sha = make_bundle(tmp_path / "n1" / "bundle")
    rc, out = run(tmp_path, sha)
    assert rc == 0, out[-6000:]
    for name in ("n2", "n3", "n4"):
        assert same_tree(tmp_path / "n1" / "bundle", tmp_path / name / "bundle"), name
    assert "n1 -> n2, n1 -> n3" in out and "- n3 -> n4" in out, out  # the branch head across, the rest inside
    assert not any((tmp_path / n / "run").exists() for n in NODES)  # every server stopped and forgotten
    rc, again = run(tmp_path, sha)
    assert rc == 0, again[-6000:]
    assert recap(again) == {n: recap(again)[n] | {"changed": 0, "failed": 0} for n in NODES}, again[-3000:]


@pytest.mark.slow
def test_a_rotten_copy_and_a_node_that_was_down_are_made_whole_from_verified_peers(tmp_path):
    sha = make_bundle(tmp_path / "n1" / "bundle")
    assert run(tmp_path, sha)[0] == 0
    bad = tmp_path / "n3" / "bundle" / "cann" / "toolkit.run"
    data = bytearray(bad.read_bytes())
    data[10] ^= 1
    bad.write_bytes(bytes(data))  # n3 (the head of branch b, n4's source) holds a rotten copy
    shutil.rmtree(tmp_path / "n4" / "bundle")  # n4 was down (or new): it holds nothing
    rc, out = run(tmp_path, sha)
    assert rc == 0, out[-6000:]
    for name in ("n3", "n4"):
        assert same_tree(tmp_path / "n1" / "bundle", tmp_path / name / "bundle"), name
    assert hashlib.sha256(bad.read_bytes()).hexdigest() != hashlib.sha256(bytes(data)).hexdigest()
