"""One lab node: overlay root, identity files, SSH keys, cgroups, and its supervised systemd-nspawn."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import atlasctl
import atlaslab
from atlasctl.errors import EnvironmentProblem
from atlaslab import net, npu, paths, supervisor
from atlaslab.config import LabConfig, NodeSpec
from atlaslab.proc import run

log = logging.getLogger(__name__)

CGROUP_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup/systemd"))
CGROUP_LAB = "atlas-lab"
BUNDLE_MOUNT = "/srv/atlas-bundle"
CONSOLE_LOG = "console.log"


def merged(name: str) -> Path:
    return paths.node_dir(name) / "merged"


def cgroup_dirs(name: str) -> list[Path]:
    return [root / CGROUP_LAB / name for root in CGROUP_ROOTS if (root / "cgroup.procs").exists()]


def mount_overlay(name: str) -> Path:
    ndir = paths.node_dir(name)
    for sub in ("upper", "work", "merged"):
        (ndir / sub).mkdir(parents=True, exist_ok=True)
    target = ndir / "merged"
    if not os.path.ismount(target):
        opts = f"lowerdir={paths.base_dir()},upperdir={ndir / 'upper'},workdir={ndir / 'work'}"
        run(["mount", "-t", "overlay", f"atlas-lab-{name}", "-o", opts, str(target)],
            fix="the kernel needs overlayfs support (modprobe overlay)")
    return target


def ensure_controller_key() -> Path:
    key = paths.private_key()
    key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not key.is_file():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "atlas-lab-controller", "-f", str(key)])
    return key


def host_key_line(node: NodeSpec) -> str:
    """Generate the node's host key on the controller (once per `up`); return its known_hosts line."""
    kdir = paths.ssh_dir() / "hostkeys" / node.name
    kdir.mkdir(parents=True, exist_ok=True)
    key = kdir / "ssh_host_ed25519_key"
    if not key.is_file():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{node.name}", "-f", str(key)])
    kind, blob = Path(f"{key}.pub").read_text().split()[:2]
    return f"{node.ip},{node.name} {kind} {blob}"


def etc_hosts(cfg: LabConfig) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{cfg.controller_ip}\tatlas-controller"]
    lines += [f"{n.ip}\t{n.name}" for n in cfg.nodes]
    return "\n".join(lines) + "\n"


def write_identity(root: Path, cfg: LabConfig, node: NodeSpec) -> None:
    (root / "etc/hostname").write_text(node.name + "\n")
    (root / "etc/hosts").write_text(etc_hosts(cfg))
    machine_id = root / "etc/machine-id"
    if not machine_id.read_text().strip():
        machine_id.write_text(uuid.uuid4().hex + "\n")
    kdir = paths.ssh_dir() / "hostkeys" / node.name
    for name, mode in (("ssh_host_ed25519_key", 0o600), ("ssh_host_ed25519_key.pub", 0o644)):
        target = root / "etc/ssh" / name
        target.write_bytes((kdir / name).read_bytes())
        target.chmod(mode)
    ssh = root / "root/.ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(Path(f"{paths.private_key()}.pub").read_text())
    (ssh / "authorized_keys").chmod(0o600)
    (root / BUNDLE_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)
    if node.npu is not None:
        npu.install(root, cfg, node)
        paths.fabric_dir().mkdir(parents=True, exist_ok=True)
        npu.update_network_file(root, paths.fabric_dir())  # no change: publishes this node's NPU ports afresh
    (root / npu.FABRIC_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)


def prepare(cfg: LabConfig, node: NodeSpec) -> None:
    net.ensure_node_net(cfg, node)
    root = mount_overlay(node.name)
    host_key_line(node)
    write_identity(root, cfg, node)


def _import_path() -> str:
    """PYTHONPATH for the supervisor: where atlaslab and atlasctl are (installed or from the checkout)."""
    roots = dict.fromkeys(str(Path(pkg.__file__).resolve().parents[1]) for pkg in (atlaslab, atlasctl))
    return os.pathsep.join(roots)


CONTAINERS_MOUNT = "/var/lib/containers"


def containers_dir(name: str) -> Path:
    """The node's container store (its /var/lib/containers), in its own directory: gone with the node."""
    return paths.node_dir(name) / "containers"


def nspawn_argv(node: NodeSpec) -> list[str]:
    return [
        "systemd-nspawn", "-D", str(merged(node.name)), "-M", node.name, f"--hostname={node.name}",
        "--register=no", "--keep-unit", "--console=passive", "--link-journal=no",
        f"--network-namespace-path={net.netns_path(node)}", "--capability=CAP_NET_ADMIN",
        "--resolv-conf=off", f"--bind-ro={paths.bundle_dir()}:{BUNDLE_MOUNT}",
        f"--bind={paths.fabric_dir()}:{npu.FABRIC_MOUNT}",
        # Podman's overlay store cannot sit on the node's overlayfs root: a directory of the host's filesystem
        f"--bind={containers_dir(node.name)}:{CONTAINERS_MOUNT}", "-b",
    ]


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    if stat.rsplit(")", 1)[1].split()[0] == "Z" or b"atlaslab.supervisor" not in cmdline:
        return None  # dead, or the pid was reused by something that is not ours
    return pid


def supervisor_pid(name: str) -> int | None:
    return _read_pid(paths.node_dir(name) / supervisor.SUPERVISOR_PID)


def is_running(name: str) -> bool:
    return supervisor_pid(name) is not None


def start(node: NodeSpec) -> None:
    """Boot the node fully detached (setsid -f) under its supervisor; return once the supervisor runs."""
    if is_running(node.name):
        return
    ndir = paths.node_dir(node.name)
    (ndir / supervisor.SUPERVISOR_PID).unlink(missing_ok=True)
    paths.fabric_dir().mkdir(parents=True, exist_ok=True)  # bound into every node (nspawn_argv)
    containers_dir(node.name).mkdir(mode=0o700, exist_ok=True)
    cgroups = ",".join(str(d) for d in cgroup_dirs(node.name))
    argv = ["setsid", "-f", sys.executable, "-m", "atlaslab.supervisor", str(ndir), cgroups, "--",
            *nspawn_argv(node)]
    with open(ndir / CONSOLE_LOG, "ab") as console:
        subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=console, stderr=console, check=True,
                       env=dict(os.environ, PYTHONPATH=_import_path()))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if is_running(node.name):
            return
        time.sleep(0.05)
    raise EnvironmentProblem(
        f"lab node {node.name}: supervisor did not start; console log:\n{console_tail(node.name)}",
        fix="check that systemd-nspawn (systemd-container) is installed and you are root",
    )


def stop(name: str, timeout: float = 30.0) -> bool:
    """SIGTERM the node's supervisor (clean power-off); SIGKILL after ``timeout``. True if it was running."""
    pid = supervisor_pid(name)
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if supervisor_pid(name) is None:
            return True
        time.sleep(0.1)
    log.warning("lab node %s did not power off in %.0fs; killing it", name, timeout)
    kill_tree(name)
    return True


def kill_tree(name: str) -> None:
    """Last resort: SIGKILL every process in the node's cgroups."""
    for cdir in cgroup_dirs(name):
        for procs in cdir.rglob("cgroup.procs"):
            for line in procs.read_text().split():
                try:
                    os.kill(int(line), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
    time.sleep(0.5)


def console_tail(name: str, lines: int = 20) -> str:
    path = paths.node_dir(name) / CONSOLE_LOG
    if not path.is_file():
        return "(no console log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def remove_cgroups(name: str | None = None) -> list[str]:
    """rmdir the lab's cgroup directories bottom-up (all nodes when ``name`` is None)."""
    removed = []
    for root in CGROUP_ROOTS:
        top = root / CGROUP_LAB / name if name else root / CGROUP_LAB
        if not top.is_dir():
            continue
        for cdir in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            try:
                cdir.rmdir()
                removed.append(str(cdir))
            except OSError as exc:
                log.debug("cannot remove cgroup %s: %s", cdir, exc)
    return removed
