"""The lab's public API: what `atlas-lab` and the lab tests call.

    up(config_path=None, timeout=120.0) -> LabState
    down() -> list[str]
    status() -> LabState
    power(name, "off" | "on", timeout=120.0) -> NodeStatus
    set_npu(name, device=None, health=None, hbm_used_mb=None, driver=None) -> dict
    set_npu_network(name, device=None, link=None, net_health=None, unreachable=None, reachable=None) -> dict
    lab_is_up() -> bool;  require_lab_up() -> LabConfig
    ssh_argv(name, command=()) -> list[str];  run_on(name, command) -> CompletedProcess
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from atlasctl.errors import AtlasError, EnvironmentProblem, UsageError
from atlaslab import base, config, inventory, net, node, npu, paths, signing, site_secrets, ssh
from atlaslab.config import LabConfig, NodeSpec
from atlaslab.lock import hold_lab
from atlaslab.proc import require_tools, run

log = logging.getLogger(__name__)

DEFAULT_BRIDGE = "atlasbr0"
HOST_TOOLS = ("debootstrap", "systemd-nspawn", "nft", "zstd", "ssh", "ssh-keygen", "ip", "mount", "setsid")


@dataclass
class NodeStatus:
    name: str
    ip: str
    groups: list[str]
    state: str  # running | stopped
    ssh: bool


@dataclass
class LabState:
    config_path: str
    inventory_path: str
    up: bool
    nodes: list[NodeStatus] = field(default_factory=list)
    already_up: bool = False
    seconds: float = 0.0
    base_built: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- state


def _read_state() -> dict:
    try:
        return json.loads(paths.state_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_state(cfg: LabConfig) -> None:
    data = {"config": str(cfg.path), "inventory": str(cfg.inventory_path), "bridge": cfg.bridge,
            "subnet": cfg.subnet, "nodes": [n.name for n in cfg.nodes], "started": time.time()}
    paths.state_file().write_text(json.dumps(data, indent=2) + "\n")


def load_config(config_path: str | os.PathLike[str] | None = None) -> LabConfig:
    return config.load(paths.resolve_config(config_path))


def lab_is_up() -> bool:
    """The lab is up when its state is recorded, its bridge exists and its network safety is in place."""
    state = _read_state()
    if not state:
        return False
    return net.link_exists(state.get("bridge", DEFAULT_BRIDGE)) and net.blackhole_present(state["subnet"]) \
        and net.nft_present()


def require_lab_up() -> LabConfig:
    """Return the running lab's config, or raise: nothing may connect to nodes of a lab that is down."""
    if not lab_is_up():
        raise EnvironmentProblem("the lab is not up", fix="run `atlas-lab up` first")
    return config.load(Path(_read_state()["config"]))


def _require_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem("the lab needs root (network namespaces, mounts, nspawn)", fix="run as root")
    require_tools(*HOST_TOOLS)


# ---------------------------------------------------------------- stale state / down


def _lab_mounts() -> list[str]:
    prefix = str(paths.lab_dir()).rstrip("/") + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix):
            mounts.append(point)
    return sorted(set(mounts), key=lambda p: -p.count("/"))


def _stop_all(timeout: float = 30.0) -> list[str]:
    names = [p.name for p in paths.nodes_dir().iterdir()] if paths.nodes_dir().is_dir() else []
    with ThreadPoolExecutor(max_workers=max(len(names), 1)) as pool:
        stopped = list(pool.map(lambda n: node.stop(n, timeout), names))
    for name in names:  # whatever a supervisor killed mid-run left behind in the node's cgroups
        node.kill_tree(name)
    return [f"node {n}" for n, was in zip(names, stopped, strict=True) if was]


def _discard(path: Path, *, move: bool = True) -> None:
    """Move ``path`` aside at once and delete it in the background: the nodes' roots hold the engines'
    environments (~10^5 files, tens of seconds of disk work), and nothing waits for them to be gone. The
    name is the lab's own (``.<name>.discarded-<random>``, never reused); ``rm --one-file-system`` stops at
    anything still mounted below it."""
    target = path
    if move:
        target = path.with_name(f".{path.name}.discarded-{os.urandom(4).hex()}")
        try:
            path.rename(target)
        except OSError as exc:  # e.g. EBUSY: delete it in place, now
            log.debug("cannot move %s aside (%s); deleting it in place", path, exc)
            shutil.rmtree(path)
            return
    subprocess.Popen(["ionice", "-c", "3", "rm", "-rf", "--one-file-system", "--", str(target)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def _cleanup(bridge: str, inventory_path: Path | None) -> list[str]:
    # Everything is removed next: a node gets 10 s to power off cleanly (an engine's own stop can
    # take a minute, TimeoutStopSec), then its processes are killed.
    removed = _stop_all(timeout=10.0)
    for point in _lab_mounts():
        if run(["umount", point], check=False).returncode != 0:
            run(["umount", "-l", point], check=False)
        removed.append(f"mount {point}")
    removed += net.remove_all(bridge)
    if bridge != DEFAULT_BRIDGE:
        removed += net.remove_all(DEFAULT_BRIDGE)
    removed += [f"cgroup {c}" for c in node.remove_cgroups()]
    for leftover in paths.lab_dir().glob(f".{paths.nodes_dir().name}.discarded-*"):
        _discard(leftover, move=False)  # a deletion an earlier `lab down` left unfinished (the machine stopped)
    if paths.nodes_dir().exists():
        _discard(paths.nodes_dir())
        removed.append(str(paths.nodes_dir()))
    if paths.fabric_dir().exists():
        shutil.rmtree(paths.fabric_dir())
        removed.append(str(paths.fabric_dir()))
    hostkeys = paths.ssh_dir() / "hostkeys"
    if hostkeys.exists():
        shutil.rmtree(hostkeys)
        removed.append(str(hostkeys))
    paths.known_hosts().unlink(missing_ok=True)
    if inventory_path and inventory.remove(inventory_path):
        removed.append(str(inventory_path))
    if paths.state_file().exists():
        paths.state_file().unlink()
        removed.append(str(paths.state_file()))
    return removed


def down() -> list[str]:
    """Power every node off, remove mounts, netns, veths, bridge, cgroups, node dirs, hosts.yml. Idempotent.

    Keeps the base cache, the unpacked base, the blackhole route and the forward-drop table.
    """
    _require_root()
    with hold_lab("atlas-lab down"):
        state = _read_state()
        inv = Path(state["inventory"]) if state.get("inventory") else paths.resolve_config(None).parent / "hosts.yml"
        return _cleanup(state.get("bridge", DEFAULT_BRIDGE), inv)


# ---------------------------------------------------------------- up


def _wait_ssh(spec: NodeSpec, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not node.is_running(spec.name):
            return False
        if ssh.reachable(spec):
            return True
        time.sleep(0.5)
    return False


def _boot_and_wait(specs: Sequence[NodeSpec], timeout: float) -> list[str]:
    """Start ``specs`` and wait for SSH with the pinned host key; return the names that failed."""
    for spec in specs:
        node.start(spec)
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(max_workers=max(len(specs), 1)) as pool:
        ready = list(pool.map(lambda s: _wait_ssh(s, deadline), specs))
    return [s.name for s, ok in zip(specs, ready, strict=True) if not ok]


def _boot_failure(names: list[str], timeout: float) -> AtlasError:
    parts = [f"lab node(s) did not answer SSH within {timeout:.0f}s: {', '.join(names)}"]
    for name in names:
        parts.append(f"--- {name}: tail of {paths.node_dir(name) / node.CONSOLE_LOG}\n{node.console_tail(name)}")
    return AtlasError("\n".join(parts), fix="read the console logs above, then `atlas-lab down` and retry")


def _write_known_hosts(cfg: LabConfig) -> None:
    paths.known_hosts().write_text("".join(node.host_key_line(n) + "\n" for n in cfg.nodes))


def up(config_path: str | os.PathLike[str] | None = None, timeout: float = 120.0, hdk: str | None = None) -> LabState:
    """Bring the lab up from lab.yml (no-op when it is already up and healthy). ``hdk``
    (``DRIVER/FIRMWARE``) replaces lab.yml's driver_version/firmware_version for the nodes this
    call creates (a node keeps the HDK installed on it across power cycles)."""
    started = time.monotonic()
    _require_root()
    cfg = config.with_hdk(load_config(config_path), hdk)
    with hold_lab("atlas-lab up"):
        if lab_is_up():
            return _resume(cfg, timeout, started)
        return _fresh_up(cfg, timeout, started)


def _write_inventory(cfg: LabConfig) -> None:
    """inventory/lab/hosts.yml: connection settings, the pinned signing key, the site's CA, certificates and
    secrets (made once per lab: site_secrets)."""
    site_secrets.ensure(cfg)
    inventory.write(cfg, paths.private_key(), paths.known_hosts(),
                    {**signing.inventory_vars(), **site_secrets.group_vars(cfg)}, site_secrets.host_vars)


def _fresh_up(cfg: LabConfig, timeout: float, started: float) -> LabState:
    _cleanup(cfg.bridge, cfg.inventory_path)
    net.ensure_safety(cfg)
    image = base.build()
    base.ensure_unpacked(image)
    paths.bundle_dir().mkdir(parents=True, exist_ok=True)
    paths.fabric_dir().mkdir(parents=True, exist_ok=True)
    node.ensure_controller_key()
    _write_state(cfg)
    net.ensure_bridge(cfg)
    for spec in cfg.nodes:
        node.prepare(cfg, spec)
    _write_known_hosts(cfg)
    failed = _boot_and_wait(cfg.nodes, timeout)
    if failed:
        raise _boot_failure(failed, timeout)
    _write_inventory(cfg)
    return _snapshot(cfg, seconds=time.monotonic() - started, base_built=image.built)


def _resume(cfg: LabConfig, timeout: float, started: float) -> LabState:
    recorded = _read_state()
    if recorded.get("config") != str(cfg.path) or recorded.get("nodes") != [n.name for n in cfg.nodes]:
        raise UsageError(
            f"the lab is up from {recorded.get('config')}, not {cfg.path}",
            fix="run `atlas-lab down` first, then `atlas-lab up` with the new config",
        )
    net.ensure_safety(cfg)
    stopped = [s for s in cfg.nodes if not node.is_running(s.name)]
    failed = _boot_and_wait(cfg.nodes, timeout) if stopped else []
    if failed:
        raise _boot_failure(failed, timeout)
    _write_inventory(cfg)
    state = _snapshot(cfg, seconds=time.monotonic() - started)
    state.already_up = not stopped and all(n.ssh for n in state.nodes)
    if not all(n.ssh for n in state.nodes):
        raise _boot_failure([n.name for n in state.nodes if not n.ssh], timeout)
    return state


# ---------------------------------------------------------------- status, power, npu, ssh


def _node_status(spec: NodeSpec) -> NodeStatus:
    running = node.is_running(spec.name)
    return NodeStatus(spec.name, spec.ip, list(spec.groups), "running" if running else "stopped",
                      running and ssh.reachable(spec))


def _snapshot(cfg: LabConfig, seconds: float = 0.0, base_built: bool = False) -> LabState:
    with ThreadPoolExecutor(max_workers=max(len(cfg.nodes), 1)) as pool:
        nodes = list(pool.map(_node_status, cfg.nodes))
    return LabState(str(cfg.path), str(cfg.inventory_path), True, nodes, seconds=seconds, base_built=base_built)


def status() -> LabState:
    """Per node: running/stopped and whether SSH answers. Raises EnvironmentProblem when the lab is down."""
    return _snapshot(require_lab_up())


def power(name: str, action: str, timeout: float = 120.0) -> NodeStatus:
    """off: clean power-off (SIGTERM to nspawn), the node stays defined; on: boot it and wait for SSH."""
    _require_root()
    if action not in ("off", "on"):
        raise UsageError(f"power action {action!r} is not valid", fix="use `off` or `on`")
    cfg = require_lab_up()
    spec = cfg.node(name)
    with hold_lab(f"atlas-lab power {name} {action}"):
        if action == "off":
            node.stop(spec.name)
        else:
            failed = _boot_and_wait([spec], timeout)
            if failed:
                raise _boot_failure(failed, timeout)
    return _node_status(spec)


def set_npu(name: str, **changes: object) -> dict:
    """Change a node's simulated NPU state (health, hbm_used_mb, driver, device) through its overlay root."""
    return npu.update_file(_npu_root(name), **changes)


def set_npu_network(name: str, **changes: object) -> dict:
    """Change a node's NPU ports (link, net_health, unreachable, reachable, device): its hccn.json through its
    overlay root, published to the lab's NPU fabric."""
    return npu.update_network_file(_npu_root(name), paths.fabric_dir(), **changes)


def _npu_root(name: str) -> Path:
    cfg = require_lab_up()
    spec = cfg.node(name)
    if spec.npu is None:
        raise UsageError(f"lab node {name} is a {spec.kind} and has no NPU",
                         fix=f"use a serving node: {', '.join(n.name for n in cfg.serving_nodes)}")
    root = node.merged(spec.name)
    if not os.path.ismount(root):
        raise EnvironmentProblem(f"lab node {name} has no mounted root at {root}", fix="run `atlas-lab up`")
    return root


def ssh_argv(name: str, command: Sequence[str] = (), tty: bool = False) -> list[str]:
    spec = require_lab_up().node(name)
    return ssh.ssh_argv(spec, command, tty=tty)


def run_on(name: str, command: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    spec = require_lab_up().node(name)
    return ssh.run_on(spec, command, timeout=timeout)
