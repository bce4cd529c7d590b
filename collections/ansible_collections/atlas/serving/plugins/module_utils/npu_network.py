# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NPU network stage's inputs: serving instances and each host's NPU addresses, checked before a host is
touched (the role's preflight, through the filters in plugins/filter/npu_network.py).

Inventory contract (docs/npu-network.md, section 1):

- per host: ``npu_network_addresses`` (list, index = NPU id, one IPv4 per NPU), ``npu_network_netmask``,
  ``npu_network_gateway``, ``npu_network_netdetect`` (default: the gateway), ``npu_network_tls_enable``
  (0 or 1, default 0; the same on every node of an instance);
- ``serving_instances: {NAME: {nodes: [host0, host1, ...], ...}}``: rank = position in ``nodes``,
  ``nodes[0]`` = head / entry.

Standard library only (the filters run on the controller; nothing here reads a node).
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils.hccn import ipv4, netmask_ok, subnet

PREFIX = "npu_network_"
TLS_DEFAULT = 0


def host_var(hostvars, host, name, default=None):
    """``hostvars[host][name]``, or ``default`` for an unknown host or an unset (None) variable."""
    if not known(hostvars, host):
        return default
    values = hostvars[host]
    value = values.get(name) if hasattr(values, "get") else None
    return default if value is None else value


def _var(hostvars, host, name, default=None):
    return host_var(hostvars, host, PREFIX + name, default)


def instance_problems(serving_instances) -> list:
    """The shape of ``serving_instances`` itself (a dict of name -> {nodes: [hosts]})."""
    if serving_instances is None:
        return []
    if not isinstance(serving_instances, dict):
        return [f"serving_instances must be a mapping of instance name -> {{nodes: [...]}}, "
                f"got {type(serving_instances).__name__}"]
    out = []
    for name, spec in serving_instances.items():
        nodes = spec.get("nodes") if isinstance(spec, dict) else None
        if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) and n for n in nodes):
            out.append(f"serving_instances.{name}.nodes must be a non-empty list of inventory host names "
                       f"(rank = position, first = head), got {nodes!r}")
        elif len(set(nodes)) != len(nodes):
            twice = sorted({n for n in nodes if nodes.count(n) > 1})
            out.append(f"serving_instances.{name}.nodes names {', '.join(twice)} more than once")
    return out


def instances_of(host: str, serving_instances) -> list:
    """The instances ``host`` belongs to: [{"name", "nodes", "rank", "head"}], by name."""
    if not isinstance(serving_instances, dict):
        return []
    out = []
    for name in sorted(serving_instances):
        spec = serving_instances[name]
        nodes = spec.get("nodes") if isinstance(spec, dict) else None
        if isinstance(nodes, list) and host in nodes:
            out.append({"name": name, "nodes": list(nodes), "rank": nodes.index(host), "head": nodes[0]})
    return out


def multi_node_instances(host: str, serving_instances) -> list:
    return [i for i in instances_of(host, serving_instances) if len(i["nodes"]) >= 2]


def has_work(host: str, hostvars, serving_instances) -> bool:
    """False for a host with no NPU addresses in no instance of two or more nodes: the stage skips it."""
    return bool(_var(hostvars, host, "addresses")) or bool(multi_node_instances(host, serving_instances))


def host_problems(host: str, hostvars, npu_count=None) -> list:
    """One host's NPU addresses, netmask, gateway, netdetect and TLS switch."""
    addresses = _var(hostvars, host, "addresses", [])
    if not addresses:
        return []
    where = f"{host}: {PREFIX}"
    if not isinstance(addresses, list):
        return [f"{where}addresses must be a list of IPv4 addresses (index = NPU id), got {addresses!r}"]
    out = []
    bad = [f"{n}: {a!r}" for n, a in enumerate(addresses) if ipv4(a) is None]
    if bad:
        out.append(f"{where}addresses has entries that are not IPv4 addresses ({'; '.join(bad)})")
    seen = {}
    for n, a in enumerate(addresses):
        if a in seen:
            out.append(f"{where}addresses gives {a} to NPU {seen[a]} and NPU {n}")
        seen.setdefault(a, n)
    if npu_count is not None and int(npu_count) != len(addresses):
        out.append(f"{where}addresses has {len(addresses)} entries but the node has {npu_count} NPUs: "
                   f"give one address per NPU (index = NPU id)")
    netmask = _var(hostvars, host, "netmask")
    gateway = _var(hostvars, host, "gateway")
    netdetect = _var(hostvars, host, "netdetect")
    if not netmask_ok(netmask):
        out.append(f"{where}netmask {netmask!r} is not an IPv4 netmask (e.g. 255.255.255.0)")
    if ipv4(gateway) is None:
        out.append(f"{where}gateway {gateway!r} is not an IPv4 address (the NPU subnet's gateway)")
    if netdetect is not None and ipv4(netdetect) is None:
        out.append(f"{where}netdetect {netdetect!r} is not an IPv4 address (default: the gateway)")
    tls = _var(hostvars, host, "tls_enable", TLS_DEFAULT)
    if str(tls) not in ("0", "1"):
        out.append(f"{where}tls_enable {tls!r} must be 0 or 1")
    if out:
        return out
    nets = {subnet(a, netmask) for a in addresses}
    if len(nets) > 1:
        out.append(f"{where}addresses span {len(nets)} subnets ({', '.join(sorted(map(str, nets)))}) with netmask "
                   f"{netmask}: the 8 NPU ports of an Atlas 800T A2 use one subnet")
    elif ipv4(gateway) not in next(iter(nets)):
        out.append(f"{where}gateway {gateway} is outside the NPU subnet {next(iter(nets))}")
    return out


def instance_node_problems(instance: dict, hostvars) -> list:
    """Across the nodes of one instance of two or more nodes: every node known, with addresses, the same TLS
    switch everywhere, no address on two NPUs."""
    name, nodes = instance["name"], instance["nodes"]
    out = []
    unknown = [n for n in nodes if not known(hostvars, n)]
    if unknown:
        out.append(f"instance {name}: {', '.join(unknown)} not in the inventory")
    missing = [n for n in nodes if n not in unknown and not _var(hostvars, n, "addresses")]
    if missing:
        out.append(f"instance {name} spans {len(nodes)} nodes but {', '.join(missing)} "
                   f"{'has' if len(missing) == 1 else 'have'} no {PREFIX}addresses: give every node's NPUs an address")
    tls = {n: str(_var(hostvars, n, "tls_enable", TLS_DEFAULT)) for n in nodes if n not in unknown}
    if len(set(tls.values())) > 1:
        listing = ", ".join(f"{n}={v}" for n, v in tls.items())
        out.append(f"instance {name}: {PREFIX}tls_enable differs between its nodes ({listing}): "
                   f"set the same value on every node of the instance")
    owner = {}
    for n in nodes:
        for device, address in enumerate(_var(hostvars, n, "addresses", []) or []):
            if address in owner and owner[address][0] != n:
                other, other_dev = owner[address]
                out.append(f"instance {name}: {address} is both {other} NPU {other_dev} and {n} NPU {device}")
            owner.setdefault(address, (n, device))
    return out


def known(hostvars, host) -> bool:
    """Ansible's hostvars answers an unknown host with an undefined value, not a KeyError: ask ``in``."""
    return host in hostvars


def problems(host: str, hostvars, serving_instances, npu_count=None) -> list:
    """Everything wrong with the stage's inputs as seen from ``host`` (its own and its instances')."""
    out = instance_problems(serving_instances)
    out += host_problems(host, hostvars, npu_count)
    for instance in multi_node_instances(host, serving_instances):
        out += instance_node_problems(instance, hostvars)
    return out


def ping_targets(host: str, instance: dict, hostvars) -> list:
    """Every address of the other nodes of ``instance``: [{"node", "device", "address"}], by rank."""
    return [{"node": n, "device": device, "address": address}
            for n in instance["nodes"] if n != host
            for device, address in enumerate(_var(hostvars, n, "addresses", []) or [])]
