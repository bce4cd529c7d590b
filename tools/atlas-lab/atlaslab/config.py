"""lab.yml: the simulated fleet as data, parsed and validated into :class:`LabConfig`.

Validation errors name the file, the field (``nodes[2].npu.count``) and the fix.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from atlasctl.errors import UsageError

NAME_RE = re.compile(r"[a-z][a-z0-9-]{0,30}[a-z0-9]")  # fullmatch, as the others
GROUP_RE = re.compile(r"[a-z_][a-z0-9_]*")
BRIDGE_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9_-]{0,14}")
VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")
CONTROLLER_HOST = 1
# A second address of the lab host: the lab's own tools (atlas-lab ssh, the tests' node commands) connect from it,
# so a node behind a jump host (``via``) stays reachable to the lab while the controller address is not.
HARNESS_HOST = 2
FIRST_NODE_HOST = 11
ALL_NODES_GROUP = "atlas_nodes"
# kind: atlas = a serving node (in atlas_nodes, with NPUs); gateway = a branch load balancer
# (nginx, no NPU, not in atlas_nodes: site.yml's serving stages never touch it); controller = a bare
# node that plays a site's air-gapped Ansible controller (no NPU, in no group site.yml targets);
# monitoring = the site's Prometheus host (no NPU, not in atlas_nodes: group monitoring, stage 9); jump = an SSH
# jump host (bastion): the nodes whose ``via`` names it are reached over SSH only through it.
NODE_KINDS = ("atlas", "gateway", "controller", "monitoring", "jump")
NPU_MODELS = ("910B1", "910B2", "910B2C", "910B3", "910B4")


@dataclass(frozen=True)
class NpuSpec:
    model: str
    count: int
    hbm_mb: int


@dataclass(frozen=True)
class NodeSpec:
    name: str
    index: int  # position in lab.yml, 0-based
    ip: str
    groups: tuple[str, ...]
    npu: NpuSpec | None
    kind: str = "atlas"
    host_vars: tuple[tuple[str, Any], ...] = ()
    # the jump host SSH goes through (a node of kind jump), '' for a node the controller reaches directly
    via: str = ""
    # the lab host's address the lab's own tools connect from (LabConfig.harness_ip; '' before parse sets it)
    harness: str = ""

    @property
    def netns(self) -> str:
        return f"atlas-{self.name}"

    @property
    def veth_host(self) -> str:
        return f"atlv{self.index}"


@dataclass(frozen=True)
class LabConfig:
    path: Path
    lab_name: str
    bridge: str
    subnet: str
    controller_ip: str
    prefixlen: int
    driver_version: str
    firmware_version: str
    nodes: tuple[NodeSpec, ...] = field(default_factory=tuple)

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise UsageError(
            f"no lab node named {name!r} in {self.path}",
            fix=f"use one of: {', '.join(n.name for n in self.nodes)}",
        )

    @property
    def groups(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for node in self.nodes:
            for group in node.groups:
                result.setdefault(group, []).append(node.name)
        return result

    @property
    def serving_nodes(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if n.kind == "atlas")

    @property
    def inventory_path(self) -> Path:
        return self.path.parent / "hosts.yml"

    @property
    def harness_ip(self) -> str:
        """The lab host's second address, which the lab's own tools connect from (HARNESS_HOST)."""
        return str(ipaddress.ip_address(self.controller_ip) + HARNESS_HOST - CONTROLLER_HOST)

    @property
    def behind_jump(self) -> tuple[NodeSpec, ...]:
        """The nodes the controller reaches over SSH only through their jump host."""
        return tuple(n for n in self.nodes if n.via)


def _fail(path: Path, where: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"{path}: {where}: {problem}", fix=fix)


def _require(data: dict[str, Any], key: str, kind: type, path: Path, where: str) -> Any:
    if key not in data:
        raise _fail(path, f"{where}{key}", "missing", f"add `{key}:` to {path.name}")
    value = data[key]
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise _fail(
            path, f"{where}{key}", f"must be a {kind.__name__}, got {value!r}", f"fix `{key}` in {path.name}"
        )
    return value


def _parse_npu(raw: Any, path: Path, where: str) -> NpuSpec:
    if not isinstance(raw, dict):
        raise _fail(path, where, "must be a mapping {model, count, hbm_mb}", "see inventory/lab/lab.yml")
    model = str(_require(raw, "model", str, path, f"{where}."))
    if model not in NPU_MODELS:
        raise _fail(path, f"{where}.model", f"unknown NPU model {model!r}", f"use one of {', '.join(NPU_MODELS)}")
    count = _require(raw, "count", int, path, f"{where}.")
    if not 1 <= count <= 16:
        raise _fail(path, f"{where}.count", f"{count} is out of range", "use 1..16 NPUs per node")
    hbm = _require(raw, "hbm_mb", int, path, f"{where}.")
    if not 1024 <= hbm <= 262144:
        raise _fail(path, f"{where}.hbm_mb", f"{hbm} is out of range", "use the HBM size in MB, e.g. 65536")
    return NpuSpec(model=model, count=count, hbm_mb=hbm)


def _parse_node(raw: Any, index: int, network: ipaddress.IPv4Network, path: Path) -> NodeSpec:
    where = f"nodes[{index}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "must be a mapping with name, groups, npu", "see inventory/lab/lab.yml")
    name = _require(raw, "name", str, path, f"{where}.")
    if not NAME_RE.fullmatch(name) or len(f"atlas-{name}") > 40:
        raise _fail(
            path, f"{where}.name", f"{name!r} is not a valid node name", "use lowercase letters, digits, '-'"
        )
    groups = raw.get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) and GROUP_RE.fullmatch(g) for g in groups):
        raise _fail(
            path, f"{where}.groups", f"{groups!r} is not a list of group names", "use [snake_case, ...] names"
        )
    if ALL_NODES_GROUP in groups:
        raise _fail(path, f"{where}.groups", f"{ALL_NODES_GROUP} is implicit", f"remove {ALL_NODES_GROUP}")
    host_number = FIRST_NODE_HOST + index
    if host_number >= network.num_addresses - 1:
        raise _fail(path, where, f"no address left in {network}", "use a larger subnet or fewer nodes")
    ip = str(network.network_address + host_number)
    kind = raw.get("kind", "atlas")
    if kind not in NODE_KINDS:
        raise _fail(path, f"{where}.kind", f"unknown kind {kind!r}", f"use one of {', '.join(NODE_KINDS)}")
    npu = None if kind != "atlas" else _parse_npu(raw.get("npu"), path, f"{where}.npu")
    extra = raw.get("vars", {})
    if not isinstance(extra, dict) or not all(isinstance(k, str) and GROUP_RE.fullmatch(k) for k in extra):
        raise _fail(path, f"{where}.vars", f"{extra!r} is not a mapping of variable names",
                    "use vars: {snake_case_name: value}")
    via = raw.get("via", "")
    if not isinstance(via, str) or (via and not NAME_RE.fullmatch(via)):
        raise _fail(path, f"{where}.via", f"{via!r} is not a node name",
                    "name the jump host node, e.g. via: atlas-jump")
    return NodeSpec(name=name, index=index, ip=ip, groups=tuple(groups), npu=npu, kind=kind,
                    host_vars=tuple(sorted(extra.items())), via=via)


def parse(data: Any, path: Path) -> LabConfig:
    if not isinstance(data, dict):
        raise _fail(path, "top level", "must be a mapping", "see inventory/lab/lab.yml")
    lab_name = _require(data, "lab_name", str, path, "")
    bridge = _require(data, "bridge", str, path, "")
    if not BRIDGE_RE.fullmatch(bridge):
        raise _fail(path, "bridge", f"{bridge!r} is not a valid interface name", "use at most 15 characters")
    subnet = _require(data, "subnet", str, path, "")
    try:
        network = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise _fail(path, "subnet", f"{subnet!r}: {exc}", "use a network like 10.77.0.0/24") from exc
    if not network.is_private:
        raise _fail(path, "subnet", f"{subnet} is not a private network", "use 10.77.0.0/24")
    versions = {}
    for key in ("driver_version", "firmware_version"):
        value = str(_require(data, key, str, path, ""))
        if not VERSION_RE.fullmatch(value):
            raise _fail(path, key, f"{value!r} is not a version string", "use e.g. 24.1.rc1")
        versions[key] = value
    raw_nodes = _require(data, "nodes", list, path, "")
    if not raw_nodes:
        raise _fail(path, "nodes", "is empty", "define at least one node")
    nodes = tuple(_parse_node(raw, i, network, path) for i, raw in enumerate(raw_nodes))
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise _fail(path, f"nodes[{node.index}].name", f"duplicate name {node.name!r}", "make names unique")
        seen.add(node.name)
    harness = str(network.network_address + HARNESS_HOST)
    nodes = tuple(replace(node, harness=harness) for node in nodes)
    kinds = {node.name: node.kind for node in nodes}
    for node in nodes:
        if node.via and kinds.get(node.via) != "jump":
            raise _fail(path, f"nodes[{node.index}].via", f"{node.via!r} is not a node of kind jump",
                        "name a node declared with kind: jump")
    return LabConfig(
        path=path,
        lab_name=lab_name,
        bridge=bridge,
        subnet=str(network),
        controller_ip=str(network.network_address + CONTROLLER_HOST),
        prefixlen=network.prefixlen,
        nodes=nodes,
        **versions,
    )


def with_hdk(cfg: LabConfig, hdk: str | None) -> LabConfig:
    """The lab config with the HDK its new nodes start on replaced: ``DRIVER/FIRMWARE`` (``atlas-lab up
    --hdk``), e.g. the release's own, so a lab whose tests do not exercise the upgrade does not pay for it."""
    if hdk is None:
        return cfg
    driver, sep, firmware = hdk.partition("/")
    if not sep or not VERSION_RE.fullmatch(driver) or not VERSION_RE.fullmatch(firmware):
        raise UsageError(f"--hdk {hdk!r} is not DRIVER/FIRMWARE", fix="use e.g. --hdk 25.5.0/7.8.0.2.212")
    return replace(cfg, driver_version=driver, firmware_version=firmware)


def load(path: Path) -> LabConfig:
    if not path.is_file():
        raise UsageError(f"lab config not found: {path}", fix="pass --config inventory/lab/lab.yml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}", fix="fix the YAML syntax") from exc
    return parse(data, path.resolve())
