"""The node firewall (plugin_utils/firewall.py, roles/firewall, docs/security.md): who may reach which port of
an Atlas node, from the inventory; the nftables file the role renders, checked by nft where the host has it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from ansible_collections.atlas.serving.plugins.plugin_utils import firewall as fw

ROOT = Path(__file__).resolve().parents[3]

HOSTVARS = {
    "n1": {"ansible_host": "10.0.0.11", "group_names": ["atlas_nodes", "branch_east"]},
    "n2": {"ansible_host": "10.0.0.12", "group_names": ["atlas_nodes", "branch_east"],
           "npu_network_comm_address": "192.168.10.12"},
    "n3": {"ansible_host": "10.0.0.13", "group_names": ["atlas_nodes", "branch_west"]},
    "gw-east": {"ansible_host": "10.0.0.21", "gateway_branch": "east"},
    "gw-west": {"ansible_host": "10.0.0.22", "gateway_branch": "west"},
    "mon": {"ansible_host": "10.0.0.30"},
}
GROUPS = {"gateway": ["gw-east", "gw-west"], "monitoring": ["mon"], "branch_east": ["n1", "n2"]}
INSTANCE = {"big": {"nodes": ["n1", "n2"]}}


def _by(rules):
    return {r["comment"].split(":")[0]: r for r in rules}


def test_the_engine_port_admits_only_the_branch_gateways_and_monitoring():
    rules = _by(fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000, exporter_ports=[9100, 8082]))
    assert rules["ssh"] == {"comment": "ssh", "sources": None, "proto": "tcp", "ports": [22]}
    assert rules["engine"]["ports"] == [8000]
    assert rules["engine"]["sources"] == {"ip": ["10.0.0.21/32", "10.0.0.30/32"]}, "not gw-west, not the nodes"
    assert rules["exporters"] == {"comment": "exporters: the monitoring hosts", "sources": {"ip": ["10.0.0.30/32"]},
                                  "proto": "tcp", "ports": [8082, 9100]}
    assert "instance big" not in rules


def test_ssh_from_the_controllers_and_extra_engine_sources():
    rules = _by(fw.rules("n3", HOSTVARS, GROUPS, engine_port="30000", ssh_port=2222,
                         ssh_sources=["10.9.0.0/24", "fd00::1"], engine_sources=["10.9.0.5"]))
    assert rules["ssh from the controllers"]["sources"] == {"ip": ["10.9.0.0/24"], "ip6": ["fd00::1/128"]}
    assert rules["ssh from the controllers"]["ports"] == [2222]
    assert rules["engine"]["sources"] == {"ip": ["10.0.0.22/32", "10.0.0.30/32", "10.9.0.5/32"]}


def test_the_ranks_of_an_instance_reach_each_other_and_only_the_entry_serves():
    head = _by(fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000, serving_instances=INSTANCE))
    rank1 = _by(fw.rules("n2", HOSTVARS, GROUPS, engine_port=8000, serving_instances=INSTANCE))
    assert head["instance big"]["sources"] == {"ip": ["10.0.0.12/32", "192.168.10.12/32"]}
    assert head["instance big"]["ports"] == [] and head["instance big"]["proto"] is None
    assert rank1["instance big"]["sources"] == {"ip": ["10.0.0.11/32"]}
    assert "engine" in head and "engine" not in rank1, "a non-head rank serves no HTTP"


def test_no_monitoring_host_no_exporter_rule_and_no_port_no_engine_rule():
    rules = _by(fw.rules("n1", HOSTVARS, {"gateway": []}, exporter_ports=[9100]))
    assert set(rules) == {"ssh"}


@pytest.mark.parametrize(("change", "message"), [
    ({"gw-east": {"ansible_host": "gw-east.bank", "gateway_branch": "east"}}, "gw-east: ansible_host: 'gw-east.bank'"),
    ({"mon": {"ansible_host": "prom"}}, "mon: ansible_host: 'prom' is not an IP address"),
])
def test_a_name_where_an_address_is_needed_is_refused_naming_the_variable(change, message):
    with pytest.raises(fw.FirewallError, match=message):
        fw.rules("n1", {**HOSTVARS, **change}, GROUPS, engine_port=8000, exporter_ports=[9100])


def test_bad_ports_and_sources_are_refused():
    with pytest.raises(fw.FirewallError, match="the engine's port must be a TCP port"):
        fw.rules("n1", HOSTVARS, GROUPS, engine_port=70000)
    with pytest.raises(fw.FirewallError, match="firewall_ssh_sources: 'controller' is not an IP"):
        fw.rules("n1", HOSTVARS, GROUPS, ssh_sources=["controller"])


def render(rules, sets=()) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "roles/firewall/templates"),
                             undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: "# " + text
    return env.get_template("atlas-firewall.nft.j2").render(ansible_managed="managed", __firewall_rules=rules,
                                                            __firewall_sets=list(sets))


def test_the_rendered_chain_drops_what_no_rule_accepts():
    text = render(fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000, exporter_ports=[9100, 8082],
                           serving_instances=INSTANCE))
    assert "policy drop;" in text and "delete table inet atlas" in text
    assert 'tcp dport { 22 } accept comment "ssh"' in text
    assert 'ip saddr { 10.0.0.21/32, 10.0.0.30/32 } tcp dport { 8000 } accept comment "engine' in text
    assert 'ip saddr { 10.0.0.12/32, 192.168.10.12/32 } accept comment "instance big: its other ranks"' in text


@pytest.mark.skipif(shutil.which("nft") is None, reason="nft is not installed on this machine")
def test_nft_accepts_the_rendered_file(tmp_path: Path):  # pragma: no cover - where nft exists
    path = tmp_path / "atlas.nft"
    path.write_text(render(fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000, exporter_ports=[9100],
                                    ssh_sources=["10.9.0.0/24", "fd00::1"], serving_instances=INSTANCE,
                                    fanout_port=8873), fw.sets()))
    # in a network namespace of its own: the check needs netlink, and nothing here touches the host's rules
    run = subprocess.run(["unshare", "--net", "nft", "-c", "-f", str(path)], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stderr + path.read_text()


def test_the_fanout_port_admits_only_the_members_of_its_sets():
    rules = fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000, fanout_port=8873)
    staging = rules[-1]
    assert staging == {"comment": "fan-out staging: the node's planned receivers, while it stages",
                       "sets": {"ip": "atlas_fanout4", "ip6": "atlas_fanout6"}, "proto": "tcp", "ports": [8873]}
    text = render(rules, fw.sets())
    assert "set atlas_fanout4 { type ipv4_addr; flags timeout; }" in text
    assert 'ip saddr @atlas_fanout4 tcp dport { 8873 } accept comment "fan-out staging' in text
    assert 'ip6 saddr @atlas_fanout6 tcp dport { 8873 } accept' in text
    assert "fan-out" not in render(fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000))  # no port: no rule
    with pytest.raises(fw.FirewallError, match="atlas_fanout_port"):
        fw.rules("n1", HOSTVARS, GROUPS, fanout_port=70000)


@pytest.mark.skipif(shutil.which("nft") is None or shutil.which("unshare") is None,
                    reason="nft is not installed on this machine")
def test_a_staging_admits_its_receivers_into_the_loaded_rules(tmp_path: Path):  # pragma: no cover - where nft exists
    """The rules file loaded, then what a staging runs (module_utils/fanout_firewall.firewall_open): the receivers with
    a timeout in the sets, then flushed; all in a network namespace of the test's own, gone when it ends."""
    rules = tmp_path / "atlas.nft"
    rules.write_text(render(fw.rules("n1", HOSTVARS, GROUPS, engine_port=8000, fanout_port=8873), fw.sets()))
    script = tmp_path / "stage.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(ROOT / "collections")!r})
from ansible_collections.atlas.serving.plugins.module_utils import fanout_firewall as s
print(s.firewall_open(["10.0.0.12", "fd00::7"], 8873, 600))
import subprocess
print(subprocess.run(["nft", "list", "set", "inet", "atlas", "atlas_fanout4"], capture_output=True, text=True).stdout)
print(s.firewall_close())
print(subprocess.run(["nft", "list", "set", "inet", "atlas", "atlas_fanout4"], capture_output=True, text=True).stdout)
""")
    run = subprocess.run(["unshare", "--net", "sh", "-c", f"nft -f {rules} && {sys.executable} {script}"],
                         capture_output=True, text=True, check=False)
    if "Operation not permitted" in run.stderr:
        pytest.skip("no network namespace for this user")
    assert run.returncode == 0, run.stderr
    opened, closed = run.stdout.split("receivers removed")
    assert "admitted 2 receiver(s) to port 8873 for 600 s" in opened
    assert "10.0.0.12 timeout" in opened and "10.0.0.12" not in closed
