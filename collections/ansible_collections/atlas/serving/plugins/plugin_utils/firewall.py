# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The firewall of an Atlas node (roles/firewall, docs/security.md): who may reach which of its ports,
derived from the inventory.

Controller only (the atlas.serving filter ``firewall_rules``). One nftables table, ``inet atlas``, whose
input chain drops what no rule below accepts (loopback, replies to the node's own connections and ICMP
always pass):

- SSH (``ansible_port``, default 22): from ``ssh_sources`` (the controllers and jump hosts), or from anywhere
  when that list is empty, so the operators are never locked out;
- the engine's port (an entry node: the node serves HTTP): from the branch's gateways (group ``gateway``
  hosts whose ``gateway_branch`` is the node's branch) and the monitoring hosts, and ``engine_sources``;
- the exporters' ports: from the monitoring hosts;
- every port: from the other ranks of the node's multi-node instance (HCCL, Gloo and the engine's own
  ranks talk on ports they choose), at their ``ansible_host`` and ``npu_network_comm_address``;
- the fan-out staging port (``fanout_port``, docs/fleet-scale.md): from the members of two sets of the table,
  empty in the rules file; a staging fills them with the node's planned receivers, each with a timeout, and
  flushes them after (module_utils/fanout_firewall.py: one definition of the sets and their rules).

Addresses must be IP addresses (an nftables set matches addresses, not names): a host whose ``ansible_host``
is a name is refused, naming the variable to set.
"""

from __future__ import annotations

import ipaddress

from ansible_collections.atlas.serving.plugins.module_utils import fanout_firewall, npu_network, serving_instance


class FirewallError(ValueError):
    """A bad input: the message names the host or variable and the fix."""


def _address(value, where):
    try:
        return ipaddress.ip_network(str(value).strip("[]"), strict=False)
    except ValueError:
        raise FirewallError(f"{where}: {value!r} is not an IP address or network; the node's firewall admits "
                            "addresses (set ansible_host to the host's IP address)") from None


def _port(value, name):
    if isinstance(value, bool) or not str(value).isdigit() or not 1 <= int(value) <= 65535:
        raise FirewallError(f"{name} must be a TCP port (1-65535), got {value!r}")
    return int(value)


def _host_address(hostvars, host):
    return _address(npu_network.host_var(hostvars, host, "ansible_host") or host, f"{host}: ansible_host")


def _sources(networks):
    """{"ip": [...], "ip6": [...]}: the networks, each once, sorted, by family."""
    out = {"ip": set(), "ip6": set()}
    for net in networks:
        out["ip" if net.version == 4 else "ip6"].add(net)
    return {family: [str(n) for n in sorted(nets)] for family, nets in out.items() if nets}


def _rule(comment, sources, ports=None, proto="tcp"):
    return {"comment": comment, "sources": _sources(sources) if sources is not None else None,
            "proto": proto if ports else None, "ports": sorted(set(ports)) if ports else []}


def sets():
    """The named sets the table declares (``set <name> { ... }`` lines): the fan-out staging peers."""
    return fanout_firewall.nft_declarations()


def rules(host, hostvars, groups, *, engine_port=None, ssh_port=22, ssh_sources=(), engine_sources=(),
          exporter_ports=(), serving_instances=None, branch_prefix="branch_", gateway_group="gateway",
          monitoring_group="monitoring", fanout_port=None):
    """The accepting rules of ``host``'s input chain, in order: each ``{comment, sources: {ip, ip6} or None
    (any), proto, ports}``, or for the fan-out staging port ``{comment, sets: {ip, ip6: a set's name}, proto,
    ports}``. A rule whose sources are an empty set is left out (nobody to admit)."""
    serving_instances = serving_instances or {}
    out = [_rule("ssh from the controllers" if ssh_sources else "ssh",
                 [_address(s, "firewall_ssh_sources") for s in ssh_sources] or None,
                 [_port(ssh_port, "firewall_ssh_port")])]
    monitoring = [_host_address(hostvars, m) for m in groups.get(monitoring_group) or []]
    branches = {g[len(branch_prefix):] for g in npu_network.host_var(hostvars, host, "group_names", []) or []
                if g.startswith(branch_prefix)}
    gateways = [_host_address(hostvars, g) for g in groups.get(gateway_group) or []
                if str(npu_network.host_var(hostvars, g, "gateway_branch") or "") in branches]
    if engine_port not in (None, "") and serving_instance.entry(host, serving_instances):
        extra = [_address(s, "firewall_engine_sources") for s in engine_sources]
        out.append(_rule("engine: the branch gateways and the monitoring hosts", gateways + monitoring + extra,
                         [_port(engine_port, "the engine's port")]))
    if exporter_ports:
        out.append(_rule("exporters: the monitoring hosts", monitoring,
                         [_port(p, "an exporter's port") for p in exporter_ports]))
    try:
        found = serving_instance.instance_of(host, serving_instances)
    except serving_instance.InstanceError as exc:
        raise FirewallError(str(exc)) from None
    if found:
        peers = []
        for node in found[1]["nodes"]:
            if node == host:
                continue
            peers.append(_host_address(hostvars, node))
            comm = npu_network.host_var(hostvars, node, "npu_network_comm_address")
            if comm:
                peers.append(_address(comm, f"{node}: npu_network_comm_address"))
        out.append(_rule(f"instance {found[0]}: its other ranks", peers))
    out = [r for r in out if r["sources"] is None or r["sources"]]
    if fanout_port not in (None, ""):
        sets = {entry[0]: entry[1] for entry in fanout_firewall.NFT_SETS}
        out.append({"comment": fanout_firewall.NFT_COMMENT, "sets": sets, "proto": "tcp",
                    "ports": [_port(fanout_port, "atlas_fanout_port")]})
    return out
