"""Hosts and their SSH settings from ``ansible-inventory -i INV --list``; SSH through fabric.

Host key checking stays on: the known_hosts files the inventory names
(``-o UserKnownHostsFile=...`` in ``ansible_ssh_common_args``), else the user's, are loaded
into paramiko with ``RejectPolicy``: an unknown or changed host key refuses the host.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

from atlasctl import inventory as shared
from atlasctl.errors import EnvironmentProblem, UsageError
from atlasctl.layout import DEFAULT, Layout

SERVING_GROUP = shared.SERVING_GROUP
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    address: str
    user: str
    port: int
    key_file: str | None
    known_hosts: tuple[str, ...]
    # The node layout its inventory variables give (roles/layout): where doctor reads.
    layout: Layout = DEFAULT


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


def target(name: str, hostvars: dict[str, Any]) -> Target:
    options = _ssh_options(" ".join(str(hostvars.get(k) or "") for k in
                                    ("ansible_ssh_common_args", "ansible_ssh_extra_args")))
    if options.get("stricthostkeychecking", "yes").lower() in ("no", "off"):
        raise UsageError(f"{name}: the inventory turns host key checking off (StrictHostKeyChecking=no)",
                         fix="pin the hosts' keys in a known_hosts file (UserKnownHostsFile=...) and drop the option")
    known = tuple(options["userknownhostsfile"].split()) if "userknownhostsfile" in options \
        else (DEFAULT_KNOWN_HOSTS,)
    return Target(
        name=name,
        address=str(hostvars.get("ansible_host") or name),
        user=str(hostvars.get("ansible_user") or hostvars.get("ansible_ssh_user") or "root"),
        port=int(hostvars.get("ansible_port") or hostvars.get("ansible_ssh_port") or 22),
        key_file=hostvars.get("ansible_ssh_private_key_file") or hostvars.get("ansible_private_key_file"),
        known_hosts=tuple(str(Path(p).expanduser()) for p in known),
        layout=Layout.of(hostvars),
    )


def targets_from_listing(listing: dict[str, Any], group: str = SERVING_GROUP) -> list[Target]:
    """The ``group`` members of an ``ansible-inventory --list`` document, sorted by name."""
    hvars = shared.hostvars(listing)
    names = shared.group_hosts(listing, group)
    return [target(name, hvars.get(name) or {}) for name in sorted(names)]


def load(inventory: Path, limit: str | None = None, group: str = SERVING_GROUP,
         listing: dict[str, Any] | None = None) -> list[Target]:
    listing = listing if listing is not None else shared.listing(inventory, limit)
    found = targets_from_listing(listing, group)
    if not found:
        raise UsageError(f"inventory {inventory} has no host in group {group}"
                         + (f" matching --limit {limit}" if limit else ""),
                         fix=f"put the serving nodes in group {group}, or widen --limit")
    return found


def fabric_run(t: Target, command: str, timeout: float = 90.0) -> str:
    """Run ``command`` (bash) on ``t`` with strict host keys; its stdout (stderr is merged by the script)."""
    from fabric import Connection
    from paramiko import RejectPolicy

    kwargs: dict[str, Any] = {"look_for_keys": t.key_file is None, "allow_agent": t.key_file is None,
                              "banner_timeout": 15, "auth_timeout": 15}
    if t.key_file:
        kwargs["key_filename"] = [str(Path(t.key_file).expanduser())]
    conn = Connection(t.address, user=t.user, port=t.port, connect_timeout=10, connect_kwargs=kwargs)
    loaded = 0
    for path in t.known_hosts:
        if Path(path).is_file():
            conn.client.load_host_keys(path)
            loaded += 1
    if not loaded:
        raise EnvironmentProblem(f"{t.name}: no known_hosts file among {', '.join(t.known_hosts)}",
                                 fix="pin the host keys (ssh-keyscan, checked out of band) in the file the "
                                     "inventory names with -o UserKnownHostsFile=")
    conn.client.set_missing_host_key_policy(RejectPolicy())
    try:
        result = conn.run("bash -c " + shlex.quote(command), hide=True, warn=True, in_stream=False,
                          timeout=timeout)
    finally:
        conn.close()
    return result.stdout
