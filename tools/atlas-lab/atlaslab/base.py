"""The lab's base root filesystem: one debootstrap build, cleaned, cached as zstd tarball, unpacked once.

The cache file name carries a hash of the package list and the recipe version, so a change to either
builds a new base; the build runs in a temporary directory and is renamed into place only when it is
complete, so a killed build never leaves a bad cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from atlasctl.errors import EnvironmentProblem
from atlaslab import paths
from atlaslab.proc import require_tools, run

log = logging.getLogger(__name__)

SUITE = "bookworm"
RECIPE_VERSION = 4  # bump when clean_rootfs or the build steps change
PACKAGES: tuple[str, ...] = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "sudo", "curl",
    "iproute2", "ca-certificates", "libpam-systemd", "rsync", "nginx-light", "libnuma1", "libgomp1",
    "procps", "less",
    # what a site's controller has from its OS (the lab's controller node, tests/lab/test_controller.py):
    # gpg, with which the playbooks verify the bundle's signature on the controller
    "gnupg",
    # the monitoring stage (roles/monitoring) installs these from the OS package; the nodes have no network
    "prometheus", "prometheus-node-exporter",
    # Ansible's apt module (ansible.builtin.package on Debian) needs it on the node, and would fetch it
    "python3-apt",
    # the firewall stage (roles/firewall) installs it from the OS package
    "nftables",
)
# Installed after debootstrap, with apt in the new root: debootstrap's own configuration pass fails on
# golang-github-containers-common (measured), apt's does not. The container runtime of the serving stage's
# `runtime: container` (docs/containers.md): Podman with crun (Podman's dependency is "crun | runc": named),
# catatonit for --init.
LATE_PACKAGES: tuple[str, ...] = ("podman", "crun", "catatonit")
MASKED_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer", "apt-daily.service", "apt-daily-upgrade.service")
# Enabled by their packages; the stage that needs one enables it (gateway: nginx; monitoring: Prometheus on the
# monitoring node, the node exporter on the Atlas nodes and gateways), so no other node runs them.
DISABLED_UNITS = ("nginx.service", "prometheus.service", "prometheus-node-exporter.service", "nftables.service",
                  # enabled by the podman package; nothing here uses Podman's API socket or its auto-update
                  "podman.socket", "podman.service", "podman-auto-update.timer", "podman-restart.service")
# Podman inside a lab node (an nspawn container on a cgroup v1 host, measured: docs/containers.md, "The lab"):
# nspawn's system-call filter refuses keyctl (crun: "create keyring ...: Operation not permitted"), nspawn mounts
# the v1 controllers read-only (crun: "creating cgroup directory ...: No such file or directory"), and Podman's
# default network is a CNI bridge with NAT inside the node. Lab only: a real node keeps Podman's defaults.
PODMAN_LAB_CONF = """\
# atlas lab: Podman inside a systemd-nspawn node (tools/atlas-lab/atlaslab/base.py)
[containers]
keyring = false
cgroups = "disabled"
netns = "host"
"""
# overlay needs a filesystem that is not overlayfs under /var/lib/containers: the lab binds a directory of
# the host's ext4 there per node (node.py); without the bind Podman refuses with a clear error.
PODMAN_STORAGE_CONF = """\
# atlas lab: the node's /var/lib/containers is a bind of the host's ext4 (tools/atlas-lab/atlaslab/node.py)
[storage]
driver = "overlay"
graphroot = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
"""
SSHD_DROPIN = """\
# atlas lab: one host key per node, generated on the controller and pinned in its known_hosts
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
"""
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
RESOLV = "# atlas lab: nodes are air-gapped, there is no resolver\n"
MARKER = ".atlas-base-hash"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class BaseImage:
    hash: str
    tarball: Path
    built: bool  # True when this call ran debootstrap
    seconds: float


def base_hash(packages: tuple[str, ...] = PACKAGES + LATE_PACKAGES, recipe_version: int = RECIPE_VERSION) -> str:
    blob = json.dumps(
        {"packages": sorted(packages), "recipe": recipe_version, "suite": SUITE, "arch": platform.machine()},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tarball_path(digest: str | None = None) -> Path:
    return paths.cache_dir() / f"base-{digest or base_hash()}.tar.zst"


def host_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the host's apt uses for the main suite (ATLAS_DEBIAN_MIRROR overrides)."""
    override = os.environ.get("ATLAS_DEBIAN_MIRROR")
    if override:
        return override
    texts = [p.read_text(errors="replace") for p in sorted((sources_dir / "sources.list.d").glob("*.sources"))]
    for stanza in "\n\n".join(texts).split("\n\n"):
        fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, flags=re.M))
        if SUITE in fields.get("Suites", "").split() and "main" in fields.get("Components", "").split():
            return fields["URIs"].split()[0]
    legacy = [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*.list"))]
    for path in legacy:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", line)
            if match:
                return match.group(1)
    return DEFAULT_MIRROR


def clean_rootfs(root: Path) -> None:
    """Remove what debootstrap copied from the host and make the tree fit to be a node's lower layer."""
    (root / "etc/hostname").unlink(missing_ok=True)
    (root / "etc/machine-id").write_text("")
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    (root / "etc/hosts").write_text(HOSTS)
    resolv = root / "etc/resolv.conf"
    if resolv.is_symlink() or resolv.exists():
        resolv.unlink()
    resolv.write_text(RESOLV)
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/ssh/sshd_config.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ssh/sshd_config.d/atlas-lab.conf").write_text(SSHD_DROPIN)
    unit_dir = root / "etc/systemd/system"
    for unit in MASKED_UNITS:
        link = unit_dir / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    for unit in DISABLED_UNITS:  # the links are dangling on the host, so glob() would not see them
        for wants_dir in unit_dir.glob("*.wants"):
            link = wants_dir / unit
            if os.path.lexists(link):
                link.unlink()
    conf_d = root / "etc/containers/containers.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (conf_d / "50-atlas-lab.conf").write_text(PODMAN_LAB_CONF)
    (root / "etc/containers/storage.conf").write_text(PODMAN_STORAGE_CONF)
    for leftover in (root / "var/cache/apt/archives").glob("*.deb"):
        leftover.unlink()
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)


def install_late(root: Path, packages: tuple[str, ...]) -> None:
    """``apt-get install`` of ``packages`` inside the fresh root (its own sources list and resolv.conf, as
    debootstrap left them), with /proc mounted for the maintainer scripts."""
    if not packages:
        return
    (root / "proc").mkdir(exist_ok=True)
    run(["mount", "-t", "proc", "proc", str(root / "proc")], timeout=60)
    try:
        run(["chroot", str(root), "sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install "
             f"-y -q --no-install-recommends {' '.join(packages)} >/dev/null && apt-get clean"],
            timeout=900, fix="check that the Debian mirror in the new root's sources.list is reachable")
    finally:
        run(["umount", str(root / "proc")], timeout=60)


def build(force: bool = False) -> BaseImage:
    """Return the cached base tarball, building it with debootstrap if absent (or ``force``)."""
    digest = base_hash()
    target = tarball_path(digest)
    if target.is_file() and not force:
        return BaseImage(digest, target, built=False, seconds=0.0)
    require_tools("debootstrap", "zstd", "tar")
    started = time.monotonic()
    paths.cache_dir().mkdir(parents=True, exist_ok=True)
    work = paths.cache_dir() / f".base-{digest}.build-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "root"
    root.mkdir(parents=True)
    mirror = host_mirror()
    log.warning("building the lab base root filesystem from %s (about 2 minutes, once)", mirror)
    try:
        run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), mirror],
            timeout=1800,
            fix=f"check that {mirror} is reachable (set ATLAS_DEBIAN_MIRROR to the host's Debian mirror)",
        )
        install_late(root, LATE_PACKAGES)
        clean_rootfs(root)
        partial = work / "base.tar.zst"
        run(
            ["sh", "-c", f'tar -C "{root}" --numeric-owner --xattrs -cf - . | zstd -q -T0 -6 -o "{partial}"'],
            timeout=900,
        )
        os.replace(partial, target)
        for old in paths.cache_dir().glob("base-*.tar.zst"):
            if old != target:
                old.unlink()  # a base of an older recipe or package list
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BaseImage(digest, target, built=True, seconds=time.monotonic() - started)


def unpacked_hash(base: Path | None = None) -> str | None:
    marker = (base or paths.base_dir()) / MARKER
    return marker.read_text().strip() if marker.is_file() else None


def ensure_unpacked(image: BaseImage) -> Path:
    """Unpack the base tarball into $ATLAS_LAB_DIR/base unless that copy is already this hash."""
    base = paths.base_dir()
    if unpacked_hash(base) == image.hash:
        return base
    staging = base.with_name("base.unpack")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    run(
        ["sh", "-c", f'zstd -q -d -c "{image.tarball}" | tar -C "{staging}" --numeric-owner --xattrs -xf -'],
        fix=f"remove the cache file {image.tarball} and run `atlas-lab up` again to rebuild it",
    )
    (staging / MARKER).write_text(image.hash + "\n")
    if base.exists():
        if any(p.name == "merged" for p in paths.nodes_dir().glob("*/merged") if os.path.ismount(p)):
            raise EnvironmentProblem(
                f"{base} is in use by running lab nodes and must be replaced (new base {image.hash})",
                fix="run `atlas-lab down` first",
            )
        shutil.rmtree(base)
    os.replace(staging, base)
    return base
