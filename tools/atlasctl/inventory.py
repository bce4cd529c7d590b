"""Reading an Ansible inventory the way Ansible does: ``ansible-inventory -i INV --list``.

One place for running it, walking its groups, reading the inventory's own data (``path_list``:
serving_profile_dirs, atlas_compat_extra_tables) and turning a host's variables into its SSH settings
(``Target``): doctor and the rollout's SLO bench (OpenSSH) and bundle push (rsync over ssh) connect with
the same settings and the same refusals. Host key checking stays on: an inventory that turns it off is refused, and the
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

from ansible_collections.atlas.serving.plugins.module_utils import names as _NAMES

from atlasctl.errors import EnvironmentProblem, UsageError
from atlasctl.inputs import compose_yaml, parse_yaml, read_text, shown
from atlasctl.layout import Layout, default_layout

SERVING_GROUP = "atlas_nodes"
BUNDLE_DIR_VAR = "atlas_bundle_dir"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
INVENTORY_FIX = "fix the inventory (ansible-inventory -i INV --graph shows what it reads)"
# Ansible reads these as YAML (its yaml inventory plugin's and vars loader's extensions; a vars file may have none).
_YAML_SUFFIXES = (".yml", ".yaml", ".json")
_VARS_DIRS = ("group_vars", "host_vars")


def listing(inventory: Path, limit: str | None = None) -> dict[str, Any]:
    """The ``--list`` document (groups, and host vars under ``_meta``), narrowed by ``limit``. A source or vars
    file Ansible cannot read is an error naming the file (and for YAML, the line), not an inventory without hosts."""
    beside = Path(sys.executable).parent / "ansible-inventory"
    exe = str(beside) if beside.is_file() else shutil.which("ansible-inventory")
    if exe is None:
        raise EnvironmentProblem("ansible-inventory is not on PATH", fix="activate the controller virtualenv (.venv)")
    argv = [exe, "-i", str(inventory), "--list"] + (["--limit", limit] if limit else [])
    # Every host variable (keys included) is in this output: never into an Ansible log file.
    env = {**os.environ, "ANSIBLE_LOG_PATH": "/dev/null", "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120, env=env)
    if proc.returncode != 0:  # a source Ansible cannot parse is only a warning; a vars file is an error
        for path in _vars_files(inventory):
            _check_yaml(path)
        raise UsageError(f"ansible-inventory -i {inventory} failed: {_one_line(proc.stderr)}", fix=INVENTORY_FIX)
    for path in _unparsed(inventory, proc.stderr):
        if path.suffix in _YAML_SUFFIXES:
            _check_yaml(path)
        raise UsageError(f"inventory file {shown(path)}: ansible-inventory cannot read it as an inventory source",
                         fix=f"fix or remove it (ansible-inventory -i {shown(path)} --list says why)")
    try:
        document = json.loads(proc.stdout)
    except ValueError as exc:
        raise UsageError(f"ansible-inventory -i {inventory} printed no JSON: {exc}") from None
    if not isinstance(document, dict):
        raise UsageError(f"ansible-inventory -i {inventory} printed {type(document).__name__}, not a mapping")
    return document


def _sources(inventory: Path) -> list[Path]:
    """The files an inventory source stands for: itself, or every file under the directory (not the vars
    directories, nor hidden entries), sorted."""
    if not inventory.is_dir():
        return [inventory]
    found = []
    for root, dirs, names in os.walk(inventory):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _VARS_DIRS)
        found += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
    return found


def _vars_files(inventory: Path) -> list[Path]:
    """The group_vars/host_vars files beside an inventory source that Ansible reads as YAML, sorted."""
    base = inventory if inventory.is_dir() else inventory.parent
    found = []
    for name in _VARS_DIRS:
        for root, dirs, names in os.walk(base / name):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [Path(root) / n for n in sorted(names)
                      if not n.startswith(".") and Path(n).suffix in (*_YAML_SUFFIXES, "")]
    return found


def _squash(text: str) -> str:
    """``text`` without whitespace: Ansible wraps its warnings (ansible-core 2.16: at 79 columns, inside a path)."""
    return "".join(text.split())


def _unparsed(inventory: Path, stderr: str) -> list[Path]:
    """The inventory's source files Ansible warned it could not parse (it goes on without them)."""
    said = _squash(stderr)
    if "Unabletoparse" not in said:
        return []
    return [path for path in _sources(inventory) if path.is_file()
            and any(_squash(f"Unable to parse {name} as an inventory source") in said
                    for name in (path, path.resolve()))]


def _check_yaml(path: Path) -> None:
    """A YAML file of the inventory whose syntax is wrong: the UsageError naming it, the line and the problem."""
    parse_yaml(read_text(path, "inventory file"), f"inventory file {shown(path)}", load=compose_yaml,
               fix="correct the YAML there (ansible-inventory -i INV --graph shows what Ansible reads)")


def _one_line(text: str) -> str:
    """Ansible's error output as one line: its ERROR line, else its last line, whitespace collapsed."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    chosen = next((line for line in lines if line.startswith(("[ERROR]", "ERROR!"))), lines[-1] if lines else "")
    return " ".join(chosen.split())[:600] or "no message"


def group_hosts(data: dict[str, Any], group: str, seen: set[str] | None = None) -> set[str]:
    """Every host of ``group`` and its child groups, however deep."""
    seen = seen if seen is not None else set()
    if group in seen or group not in data:
        return set()
    seen.add(group)
    entry = _mapping(data[group], f"group {group!r}")
    hosts = set(_names(entry.get("hosts"), f"group {group!r}: hosts"))
    for child in _names(entry.get("children"), f"group {group!r}: children"):
        hosts |= group_hosts(data, child, seen)
    return hosts


def groups(data: dict[str, Any]) -> dict[str, list[str]]:
    """Every group and its hosts (child groups' included), in inventory order: Ansible's ``groups``."""
    def members(group: str, seen: set[str]) -> list[str]:
        if group in seen or group not in data:
            return []
        seen.add(group)
        entry = _mapping(data[group], f"group {group!r}")
        found = list(_names(entry.get("hosts"), f"group {group!r}: hosts"))
        for child in _names(entry.get("children"), f"group {group!r}: children"):
            found += [h for h in members(child, seen) if h not in found]
        return found

    return {name: members(name, set()) for name in data if name != "_meta"}


def hostvars(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    meta = _mapping(data.get("_meta"), "_meta")
    found = _mapping(meta.get("hostvars"), "_meta.hostvars")
    return {name: _mapping(hv, f"host {name!r}") for name, hv in found.items()}


def _mapping(value: Any, what: str) -> dict:
    """``value`` when it is a mapping (``None``: empty); else the listing is not what ansible-inventory prints."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"inventory listing: {what} is a {type(value).__name__}, not a mapping", fix=INVENTORY_FIX)
    return value


def _names(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"inventory listing: {what} is not a list of names", fix=INVENTORY_FIX)
    return value


def path_list(inventory: Path, document: dict[str, Any], variable: str, *,
              same_on_every_host: bool = False) -> list[Path]:
    """The absolute paths the hosts' ``variable`` names (a list of paths; relative ones against the
    inventory directory, as the roles resolve them: plugin_utils/site_data.py), each once, in order.
    ``same_on_every_host``: hosts naming different lists are an error (atlas_compat_extra_tables: the
    fleet is judged against one table, as preflight's gate does)."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import site_data as site

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
    # where the bundle is on the host (atlas_bundle_dir, as an absolute path; '' when not given so), for doctor
    bundle_dir: str = ""

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
    key checking off is refused, and so is a variable that cannot be what it names (a port, a host, ...)."""
    common = " ".join(_text(name, hv, k) for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args")).strip()
    try:
        options = _ssh_options(common)
    except ValueError as exc:  # shlex: an unclosed quote
        raise UsageError(f"inventory host {name!r}: ansible_ssh_common_args/ansible_ssh_extra_args {common!r} are "
                         f"not ssh arguments: {exc}", fix="close the quote (ssh reads them as a shell would)") from None
    if options.get("stricthostkeychecking", "yes").lower() in ("no", "off"):
        raise UsageError(f"{name}: the inventory turns host key checking off (StrictHostKeyChecking=no)",
                         fix="pin the hosts' keys in a known_hosts file (UserKnownHostsFile=...) and drop the option")
    known = tuple(options["userknownhostsfile"].split()) if "userknownhostsfile" in options \
        else (DEFAULT_KNOWN_HOSTS,)
    try:
        layout = Layout.of(hv)
    except UsageError as exc:
        raise UsageError(f"inventory host {name!r}: {exc}", fix=exc.fix) from None
    key_file = _word(name, hv, ("ansible_ssh_private_key_file", "ansible_private_key_file"), None, "a file name")
    return Target(
        name=name,
        address=address(name, hv),
        user=_word(name, hv, ("ansible_user", "ansible_ssh_user"), "root", "a user name"),
        port=_port(name, hv),
        key_file=key_file or None,
        known_hosts=tuple(str(Path(p).expanduser()) for p in known),
        common_args=common,
        layout=layout,
        become=as_bool(hv.get("ansible_become", False)),
        bundle_dir=bundle_dir(hv),
    )


def address(name: str, hv: dict[str, Any]) -> str:
    """Where host ``name`` is reached: its ``ansible_host``, else its inventory name; either a plain host name or
    address (module_utils/names.py, kind host: no template, blank, control character or path separator)."""
    key = _given(hv, ("ansible_host",))
    value = hv[key] if key else name
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    where = f"inventory host {name!r}: {key}" if key else "inventory host name"
    hint = " (atlasctl reads the inventory as ansible-inventory --list prints it: a template is never rendered)"
    try:
        return _NAMES.check(text, "host", where)
    except _NAMES.BadName as exc:
        templated = isinstance(text, str) and _NAMES.template_delimiter(text)
        raise UsageError(f"{exc}{hint if templated else ''}",
                         fix=f"set ansible_host to the host's plain name or address: {exc.rule}") from None


def bundle_dir(hv: dict[str, Any]) -> str:
    """The host's ``atlas_bundle_dir`` when it is a plain absolute path (not a template), else ''."""
    value = hv.get(BUNDLE_DIR_VAR)
    ok = isinstance(value, str) and value.startswith("/") and value.isprintable() and "{{" not in value
    return (value.rstrip("/") or "/") if ok else ""


def _given(hv: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` the host sets (to something other than nothing or an empty string)."""
    return next((key for key in keys if hv.get(key) is not None and hv.get(key) != ""), None)


def _text(name: str, hv: dict[str, Any], key: str) -> str:
    value = hv.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UsageError(f"inventory host {name!r}: {key} is a {type(value).__name__}, not a string",
                         fix=f"write {key} as one string of ssh arguments, e.g. '-o ProxyJump=bastion'")
    return value


def _word(name: str, hv: dict[str, Any], keys: tuple[str, ...], default: str | None, what: str) -> str:
    """One word for ssh's command line (a host, a user, a key file): printable, no blank, not an option;
    ``default`` None: optional ('' when the host sets none of ``keys``)."""
    key = _given(hv, keys)
    if key is None and default is None:
        return ""
    value = default if key is None else hv[key]
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not text or not text.isprintable() or any(c.isspace() for c in text) or text.startswith("-") \
            or _NAMES.unsafe_text(text):
        where = key or "the inventory name"
        hint = " (a template: atlasctl reads the inventory as ansible-inventory --list prints it, unrendered)" \
            if _NAMES.template_delimiter(text) else ""
        raise UsageError(f"inventory host {name!r}: {where} {value!r} is not {what}{hint}",
                         fix=f"set {keys[0]} to plain text: one word without blanks or control characters, "
                             "not starting with '-'")
    return text


def _port(name: str, hv: dict[str, Any]) -> int:
    """The host's SSH port (ansible_port, else ansible_ssh_port, else 22): a whole number from 1 to 65535."""
    key = _given(hv, ("ansible_port", "ansible_ssh_port"))
    if key is None:
        return 22
    value = hv[key]
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise UsageError(f"inventory host {name!r}: {key} {value!r} is not a TCP port (a whole number from 1 to "
                         "65535)", fix=f"set {key} to the host's SSH port in the inventory, e.g. `{key}: 22`")
    return int(text)


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
