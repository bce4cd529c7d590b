# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host network variables of a multi-node engine (HCCL, Gloo, TP), rendered from a node's facts and linted.

- ``HCCL_IF_IP``: the host address HCCL initialises on (it wins over ``HCCL_SOCKET_IFNAME``);
- ``HCCL_SOCKET_IFNAME``: an interface filter: ``eth,enp`` (prefixes), ``=eth0`` (exact), ``^...`` (exclude);
- ``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME``: the interface Gloo and TP bind to (vllm-ascend's recipes set
  all three to the same NIC).

Sources: docs/npu-network.md, section 4. :func:`render` takes the node's default IPv4 route interface and
address from Ansible's facts (``ansible_facts.default_ipv4``), or an inventory override (an interface, an
address, or any of the four variables as given); :func:`problems` names every variable that names an address
or interface the node does not have.

Standard library only.
"""

from __future__ import annotations

VARIABLES = ("HCCL_IF_IP", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
IFNAME_VARIABLES = VARIABLES[1:]


class CommEnvError(Exception):
    """The facts and the override do not say which interface or address to use."""


def _iface_facts(facts: dict, name: str) -> dict:
    for key in (name, name.replace("-", "_"), name.replace("-", "_").replace(":", "_")):
        value = facts.get(key)
        if isinstance(value, dict):
            return value
    return {}


def node_addresses(facts: dict) -> dict:
    """``{interface: [IPv4 addresses]}`` from Ansible's facts (``interfaces``, per-interface ``ipv4`` and
    ``ipv4_secondaries``)."""
    out = {}
    for name in facts.get("interfaces") or []:
        info = _iface_facts(facts, name)
        addresses = []
        for entry in [info.get("ipv4"), *(info.get("ipv4_secondaries") or [])]:
            if isinstance(entry, dict) and entry.get("address"):
                addresses.append(entry["address"])
        out[name] = addresses
    return out


def render(facts: dict, interface: str | None = None, address: str | None = None,
           overrides: dict | None = None) -> dict:
    """The four variables for a node. Interface: ``interface``, else the default IPv4 route's; address:
    ``address``, else that interface's first IPv4 address. ``overrides`` replaces any variable as given."""
    default = facts.get("default_ipv4") or {}
    nic = interface or default.get("interface")
    if not nic:
        raise CommEnvError("the node has no default IPv4 route in its facts and no interface was given: "
                           "set npu_network_comm_interface (the NIC the nodes reach each other on)")
    if address:
        ip = address
    elif interface:
        found = node_addresses(facts).get(interface) or []
        if not found:
            raise CommEnvError(f"interface {interface} has no IPv4 address on this node: set "
                               f"npu_network_comm_address or another npu_network_comm_interface")
        ip = found[0]
    else:
        ip = default.get("address")
    env = {"HCCL_IF_IP": ip, "HCCL_SOCKET_IFNAME": nic, "GLOO_SOCKET_IFNAME": nic, "TP_SOCKET_IFNAME": nic}
    for key, value in (overrides or {}).items():
        env[key] = str(value)
    return env


def _hccl_ifname_problem(value: str, names: list) -> str | None:
    """HCCL's filter syntax: ``=a,b`` exact, ``^a,b`` / ``^=a,b`` exclude, else prefixes."""
    if value.startswith("^"):
        body = value[1:]
        exact = body.startswith("=")
        parts = [p for p in body.lstrip("=").split(",") if p]
        left = [n for n in names if not any((n == p) if exact else n.startswith(p) for p in parts)]
        return None if left else "excludes every interface of the node"
    if value.startswith("="):
        missing = [p for p in value[1:].split(",") if p and p not in names]
        return f"names {', '.join(missing)}, which the node does not have" if missing else None
    parts = [p for p in value.split(",") if p]
    if not any(n.startswith(p) for n in names for p in parts):
        return "matches no interface of the node (its values are interface name prefixes)"
    return None


def problems(host: str, env: dict, facts: dict) -> list:
    """Each of the four variables in ``env`` that names an address or interface ``host`` does not have."""
    addresses = node_addresses(facts)
    names = sorted(addresses)
    have = "; ".join(f"{n} {', '.join(a) or 'no IPv4'}" for n, a in sorted(addresses.items())) or "no interfaces"
    out = []
    ip = env.get("HCCL_IF_IP")
    if ip is not None and not any(ip in a for a in addresses.values()):
        out.append(f"{host}: HCCL_IF_IP={ip} is not an address of this node (it has: {have})")
    for key in IFNAME_VARIABLES:
        value = env.get(key)
        if value is None:
            continue
        value = str(value)
        if key == "HCCL_SOCKET_IFNAME":
            why = _hccl_ifname_problem(value, names)
        else:
            missing = [p for p in value.split(",") if p and p not in names]
            why = f"names {', '.join(missing)}, which the node does not have" if missing else None
        if why:
            out.append(f"{host}: {key}={value} {why} (it has: {have})")
    return out
