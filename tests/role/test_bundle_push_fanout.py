"""`atlasctl bundle push --fan-out` end to end on four "nodes" of this machine in two branches: real rsync, an ssh
double and Ansible's local connection, each node's run in a mount namespace of its own where the push's --dest
is that node's directory, loopback addresses 127.0.0.1-4 for their staging servers. The controller sends the
bundle once (to the root), the others pull it from peers and verify it; a second push moves nothing."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from atlasctl import bundle, bundle_push, cli, exitcodes
from support.fanout import free_port, same_tree
from support.ssh_double import SSH_DOUBLE as PLAIN_SSH_DOUBLE

pytestmark = [pytest.mark.role,
              pytest.mark.skipif(not shutil.which("rsync") or os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="needs rsync, unshare and root (mount namespaces, the staging servers)")]
NODES = {"n1": ("127.0.0.1", "a"), "n2": ("127.0.0.2", "a"), "n3": ("127.0.0.3", "b"), "n4": ("127.0.0.4", "b")}

# OpenSSH's client for the test: test_bundle_push's double (drop the options), then find the host and run the
# remote command on this machine in a mount namespace where DEST is that node's own directory.
PLAIN_TAIL = 'shift\nexec sh -c "$*"\n'
assert PLAIN_SSH_DOUBLE.endswith(PLAIN_TAIL)
SSH_DOUBLE = PLAIN_SSH_DOUBLE[:-len(PLAIN_TAIL)].replace("{", "{{").replace("}", "}}") + """\
host="${{1#*@}}"; shift
case "$host" in {cases} esac
exec unshare --mount --propagation private sh -c 'mount --bind "$0" "$1" && exec sh -c "$2"' "$node" {dest} "$*"
"""
# The node's Python for Ansible: the same mount namespace around each module run.
INTERPRETER = """#!/bin/sh
exec unshare --mount --propagation private \
    sh -c 'mount --bind "$0" "$1" && shift && exec "$@"' {node} {dest} {python} "$@"
"""


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dest = tmp_path / "dest"
    dest.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cases = " ".join(f'{address}) node={tmp_path / name} ;;' for name, (address, _b) in NODES.items())
    (bin_dir / "ssh").write_text(SSH_DOUBLE.format(cases=cases, dest=dest))
    (bin_dir / "ssh").chmod(0o755)
    port = free_port()
    hosts = {}
    for name, (address, _branch) in NODES.items():
        (tmp_path / name).mkdir()
        python = bin_dir / f"python-{name}"
        python.write_text(INTERPRETER.format(node=tmp_path / name, dest=dest, python=sys.executable))
        python.chmod(0o755)
        hosts[name] = {"ansible_host": address, "ansible_user": "root", "ansible_connection": "local",
                       "ansible_python_interpreter": str(python), "ansible_become": False,
                       "atlas_fanout_server_dir": str(tmp_path / "run" / name), "atlas_fanout_port": port,
                       "firewall_enabled": False, "atlas_bundle_record": str(tmp_path / "records" / f"{name}.json"),
                       # One models root for the fleet, as a site's layout has (nothing here writes to it; the nodes
                       # only check hard links against it): the push's verification is then one `ansible` run, not
                       # one per node (bundle_push.verify_on_nodes runs once per models root).
                       "models_root": str(tmp_path / "models")}
    inventory = {"all": {"children": {"atlas_nodes": {"children": {
        f"branch_{b}": {"hosts": {n: hosts[n] for n, (_a, branch) in NODES.items() if branch == b}}
        for b in ("a", "b")}}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("ATLAS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("ANSIBLE_LOCAL_TEMP", str(tmp_path / "ansible-tmp"))
    return tmp_path


def make_src(root: Path) -> None:
    (root / "models" / "m").mkdir(parents=True)
    (root / "models" / "m" / "model.safetensors").write_bytes(os.urandom(4 << 20))
    (root / "cann").mkdir()
    (root / "cann" / "toolkit.run").write_bytes(b"#!/bin/sh\necho installer\n" * 1000)
    bundle.write_manifest(root, "b", release="bank-1")


def push(tmp: Path, capsys, *extra: str) -> tuple[int, dict]:
    code = cli.main(["bundle", "push", "-i", str(tmp / "hosts.yml"), "--src", str(tmp / "src"), "--dest",
                     str(tmp / "dest"), "--allow-unsigned", "--json", *extra])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip().startswith("{") else {"stderr": out.err}


def test_the_controller_sends_the_bundle_once_and_the_nodes_pass_it_on_verified(fleet, capsys):
    make_src(fleet / "src")
    code, report = push(fleet, capsys, "--fan-out")
    assert code == exitcodes.OK, report
    assert report["mode"] == "fan-out" and report["verified"] is True and report["roots"] == ["n1"]
    assert report["controller_ratio"] <= 1.2, report  # not N times the bundle
    via = {h["host"]: h["via"] for h in report["hosts"]}
    assert via == {"n1": "controller", "n2": "n1", "n3": "n1", "n4": "n3"}
    assert all(h["bytes_sent"] == 0 for h in report["hosts"] if h["host"] != "n1")
    for name in NODES:
        assert same_tree(fleet / "src", fleet / name), name
    assert not any((fleet / "run").glob("*/rsyncd.conf"))  # every staging server gone
    code, again = push(fleet, capsys)  # four nodes: the default is a direct push; everything is there already
    assert code == exitcodes.OK and again["mode"] == "direct" and again["verified"] is True
    assert all(h["files_sent"] == 0 for h in again["hosts"]), again
    code, third = push(fleet, capsys, "--fan-out")
    assert code == exitcodes.OK and third["verified"] is True
    assert all(h["files_sent"] == 0 and h["bytes_received"] == 0 for h in third["hosts"]), third


def test_a_node_the_fan_out_cannot_complete_gets_the_direct_push(fleet, capsys, monkeypatch):
    make_src(fleet / "src")
    real = bundle_push.push_fanout

    def broken_play(*args, **kwargs):  # the play's run fails for n4 (as a node whose peers all refused it)
        from atlasctl import runner

        def run_playbook(playbook, inventory, **kw):
            result = runner.run_playbook(playbook, inventory, **kw | {"limit": kw["limit"].replace(",n4", "")})
            result.hosts["n4"] = runner.HostResult("n4", failed=True, message="no verified source")
            return result

        return real(*args, **kwargs, run_playbook=run_playbook)

    monkeypatch.setattr(bundle_push, "push_fanout", broken_play)
    code, report = push(fleet, capsys, "--fan-out")
    assert code == exitcodes.OK, report
    assert report["fallback"] == ["n4"] and report["verified"] is True
    n4 = next(h for h in report["hosts"] if h["host"] == "n4")
    assert n4["via"] == "controller" and "pushed directly" in n4["message"] and n4["bytes_sent"] > 0
    assert same_tree(fleet / "src", fleet / "n4")


@pytest.mark.parametrize("option", ["--per-source", "--roots"])
def test_a_fan_out_of_nothing_is_bad_input(fleet, capsys, option):
    make_src(fleet / "src")
    assert cli.main(["bundle", "push", "-i", str(fleet / "hosts.yml"), "--src", str(fleet / "src"), "--dest",
                     str(fleet / "dest"), "--allow-unsigned", option, "0"]) == exitcodes.USAGE
    err = capsys.readouterr().err
    assert f"{option} 0" in err and "Traceback" not in err


def test_a_peer_copy_corrupted_while_it_serves_is_refused_and_repaired(fleet, capsys):
    """The drill row corrupt-fanout-peer on this machine: n3 holds the bundle before the run (so it serves from the
    start); a byte of its copy flips as soon as its server runs, before n4 pulls from it in the last round."""
    make_src(fleet / "src")
    shard = "models/m/model.safetensors"
    code, seeded = push(fleet, capsys, "--no-fan-out", "--limit", "n3")
    assert code == exitcodes.OK, seeded
    flipped = threading.Event()

    def corrupt() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (fleet / "run" / "n3" / "rsyncd.conf").exists():
            time.sleep(0.02)
        data = bytearray((fleet / "n3" / shard).read_bytes())
        data[len(data) // 2] ^= 1
        (fleet / "n3" / shard).write_bytes(bytes(data))
        flipped.set()

    watcher = threading.Thread(target=corrupt, daemon=True)
    watcher.start()
    code, report = push(fleet, capsys, "--fan-out")
    watcher.join(5)
    assert flipped.is_set()
    assert code == exitcodes.OK and report["verified"] is True, report
    n4 = next(h for h in report["hosts"] if h["host"] == "n4")
    assert n4["refused"] == {"n3": [shard]} and n4["via"] == "n1"  # refused, then from a verified source
    for name in NODES:  # the corrupted peer too: the final pass found its copy bad and pulled it again
        assert same_tree(fleet / "src", fleet / name), name
    assert report["controller_ratio"] <= 1.2
