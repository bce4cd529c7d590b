# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving instances that span several nodes: the inventory contract, its checks, and each rank's engine flags.

Inventory (group_vars; docs/multinode-serving.md, roles/serving/README.md)::

    serving_instances:
      NAME:
        nodes: [host0, host1]      # rank = position; nodes[0] = head / entry (the only node serving HTTP)
        profile: P                 # optional: every node's serving_profile must be P
        mode: vllm-dp              # vllm-dp | vllm-nnodes | sglang (default for an SGLang profile: sglang)
        tp: 4                      # tensor parallel size (per DP replica)
        pp: 1                      # pipeline parallel size (default 1)
        dp: 4                      # data parallel size (default 1)
        dp_local: 2                # vllm-dp: DP ranks per node, one number or one per rank (default dp / nodes)
        port: 13389                # vllm-dp: --data-parallel-rpc-port; vllm-nnodes: --master-port;
                                   # sglang: the --dist-init-addr port (defaults: 29550, 29501, 5000)
        address: 10.0.0.1          # optional: the head's address the ranks reach (default: the head's
                                   # npu_network_comm_address, else its ansible_host, else its name)
        roles: [prefill, decode]   # optional, prefill/decode split: the role of each rank (checked, recorded)

A host in no instance (or in an instance of one node) is a single-node instance: no flag is added, nothing
changes. The NPU network stage reads the same ``nodes`` (module_utils/npu_network.py parses the shape).

The flags per mode (their sources: docs/multinode-serving.md, section 2):

- ``vllm-dp`` (vllm-ascend's DeepSeek recipe): ``--tensor-parallel-size``, ``--data-parallel-size``,
  ``--data-parallel-size-local``, ``--data-parallel-address`` (the head's), ``--data-parallel-rpc-port`` (the
  same on every rank); non-head ranks add ``--headless`` and ``--data-parallel-start-rank`` (the sum of the
  dp_local of the ranks before).
- ``vllm-nnodes`` (mp executor): ``--distributed-executor-backend mp``, ``--tensor-parallel-size``,
  ``--pipeline-parallel-size``, ``--nnodes``, ``--node-rank``, ``--master-addr``, ``--master-port``;
  ``--headless`` on non-head ranks ("Only the head node starts the API server").
- ``sglang``: ``--tp-size``, ``--pp-size``, ``--dp-size``, ``--nnodes``, ``--node-rank``,
  ``--dist-init-addr head:port``.

Every flag must be in the release's schema (schemas/<release>.json): a mode the release cannot run is an
error naming the release, the flag and the releases that have it.

Standard library only.
"""

from __future__ import annotations

from ansible_collections.atlas.serving.plugins.module_utils import engine_lint, npu_network

MODES = {"vllm-dp": "vllm", "vllm-nnodes": "vllm", "sglang": "sglang"}
DEFAULT_PORTS = {"vllm-dp": 29550, "vllm-nnodes": 29501, "sglang": 5000}
ROLES = ("prefill", "decode")
FIELDS = ("nodes", "profile", "mode", "tp", "pp", "dp", "dp_local", "port", "address", "roles")


class InstanceError(ValueError):
    """A bad serving instance: the message names the instance, the field and the fix."""


def _int(spec, name, field, default, minimum=1):
    value = spec.get(field, default)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit() \
            or int(value) < minimum:
        raise InstanceError(f"serving_instances.{name}.{field} must be a whole number >= {minimum}, "
                            f"got {value!r}")
    return int(value)


def npus_of(hostvars, host, default=None):
    hardware = npu_network.host_var(hostvars, host, "atlas_hardware", {}) or {}
    count = hardware.get("npu_count") if hasattr(hardware, "get") else None
    return int(count) if count not in (None, "") else (int(default) if default else None)


def normalise(name, spec, hostvars, engine=None, default_npus=None):
    """One instance, checked against the inventory, as a dict: name, nodes, mode, tp, pp, dp, dp_local
    (list, per rank), port, head, address, roles (list or None), npus (list, per rank, None unknown)."""
    shape = npu_network.instance_problems({name: spec})
    if shape:
        raise InstanceError(shape[0])
    nodes = list(spec["nodes"])
    unknown = [n for n in nodes if not npu_network.known(hostvars, n)]
    if unknown:
        raise InstanceError(f"serving_instances.{name}.nodes names {', '.join(unknown)}, not in the inventory: "
                            "add the host(s) to the inventory or fix the name")
    extra = sorted(set(spec) - set(FIELDS))
    if extra:
        raise InstanceError(f"serving_instances.{name} has unknown field(s) {', '.join(extra)}: the fields are "
                            f"{', '.join(FIELDS)}")
    default_mode = "sglang" if engine == "sglang" else None
    mode = spec.get("mode", default_mode)
    if mode not in MODES:
        raise InstanceError(f"serving_instances.{name}.mode {mode!r} is not one of {', '.join(MODES)}: vLLM "
                            "instances name theirs (vllm-dp: data parallel across nodes, vllm-nnodes: "
                            "--nnodes/--node-rank)")
    if engine is not None and MODES[mode] != engine:
        raise InstanceError(f"serving_instances.{name}.mode {mode} runs {MODES[mode]}, but the profile's engine "
                            f"is {engine}: pick a {engine} mode "
                            f"({', '.join(m for m, e in MODES.items() if e == engine)})")
    tp, pp, dp = _int(spec, name, "tp", None), _int(spec, name, "pp", 1), _int(spec, name, "dp", 1)
    port = _int(spec, name, "port", DEFAULT_PORTS[mode])
    if port > 65535:
        raise InstanceError(f"serving_instances.{name}.port {port} is not a TCP port (1-65535)")
    npus = [npus_of(hostvars, n, default_npus) for n in nodes]
    inst = {"name": name, "nodes": nodes, "mode": mode, "tp": tp, "pp": pp, "dp": dp, "port": port,
            "head": nodes[0], "npus": npus, "profile": spec.get("profile"), "roles": None}
    inst["dp_local"] = _dp_local(name, spec, inst) if mode == "vllm-dp" else None
    inst["address"] = str(spec.get("address") or npu_network.host_var(hostvars, nodes[0], "npu_network_comm_address")
                          or npu_network.host_var(hostvars, nodes[0], "ansible_host") or nodes[0])
    inst["roles"] = _roles(name, spec, nodes)
    _check_npus(inst)
    return inst


def _dp_local(name, spec, inst):
    nodes, dp = inst["nodes"], inst["dp"]
    value = spec.get("dp_local")
    if value is None:
        if dp % len(nodes):
            raise InstanceError(f"serving_instances.{name}: dp {dp} does not divide over {len(nodes)} nodes: set "
                                "dp_local (DP ranks per node, one number or one per rank)")
        return [dp // len(nodes)] * len(nodes)
    values = value if isinstance(value, list) else [value] * len(nodes)
    if len(values) != len(nodes):
        raise InstanceError(f"serving_instances.{name}.dp_local lists {len(values)} numbers for {len(nodes)} "
                            "nodes: give one per rank, or one number for all")
    out = [_int({"dp_local": v}, name, "dp_local", None) for v in values]
    if sum(out) != dp:
        raise InstanceError(f"serving_instances.{name}: dp_local {out} adds up to {sum(out)}, not dp {dp}: "
                            "the DP ranks of the nodes must add up to the data parallel size")
    return out


def _roles(name, spec, nodes):
    roles = spec.get("roles")
    if roles is None:
        return None
    if not isinstance(roles, list) or len(roles) != len(nodes) or any(r not in ROLES for r in roles):
        raise InstanceError(f"serving_instances.{name}.roles must list one of {', '.join(ROLES)} per node "
                            f"({len(nodes)}), got {roles!r}")
    return list(roles)


def _check_npus(inst):
    name, tp, pp, dp, npus = inst["name"], inst["tp"], inst["pp"], inst["dp"], inst["npus"]
    if None in npus:
        missing = [n for n, c in zip(inst["nodes"], npus, strict=True) if c is None]
        raise InstanceError(f"serving_instances.{name}: the NPU count of {', '.join(missing)} is unknown: set "
                            "atlas_hardware.npu_count for the node(s)")
    listing = " + ".join(f"{n} {c}" for n, c in zip(inst["nodes"], npus, strict=True))
    if tp * pp * dp != sum(npus):
        raise InstanceError(f"serving_instances.{name}: tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp} NPUs, but its "
                            f"nodes have {sum(npus)} ({listing}): make the layout use every NPU of the nodes "
                            "(or change the nodes)")
    if inst["dp_local"] is not None:
        for node, local, count in zip(inst["nodes"], inst["dp_local"], npus, strict=True):
            if local * tp * pp != count:
                raise InstanceError(f"serving_instances.{name}: {node} runs dp_local {local} x tp {tp} x pp {pp} = "
                                    f"{local * tp * pp} NPUs but has {count}: set dp_local per rank to its "
                                    "NPUs / (tp x pp)")
    elif len(set(npus)) > 1:
        raise InstanceError(f"serving_instances.{name}: its nodes have different NPU counts ({listing}); "
                            f"{inst['mode']} splits the layout evenly over the nodes")


def membership(serving_instances):
    """{host: [instance names]} over every instance, by name."""
    out = {}
    for name in sorted(serving_instances or {}):
        spec = serving_instances[name]
        for node in (spec.get("nodes") or []) if isinstance(spec, dict) else []:
            out.setdefault(node, []).append(name)
    return out


def problems(serving_instances, hostvars, engine_of=None, default_npus=None, engine=None):
    """Every problem of ``serving_instances`` over the inventory (shape, unknown hosts, a host in two
    instances, the layout against the nodes' NPUs, the nodes' serving_profile against ``profile``).
    ``engine_of(profile)``: the engine of a profile name (or ``engine``: the one engine of them all), or
    None to skip the engine checks."""
    if serving_instances in (None, {}):
        return []
    out = npu_network.instance_problems(serving_instances)
    if out or not isinstance(serving_instances, dict):
        return out
    for host, names in sorted(membership(serving_instances).items()):
        if len(names) > 1:
            out.append(f"{host} is in {len(names)} serving instances ({', '.join(names)}): a host serves one "
                       "instance; remove it from all but one")
    for name in sorted(serving_instances):
        spec = serving_instances[name]
        profiles = {n: npu_network.host_var(hostvars, n, "serving_profile")
                    for n in spec["nodes"] if npu_network.known(hostvars, n)}
        wanted = spec.get("profile")
        differ = {n: p for n, p in profiles.items() if wanted is not None and p != wanted}
        if differ:
            out.append(f"serving_instances.{name}.profile is {wanted} but "
                       f"{', '.join(f'{n} has serving_profile {p}' for n, p in differ.items())}: set "
                       f"serving_profile: {wanted} for every node of the instance (a group's group_vars)")
        elif len(set(profiles.values())) > 1:
            out.append(f"serving_instances.{name}: its nodes have different serving_profile values "
                       f"({', '.join(f'{n}={p}' for n, p in profiles.items())}): one instance runs one profile")
        first = next(iter(profiles.values()), None)
        found = engine_of(wanted or first) if engine_of and (wanted or first) else engine
        try:
            normalise(name, spec, hostvars, found, default_npus)
        except InstanceError as exc:
            out.append(str(exc))
    return out


def instance_of(host, serving_instances):
    """The name and spec of the instance of two or more nodes ``host`` is in, or None."""
    names = [i["name"] for i in npu_network.instances_of(host, serving_instances)]
    if len(names) > 1:
        raise InstanceError(f"{host} is in {len(names)} serving instances ({', '.join(names)}): a host serves one "
                            "instance; remove it from all but one")
    if not names or len(serving_instances[names[0]]["nodes"]) < 2:
        return None
    return names[0], serving_instances[names[0]]


def unit_of(host, serving_instances):
    """The serving unit ``host`` runs in: its instance's nodes in rank order (an instance of two or more
    nodes: rollout, rollback and restarts act on all of them together), else ``[host]``."""
    found = instance_of(host, serving_instances)
    return list(found[1]["nodes"]) if found else [host]


def behind(nodes, hostvars, mark, value, present):
    """The ``nodes`` of a unit that did not reach a step of this run: not in ``present`` (the play's hosts: left
    out, unreachable, or failed with no rescue), or whose fact ``mark`` is not ``value`` (a rank that failed
    before the step, and is rolling back, never set it). Every rank marks each step it finished with a value
    used once per run, so a mark from another step never counts."""
    out = []
    for node in nodes:
        facts = hostvars[node] if node in hostvars else {}
        if node not in present or facts.get(mark) != value:
            out.append(node)
    return out


def units(hosts, serving_instances):
    """``hosts`` grouped into serving units, in the order their first host appears; a unit brings every
    rank of its instance, also those not in ``hosts`` (a wave or a batch never splits an instance)."""
    out, seen = [], set()
    for host in hosts:
        if host not in seen:
            unit = unit_of(host, serving_instances)
            seen.update(unit)
            out.append(unit)
    return out


def entry(host, serving_instances):
    """False only for a non-head rank of an instance of two or more nodes (it serves no HTTP)."""
    return not any(i["rank"] > 0 for i in npu_network.multi_node_instances(host, serving_instances))


def entry_nodes(hosts, serving_instances):
    """``hosts`` less the non-head ranks of multi-node instances: what the gateway routes to and health probes."""
    return [h for h in hosts if entry(h, serving_instances)]


def mode_flags(inst, rank):
    """The engine flags of rank ``rank`` of a normalised instance (ordered as the recipes write them)."""
    mode, nodes, head = inst["mode"], inst["nodes"], rank == 0
    if mode == "vllm-dp":
        flags = {"--tensor-parallel-size": inst["tp"]}
        if inst["pp"] > 1:
            flags["--pipeline-parallel-size"] = inst["pp"]
        flags.update({"--data-parallel-size": inst["dp"], "--data-parallel-size-local": inst["dp_local"][rank],
                      "--data-parallel-address": inst["address"], "--data-parallel-rpc-port": inst["port"]})
        if not head:
            flags.update({"--headless": True, "--data-parallel-start-rank": sum(inst["dp_local"][:rank])})
        return flags
    if mode == "vllm-nnodes":
        flags = {"--distributed-executor-backend": "mp", "--tensor-parallel-size": inst["tp"],
                 "--pipeline-parallel-size": inst["pp"]}
        if inst["dp"] > 1:
            flags["--data-parallel-size"] = inst["dp"]
        flags.update({"--nnodes": len(nodes), "--node-rank": rank, "--master-addr": inst["address"],
                      "--master-port": inst["port"]})
        if not head:
            flags["--headless"] = True
        return flags
    flags = {"--tp-size": inst["tp"]}
    if inst["pp"] > 1:
        flags["--pp-size"] = inst["pp"]
    if inst["dp"] > 1:
        flags["--dp-size"] = inst["dp"]
    flags.update({"--nnodes": len(nodes), "--node-rank": rank, "--dist-init-addr": f"{inst['address']}:{inst['port']}"})
    return flags


def release_problems(flags, release, schema_dir=None, mode="", name=""):
    """Each flag of ``flags`` the release's schema lacks, naming the releases that have it."""
    schema_dir = schema_dir or engine_lint.schema_dir_default()
    try:
        tables = {r: engine_lint.flag_options(r, schema_dir) for r in engine_lint.known_releases(schema_dir)}
    except engine_lint.LintError as exc:
        return [str(exc)]
    if release not in tables:
        return [f"engine_release {release} has no schema in {schema_dir} (known: {', '.join(sorted(tables))})"]
    out = []
    for flag in flags:
        if flag not in tables[release]:
            having = [r for r in sorted(tables) if flag in tables[r]]
            out.append(f"serving instance {name}: mode {mode} needs {flag}, which {release} does not have; "
                       f"releases with it: {', '.join(having) or 'none'} (pick one of them, or another mode)")
    return out


def rank(host, serving_instances, hostvars, engine, release, default_npus=None, schema_dir=None):
    """What the serving role adds for ``host``: ``{"instance": None, "flags": {}, "record": {}}`` for a
    single-node host, else the instance's name, nodes, rank, head, mode, whether it is the entry, its
    flags, and the record fields (docs/multinode-serving.md). Raises InstanceError on any problem."""
    found = instance_of(host, serving_instances)
    if found is None:
        return {"instance": None, "flags": {}, "record": {}, "entry": True}
    name, spec = found
    issues = problems({name: spec}, hostvars, default_npus=default_npus, engine=engine)
    if issues:
        raise InstanceError(" | ".join(issues))
    inst = normalise(name, spec, hostvars, engine, default_npus)
    if inst["roles"] is not None:
        raise InstanceError(f"serving_instances.{name}.roles: a prefill/decode split is checked and recorded, "
                            "but its command lines (the KV transfer settings and the router in front) are not "
                            "rendered yet: remove roles, or run prefill and decode as instances of their own")
    position = inst["nodes"].index(host)
    flags = mode_flags(inst, position)
    bad = release_problems(flags, release, schema_dir, inst["mode"], name)
    if bad:
        raise InstanceError(" | ".join(bad))
    role = "entry" if position == 0 else "worker"
    record = {"instance": {"name": name, "nodes": inst["nodes"], "rank": position, "head": inst["head"],
                           "role": role, "entry": position == 0, "mode": inst["mode"]}}
    return {"instance": name, "nodes": inst["nodes"], "rank": position, "head": inst["head"], "mode": inst["mode"],
            "entry": position == 0, "role": role, "flags": flags, "record": record,
            "layout": {k: inst[k] for k in ("tp", "pp", "dp", "dp_local", "port", "address")}}


def comm_env_for(engine, env):
    """The HCCL/Gloo/TP variables for ``engine``: SGLang reads no TP_SOCKET_IFNAME (no source says it does;
    docs/multinode-serving.md), so it is left out there."""
    return {k: v for k, v in env.items() if not (engine == "sglang" and k == "TP_SOCKET_IFNAME")}
