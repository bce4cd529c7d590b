"""Fan-out staging on a node (module_utils/fanout_stage.py) with real rsync daemons on loopback addresses standing
in for nodes (127.0.0.1, .2, .3: one port, one address each, as the fleet has): a tree is served only once it
verified on its node and only to the node's receivers; a copy that fails verification is refused and pulled again
from another source; a converged tree moves nothing; a broken transfer resumes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import fanout_stage as stage

from support.fanout import BIG, LOOPBACKS, free_port, make_bundle, same_tree

pytestmark = pytest.mark.skipif(not shutil.which("rsync") or os.geteuid() != 0,
                                reason="needs rsync, and root (the staging server runs as root, chrooted)")

NODES = LOOPBACKS


class Node:
    """A node: its bundle directory and its staging server's directory, under the test's directory."""

    def __init__(self, root: Path, name: str, address: str, port: int):
        self.name, self.address, self.port = name, address, port
        self.bundle = root / name / "srv" / "atlas-bundle"
        self.server_dir = str(root / name / "run" / "atlas-fanout")

    def tree(self, sha: str, **extra) -> object:
        return stage.Tree(name="bundle", path=str(self.bundle), manifest_sha256=sha, links="refuse",
                          stamp_file=str(self.bundle / ".atlas-verified.json"), **extra)

    def source(self) -> object:
        return stage.Source(self.name, address=self.address)

    def serve(self, peers) -> dict:
        return stage.serve(self.server_dir, address=self.address, port=self.port, peers=[p.address for p in peers],
                           firewall=False)

    def pull(self, sha: str, sources, **options) -> dict:
        return stage.pull(self.tree(sha), sources, port=self.port, server_dir=self.server_dir, address=self.address,
                          **options)


@pytest.fixture
def fleet(tmp_path: Path):
    port = free_port()
    nodes = [Node(tmp_path, f"n{i + 1}", address, port) for i, address in enumerate(NODES)]
    yield nodes
    for node in nodes:
        stage.stop(node.server_dir, firewall=False)


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def test_a_tree_passes_down_a_chain_verified_at_every_hop_and_a_converged_one_moves_nothing(fleet):
    n1, n2, n3 = fleet
    sha = make_bundle(n1.bundle)
    first = n1.pull(sha, [])  # the root: pushed by the controller, verified here before it serves
    assert first["changed"] is False and first["verified"] == 3 and first["source"] == ""
    n1.serve([n2])
    n2.serve([n3])
    with pytest.raises(stage.StageError) as refused:  # n2 has nothing verified yet: it serves nothing
        n3.pull(sha, [n2.source()])
    assert refused.value.result["tried"][0]["outcome"] == "unavailable"
    assert "Unknown module" in refused.value.result["tried"][0]["why"]
    got = n2.pull(sha, [n1.source()])
    assert got["source"] == "n1" and got["changed"] and got["bytes_received"] >= 3 << 20
    assert same_tree(n1.bundle, n2.bundle)  # manifest and signature in place too
    assert (n2.bundle / "manifest.json").read_bytes() == (n1.bundle / "manifest.json").read_bytes()
    assert not (n2.bundle / ".rsync-partial").exists()
    assert stat.S_IMODE((n2.bundle / "cann" / "toolkit.run").stat().st_mode) & 0o022 == 0
    again = n3.pull(sha, [n2.source()])
    assert again["source"] == "n2" and same_tree(n1.bundle, n3.bundle)
    calls = []

    def counting(argv, **kw):
        calls.append(argv)
        return subprocess.run(argv, **kw)

    converged = n3.pull(sha, [n2.source()], run=counting)
    assert converged == {"changed": False, "source": "", "verified": 3, "bytes_received": 0, "tried": [],
                         "refused": {}}
    assert calls == []  # nothing moved, nothing asked


def test_a_corrupted_peer_copy_is_refused_never_propagated_and_pulled_again_from_a_verified_source(fleet):
    n1, n2, n3 = fleet
    sha = make_bundle(n1.bundle)
    n2.serve([n3])
    n1.serve([n2, n3])
    n1.pull(sha, [])
    n2.pull(sha, [n1.source()])
    flip(n2.bundle / BIG)  # n2's copy rots after n2 verified it and began to serve it
    got = n3.pull(sha, [n2.source(), n1.source()])
    assert got["refused"] == {"n2": [BIG]}
    assert [t["outcome"] for t in got["tried"]] == ["refused", "complete"]
    assert "sha256 mismatch" in got["tried"][0]["why"] or "size" in got["tried"][0]["why"]
    assert got["source"] == "n1" and same_tree(n1.bundle, n3.bundle)  # the bad copy went nowhere
    # the corrupted node itself: its own verification finds it, and it pulls the file again from a verified peer
    repaired = n2.pull(sha, [n1.source()])
    assert repaired["source"] == "n1" and same_tree(n1.bundle, n2.bundle)


def test_a_corrupted_copy_with_no_other_source_fails_naming_the_file_and_the_source(fleet):
    n1, n2, _n3 = fleet
    sha = make_bundle(n1.bundle)
    n1.serve([n2])
    n1.pull(sha, [])
    flip(n1.bundle / "cann" / "toolkit.run")
    with pytest.raises(stage.StageError, match=r"cann/toolkit.run.*n1: refused") as failed:
        n2.pull(sha, [n1.source()])
    assert failed.value.result["refused"] == {"n1": ["cann/toolkit.run"]}
    assert not (n2.bundle / "cann" / "toolkit.run").exists()  # the bad copy is not kept
    assert not (n2.bundle / "manifest.json").exists()  # and no manifest says the tree is there


def test_a_source_whose_manifest_is_not_the_verified_one_is_refused(fleet):
    n1, n2, _n3 = fleet
    sha = make_bundle(n1.bundle)
    n1.serve([n2])
    n1.pull(sha, [])
    data = json.loads((n1.bundle / "manifest.json").read_text())
    (n1.bundle / "manifest.json").write_text(json.dumps(data | {"release": "bank-0"}))
    with pytest.raises(stage.StageError, match="no source gave its manifest.json") as failed:
        n2.pull(sha, [n1.source()])
    assert "not the verified one" in failed.value.result["refused"]["n1"][0]


def test_only_the_planned_receivers_are_admitted_and_a_down_peer_is_skipped(fleet):
    n1, n2, n3 = fleet
    sha = make_bundle(n1.bundle)
    n1.pull(sha, [])
    n1.serve([n3])  # n2 is not among n1's receivers
    with pytest.raises(stage.StageError) as denied:
        n2.pull(sha, [n1.source()])
    assert denied.value.result["tried"][0]["outcome"] == "unavailable"
    assert "denied on module bundle from UNDETERMINED (127.0.0.2)" in Path(n1.server_dir, "rsyncd.log").read_text()
    n1.serve([n2, n3])  # the same server: the configuration is read again for each connection
    got = n2.pull(sha, [n3.source(), n1.source()])  # n3 runs no server: skipped
    assert [t["outcome"] for t in got["tried"]] == ["unavailable", "complete"]
    assert same_tree(n1.bundle, n2.bundle)


def test_a_broken_transfer_resumes_from_its_partial_file(fleet):
    n1, n2, _n3 = fleet
    sha = make_bundle(n1.bundle, big=24 << 20)
    n1.pull(sha, [])
    n1.serve([n2])

    def cut_short(argv, **kw):  # the first transfer is cut after about a third of the shard
        if "--recursive" in argv and not cut_short.done:
            cut_short.done = True
            proc = subprocess.Popen([*argv[:1], "--bwlimit=8000", *argv[1:]], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            try:
                proc.wait(1.0)
            except subprocess.TimeoutExpired:
                proc.terminate()
            out, err = proc.communicate()
            return subprocess.CompletedProcess(argv, 10, out, err or "connection reset")
        return subprocess.run(argv, **kw)

    cut_short.done = False
    got = n2.pull(sha, [n1.source(), n1.source()], run=cut_short)
    assert got["source"] == "n1" and same_tree(n1.bundle, n2.bundle)
    assert got["bytes_received"] < 22 << 20  # the partial shard was the basis: not everything came again


def test_a_busy_source_is_tried_again_after_the_others(fleet):
    n1, n2, _n3 = fleet
    sha = make_bundle(n1.bundle)
    n1.pull(sha, [])
    n1.serve([n2])
    answers = iter([subprocess.CompletedProcess([], 5, "", "@ERROR: max connections (2) reached -- try again later")])
    slept = []

    def busy_once(argv, **kw):
        return next(answers, None) or subprocess.run(argv, **kw)

    got = n2.pull(sha, [n1.source()], run=busy_once, sleep=slept.append)
    assert got["source"] == "n1" and slept == [stage.RETRY_S]


def test_a_model_version_stages_from_the_share_by_hard_links_where_it_shares_the_filesystem(tmp_path):
    share = tmp_path / "bundle"
    sha = make_bundle(share)
    version = tmp_path / "models" / "m" / "versions" / "v1"
    tree = stage.Tree(name="model-m-v1", path=str(version), manifest=str(share / "manifest.json"),
                      manifest_sha256=sha, prefix="models/m/", chmod="D0755,F0644",
                      stamp_file=str(tmp_path / "stamps.json"), link_dest=(str(share / "models" / "m"),))
    got = stage.pull(tree, [stage.Source("origin", path=str(share / "models" / "m"))],
                     server_dir=str(tmp_path / "run"))
    assert got["source"] == "origin" and got["verified"] == 2
    for name in ("config.json", Path(BIG).name):
        assert os.path.samefile(version / name, share / "models" / "m" / name)  # one copy on the node
    assert stage.ready_trees(str(tmp_path / "run")) == {"model-m-v1": str(version)}


def test_the_firewall_admits_the_receivers_with_a_timeout_and_closes_after(tmp_path):
    log = tmp_path / "nft.log"
    fake = tmp_path / "nft"
    fake.write_text(f"""#!/bin/sh
echo "ARGS $*" >> {log}
if [ "$1" = "-f" ]; then cat >> {log}; exit 0; fi
if [ "$2" = "table" ]; then exit 0; fi
if [ -e {tmp_path}/sets ]; then exit 0; fi
exit 1
""")
    fake.chmod(0o755)
    said = stage.firewall_open(["10.21.0.12", "10.22.0.11", "fd00::7"], 8873, 600, str(fake))
    text = log.read_text()
    assert "admitted 3 receiver(s) to port 8873" in said
    assert "add set inet atlas atlas_fanout4 { type ipv4_addr; flags timeout; }" in text  # rules predating the sets
    assert 'add rule inet atlas input ip saddr @atlas_fanout4 tcp dport 8873 accept comment' in text
    assert "add element inet atlas atlas_fanout4 { 10.21.0.12 timeout 600s, 10.22.0.11 timeout 600s }" in text
    assert "add element inet atlas atlas_fanout6 { fd00::7 timeout 600s }" in text
    (tmp_path / "sets").touch()
    log.write_text("")
    stage.firewall_open(["10.21.0.12"], 8873, 600, str(fake))
    assert "add set" not in log.read_text() and "flush set inet atlas atlas_fanout4" in log.read_text()
    log.write_text("")
    assert "removed" in stage.firewall_close(str(fake))
    assert log.read_text().count("flush set") == 2


def test_a_node_without_the_firewall_table_is_said_so_and_nothing_runs(tmp_path):
    fake = tmp_path / "nft"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    assert "no nftables table inet atlas" in stage.firewall_open(["10.0.0.2"], 8873, 60, str(fake))


def test_stop_ends_the_server_and_forgets_what_it_served(fleet):
    n1, n2, _n3 = fleet
    sha = make_bundle(n1.bundle)
    n1.pull(sha, [])
    started = n1.serve([n2])
    assert started["changed"] and Path(f"/proc/{started['pid']}").exists()
    assert n1.serve([n2])["changed"] is False  # already serving these peers
    stopped = stage.stop(n1.server_dir, firewall=False)
    assert stopped["stopped"] and not Path(n1.server_dir).exists()
    with socket.socket() as probe:
        assert probe.connect_ex((n1.address, n1.port)) != 0


def test_a_server_whose_pid_file_is_lost_is_kept_once_and_still_stopped(fleet):
    n1, n2, _n3 = fleet
    started = n1.serve([n2])
    Path(n1.server_dir, "server.pid").unlink()
    again = n1.serve([n2])  # found by its configuration: no second daemon on the same port
    assert again["pid"] == started["pid"] and again["changed"] is False
    stopped = stage.stop(n1.server_dir, firewall=False)
    assert stopped["stopped"] and not Path(f"/proc/{started['pid']}").exists()
    with socket.socket() as probe:
        assert probe.connect_ex((n1.address, n1.port)) != 0


@pytest.mark.parametrize("bad, match", [({"address": "node-1"}, "not an IP address"),
                                        ({"peers": ["10.0.0.300"]}, "not an IP address")])
def test_bad_addresses_name_the_fix(tmp_path, bad, match):
    with pytest.raises(stage.StageError, match=match):
        stage.serve(str(tmp_path / "run"), **({"address": "127.0.0.1", "firewall": False} | bad))
