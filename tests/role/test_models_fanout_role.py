"""The models role on three "nodes" of this machine (local connection, loopback addresses, a models root each):
with the bundle on another filesystem (a mirror share, here /dev/shm) and models_fanout, the first node copies the
version from the share and the others pull it from a peer, each verifying it before it serves it; with the bundle
on the models filesystem, the version is hard-linked from it (one copy per node). A second run changes nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from atlasctl import bundle
from support.fanout import free_port
from support.fanout_play import play, recap

pytestmark = [pytest.mark.role,
              pytest.mark.skipif(not shutil.which("rsync") or os.geteuid() != 0 or not os.path.isdir("/dev/shm"),
                                   reason="needs rsync, root (the staging server runs as root) and /dev/shm")]
NODES = {"n1": "127.0.0.1", "n2": "127.0.0.2", "n3": "127.0.0.3"}
SHARD = "model-00001-of-00001.safetensors"

PLAYBOOK = """
- name: Models role test
  hosts: atlas_nodes
  gather_facts: false
  roles:
    - role: models
  post_tasks:
    - name: Where each node's version came from (the fan-out role's fact)
      ansible.builtin.debug:
        msg: "SOURCE {{ inventory_hostname }} {{ fanout_result.source | default('-') }}"
"""


def share_bundle(root: Path) -> str:
    model = root / "models" / "m"
    model.mkdir(parents=True)
    (model / SHARD).write_bytes(os.urandom(2 << 20))
    (model / "config.json").write_text('{"layers": 2}')
    names = ("config.json", SHARD)
    for algorithm in ("md5", "sha256"):
        (model / f"{algorithm}sums.txt").write_text("".join(
            f"{hashlib.new(algorithm, (model / n).read_bytes()).hexdigest()}  {n}\n" for n in names))
    for path in model.iterdir():
        path.chmod(0o644)
    bundle.write_manifest(root, "b", release="bank-1")
    return hashlib.sha256((root / "manifest.json").read_bytes()).hexdigest()


def run(tmp: Path, share: Path, sha: str, **extra) -> tuple[int, str]:
    port = free_port()
    hosts = {name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "ansible_host": address, "atlas_bundle_dir": str(share), "atlas_bundle_manifest_sha256": sha,
                    "models_name": "m", "models_root": str(tmp / name / "models"),
                    "atlas_stamp_dir": str(tmp / name / "stamps"), "atlas_fanout_server_dir": str(tmp / name / "run"),
                    "atlas_fanout_port": port, "firewall_enabled": False, "atlas_bundle_record": str(tmp / "rec")}
             for name, address in NODES.items()}
    inventory = {"all": {"children": {"atlas_nodes": {"children": {"branch_a": {"hosts": hosts}}}}}}
    return play(tmp, inventory, PLAYBOOK, extra)


def current(tmp: Path, node: str) -> Path:
    return (tmp / node / "models" / "m" / "current").resolve()



@pytest.fixture
def shm():
    path = Path(tempfile.mkdtemp(prefix="atlas-share-", dir="/dev/shm"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_version_on_a_mirror_share_fans_out_from_one_node_and_is_verified_on_each(tmp_path, shm):
    share = shm / "bundle"
    sha = share_bundle(share)
    rc, out = run(tmp_path, share, sha, models_fanout=True)
    assert rc == 0, out[-8000:]
    assert "n1 -> n2, n1 -> n3" in out, out[-8000:]
    assert all(f"SOURCE {n} {s}" in out for n, s in (("n1", "origin"), ("n2", "n1"), ("n3", "n1")))  # the share
    # read once, by the root
    for node in NODES:
        version = current(tmp_path, node)
        assert (version / SHARD).read_bytes() == (share / "models/m" / SHARD).read_bytes()
        assert oct((version / SHARD).stat().st_mode & 0o777) == "0o644"
    assert not any((tmp_path / n / "run").exists() for n in NODES)
    rc, again = run(tmp_path, share, sha, models_fanout=True)
    assert rc == 0 and all(r["changed"] == 0 for r in recap(again).values()), again[-6000:]


@pytest.mark.slow
def test_a_bundle_on_the_models_filesystem_is_hard_linked_one_copy_per_node(tmp_path):
    share = tmp_path / "bundle"
    sha = share_bundle(share)
    rc, out = run(tmp_path, share, sha)
    assert rc == 0, out[-8000:]
    for node in NODES:
        for name in (SHARD, "config.json"):
            assert os.path.samefile(current(tmp_path, node) / name, share / "models/m" / name), (node, name)
    rc, again = run(tmp_path, share, sha)
    assert rc == 0 and all(r["changed"] == 0 for r in recap(again).values()), again[-6000:]
