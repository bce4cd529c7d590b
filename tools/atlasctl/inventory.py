"""Reading an Ansible inventory the way Ansible does: ``ansible-inventory -i INV --list``.

One place for running it, walking its groups, reading the inventory's own data (``path_list``:
serving_profile_dirs, atlas_compat_extra_tables) and turning a host's variables into its SSH settings
(``Target``): doctor (fabric) and bundle push (rsync over ssh) connect with the same settings and the
same refusals. Host key checking stays on: an inventory that turns it off is refused, and the
known_hosts files it names (``-o UserKnownHostsFile=...``), else the user's, are the ones checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from atlasctl.collection import plugin_utils
from atlasctl.errors import EnvironmentProblem, UsageError
from atlasctl.layout import Layout, default_layout

SERVING_GROUP = "atlas_nodes"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def listing(inventory: Path, limit: str | None = None) -> dict[str, Any]:
    """The ``--list`` document (groups, and host vars under ``_meta``), narrowed by ``limit``."""
    beside = Path(sys.executable).parent / "ansible-inventory"
    exe = str(beside) if beside.is_file() else shutil.which("ansible-inventory")
    if exe is None:
        raise EnvironmentProblem("ansible-inventory is not on PATH", fix="activate the controller virtualenv (.venv)")
    argv = [exe, "-i", str(inventory), "--list"] + (["--limit", limit] if limit else [])
    # Every host variable (keys included) is in this output: never into an Ansible log file.
    env = {**os.environ, "ANSIBLE_LOG_PATH": "/dev/null"}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=env)
    if proc.returncode != 0:
        raise UsageError(f"ansible-inventory -i {inventory} failed: {proc.stderr.strip()[-800:]}",
                         fix="fix the inventory (ansible-inventory -i INV --graph shows what it reads)")
    try:
        return json.loads(proc.stdout)
    except ValueError as exc:
        raise UsageError(f"ansible-inventory -i {inventory} printed no JSON: {exc}") from None


def group_hosts(data: dict[str, Any], group: str, seen: set[str] | None = None) -> set[str]:
    """Every host of ``group`` and its child groups, however deep."""
    seen = seen if seen is not None else set()
    if group in seen or group not in data:
        return set()
    seen.add(group)
    entry = data[group] or {}
    hosts = set(entry.get("hosts") or [])
    for child in entry.get("children") or []:
        hosts |= group_hosts(data, child, seen)
    return hosts


def hostvars(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return (data.get("_meta") or {}).get("hostvars") or {}


def path_list(inventory: Path, document: dict[str, Any], variable: str, *,
              same_on_every_host: bool = False) -> list[Path]:
    """The absolute paths the hosts' ``variable`` names (a list of paths; relative ones against the
    inventory directory, as the roles resolve them: plugin_utils/site_data.py), each once, in order.
    ``same_on_every_host``: hosts naming different lists are an error (atlas_compat_extra_tables: the
    fleet is judged against one table, as preflight's gate does)."""
    site = plugin_utils("site_data")
    values = {name: hv.get(variable) or [] for name, hv in sorted(hostvars(document).items())}
    if same_on_every_host and len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
        listed = ", ".join(f"{name}: {json.dumps(v, default=str)}" for name, v in values.items())
        raise UsageError(f"inventory {inventory}: {variable} differs between hosts ({listed})",
                         fix=f"set {variable} once, in group_vars/all")
    found: list[Path] = []
    for name, value in values.items():
        try:
            paths = site.resolve_paths(value, variable, str(inventory))
        except site.SiteDataError as exc:
            raise UsageError(f"inventory {inventory}, host {name}: {exc}") from None
        found += [Path(p) for p in paths if Path(p) not in found]
    return found


def as_bool(value: Any) -> bool:
    """Ansible's truthiness of an inventory value (true/yes/on/1)."""
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "on", "1", "y")
    return bool(value)


@dataclasses.dataclass(frozen=True)
class Target:
    """A host and how to reach it over SSH, from its inventory variables."""

    name: str
    address: str
    user: str
    port: int
    key_file: str | None
    known_hosts: tuple[str, ...]
    # ansible_ssh_common_args and ansible_ssh_extra_args as the inventory gives them (ProxyJump, ...)
    common_args: str = ""
    # where the host keeps the suite's files (its inventory's node layout: roles/layout), for doctor
    layout: Layout = dataclasses.field(default_factory=default_layout)
    # ansible_become: a user other than root reaches root through sudo (bundle push writes as root)
    become: bool = False

    @property
    def remote(self) -> str:
        return f"{self.user}@{self.address}"

    def ssh_argv(self) -> list[str]:
        """The OpenSSH client command (rsync's --rsh): strict host keys first, so no option after it
        can relax them (ssh takes the first value of an option), then the inventory's own options."""
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-p", str(self.port)]
        if self.key_file:
            argv += ["-i", self.key_file]
        return argv + shlex.split(self.common_args)


def _ssh_options(common_args: str) -> dict[str, str]:
    """``-o Key=Value`` / ``-oKey=Value`` / ``-o Key Value`` pairs of an ssh argument string (keys lower-case)."""
    tokens = shlex.split(common_args or "")
    options: dict[str, str] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        text = None
        if token == "-o" and index + 1 < len(tokens):
            text, index = tokens[index + 1], index + 1
        elif token.startswith("-o") and len(token) > 2:
            text = token[2:]
        if text:
            key, sep, value = text.partition("=")
            if not sep:
                key, _, value = text.partition(" ")
            options[key.strip().lower()] = value.strip()
        index += 1
    return options


def target(name: str, hv: dict[str, Any]) -> Target:
    """The SSH settings of host ``name`` (``hv``: its inventory variables); an inventory that turns host
    key checking off is refused."""
    common = " ".join(str(hv.get(k) or "") for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args")).strip()
    options = _ssh_options(common)
    if options.get("stricthostkeychecking", "yes").lower() in ("no", "off"):
        raise UsageError(f"{name}: the inventory turns host key checking off (StrictHostKeyChecking=no)",
                         fix="pin the hosts' keys in a known_hosts file (UserKnownHostsFile=...) and drop the option")
    known = tuple(options["userknownhostsfile"].split()) if "userknownhostsfile" in options \
        else (DEFAULT_KNOWN_HOSTS,)
    return Target(
        name=name,
        address=str(hv.get("ansible_host") or name),
        user=str(hv.get("ansible_user") or hv.get("ansible_ssh_user") or "root"),
        port=int(hv.get("ansible_port") or hv.get("ansible_ssh_port") or 22),
        key_file=hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file"),
        known_hosts=tuple(str(Path(p).expanduser()) for p in known),
        common_args=common,
        layout=Layout.of(hv),
        become=as_bool(hv.get("ansible_become", False)),
    )


def targets_from_listing(listing_doc: dict[str, Any], group: str = SERVING_GROUP) -> list[Target]:
    """The ``group`` members of an ``ansible-inventory --list`` document, sorted by name."""
    hvars = hostvars(listing_doc)
    return [target(name, hvars.get(name) or {}) for name in sorted(group_hosts(listing_doc, group))]


def targets(inventory: Path, limit: str | None = None, group: str = SERVING_GROUP,
            document: dict[str, Any] | None = None) -> list[Target]:
    """The SSH targets of ``group`` (narrowed by ``limit``; ``document``: a --list output already read);
    none is an error that names the inventory."""
    found = targets_from_listing(document if document is not None else listing(inventory, limit), group)
    if not found:
        raise UsageError(f"inventory {inventory} has no host in group {group}"
                         + (f" matching --limit {limit}" if limit else ""),
                         fix=f"put the serving nodes in group {group}, or widen --limit")
    return found
