"""Parsers of the evidence sections (pure: text in, data out)."""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
from typing import Any

from ansible_collections.atlas.serving.plugins.module_utils import engine_lint, npu_smi

from atlasctl.doctor.model import Evidence

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOURNAL_LINE = re.compile(r"^(?P<ts>\d+(?:\.\d+)?)\s+(?P<rest>.*)$")


def record(ev: Evidence) -> dict[str, Any] | None:
    """The service record (atlas-serving.json) or None when absent or unreadable."""
    if not ev.ok("record"):
        return None
    try:
        data = json.loads(ev.text("record"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def env_file(text: str) -> dict[str, str]:
    """systemd EnvironmentFile lines -> {name: value}; quotes and backslash escapes undone."""
    env: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        name, value = line.split("=", 1)
        name = name.strip()
        if name.startswith("export "):
            name = name[len("export "):].strip()
        if not _ENV_NAME.match(name):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            try:
                value = shlex.split(value)[0] if value[0] == "'" else json.loads(value)
            except ValueError:
                value = value[1:-1]
        env[name] = value
    return env


def argv(text: str) -> list[str]:
    """The rendered args file (one argument per line, ``#`` lines skipped, as the launcher reads it)."""
    return engine_lint.args_file_argv(text)


def flag(args: list[str], *names: str) -> str | None:
    """Value of the last of ``names`` in ``args`` (``--x v`` or ``--x=v``)."""
    found = None
    for index, token in enumerate(args):
        name, eq, inline = token.partition("=")
        if name in names:
            if eq:
                found = inline
            elif index + 1 < len(args):
                found = args[index + 1]
    return found


def key_values(text: str) -> dict[str, str]:
    """``Key=Value`` lines (systemctl show, /proc environ) -> dict, keys as written."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def version_files(text: str) -> dict[str, dict[str, str]]:
    """``== <path>`` headers followed by the file -> {path: key=value record (lower-case keys)}."""
    from ansible_collections.atlas.serving.plugins.module_utils import cann

    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("== "):
            current = files.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return {path: cann.parse_key_values("\n".join(lines)) for path, lines in files.items()}


def versions(ev: Evidence) -> dict[str, str | None]:
    """driver, firmware and CANN toolkit versions from their version records."""
    files = version_files(ev.text("versions"))
    out: dict[str, str | None] = {"driver": None, "firmware": None, "cann": None, "cann_file": None}
    for path, rec in files.items():
        if path.endswith("/driver/version.info"):
            out["driver"] = rec.get("version")
        elif path.endswith("/firmware/version.info"):
            out["firmware"] = rec.get("version")
        elif path.endswith("ascend_toolkit_install.info") and out["cann"] is None:
            out["cann"], out["cann_file"] = rec.get("version"), path
    return out


def engine_of(args: list[str], rec: dict[str, Any] | None, engines_root: str) -> tuple[str, str]:
    """(engine, version) actually run: the venv in argv[0] (<engines_root>/<engine>-<version>/, the
    node layout), else the record's engine_release."""
    prefix = engines_root.rstrip("/") + "/"
    if args and args[0].startswith(prefix):
        name = args[0][len(prefix):].split("/", 1)[0]
        engine, _, version = name.rpartition("-")
        if engine and version:
            return engine, version
    release = str((rec or {}).get("engine_release") or "")
    engine, _, version = release.rpartition("-")
    return engine, version


def npu(ev: Evidence) -> dict[str, Any]:
    """``npu-smi info`` parsed by the collection's parser (devices, processes, version)."""
    return npu_smi.parse_info(ev.text("npu"))


def boards(ev: Evidence) -> list[dict[str, str]]:
    """``npu-smi info -t board -i <id>`` of every NPU (section ``board``: one print per NPU of ``npu-smi info -l``,
    each followed by a blank line), in order; [] when the section is absent or failed."""
    return npu_smi.parse_boards(ev.text("board")) if ev.ok("board") else []


_BOARD_FAILED = re.compile(r"^npu-smi info -t board -i (\d+) failed", re.M)


def boards_failed(ev: Evidence) -> list[int]:
    """The NPUs whose board the node could not read (the line the gather loop prints in its place)."""
    return [int(n) for n in _BOARD_FAILED.findall(ev.text("board"))] if ev.ok("board") else []


def board(ev: Evidence) -> dict[str, str]:
    """The first NPU's board: the running driver (Software Version) and firmware."""
    found = boards(ev)
    return next((b for b in found if "NPU ID" in b), found[0] if found else {})


def npu_procs(ev: Evidence) -> dict[str, Any] | None:
    """The node's scan (module_utils npu_procs run there): processes holding an NPU or running an engine."""
    scanned = json_section(ev, "npu_procs")
    return scanned if isinstance(scanned, dict) and isinstance(scanned.get("processes"), list) else None


def container(ev: Evidence) -> dict[str, Any] | None:
    """The serving container as ``podman inspect`` describes it (the section runs only where the record says
    runtime container), or None when absent, not inspected or malformed."""
    found = json_section(ev, "container")
    if isinstance(found, list) and len(found) == 1 and isinstance(found[0], dict):
        return found[0]
    return None


def is_container(ev: Evidence) -> bool:
    """The service record says the running release is a container release."""
    return (record(ev) or {}).get("runtime") == "container"


def json_section(ev: Evidence, name: str) -> Any:
    if not ev.ok(name):
        return None
    try:
        return json.loads(ev.text(name))
    except ValueError:
        return None


def hang(ev: Evidence) -> dict[str, Any] | None:
    """The hang section (two /metrics samples and the completion's outcome, as module_utils progress's
    ``observe`` returns them), or None when absent, skipped (no record, a non-head rank) or malformed."""
    seen = json_section(ev, "hang")
    if not isinstance(seen, dict) or not isinstance(seen.get("completion"), dict):
        return None
    completion = seen["completion"]
    numbers = [completion.get("seconds"), completion.get("deadline_s"), seen.get("window_s", 0.0)]
    for sample in (seen.get("before"), seen.get("after")):
        if sample is None:
            continue
        if not isinstance(sample, dict) or not all(isinstance(sample.get(k, {}), dict) for k in ("work", "progress")):
            return None
        numbers += [*sample.get("work", {}).values(), *sample.get("progress", {}).values()]
    return seen if all(_number(n) for n in numbers) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def journal(text: str) -> list[tuple[float | None, str]]:
    """``journalctl -o short-unix`` lines -> [(epoch seconds or None, line)]."""
    out: list[tuple[float | None, str]] = []
    for line in text.splitlines():
        match = _JOURNAL_LINE.match(line)
        out.append((float(match.group("ts")), match.group("rest")) if match else (None, line))
    return out


def visible_devices(env: dict[str, str]) -> list[int] | None:
    """ASCEND_RT_VISIBLE_DEVICES as ids; None when unset (all devices visible) or not a list of ids."""
    value = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        return None


def bundle(ev: Evidence) -> dict[str, Any] | None:
    """Section ``bundle``: {dir, manifest (bytes), signature (bytes or None)}; None when not gathered; with
    ``problem`` instead of the files when the node has none or they did not come back whole."""
    section = ev.section("bundle")
    if section is None:
        return None
    fields = dict(line.split(" ", 1) for line in section.text.splitlines() if " " in line)
    found: dict[str, Any] = {"dir": fields.get("dir", "?")}
    if section.rc != 0 or "manifest" not in fields:
        return {**found, "problem": section.text.strip().splitlines()[-1] if section.text.strip() else
                f"rc {section.rc}"}
    try:
        found["manifest"] = base64.b64decode(fields["manifest"], validate=True)
        found["signature"] = base64.b64decode(fields["signature"], validate=True) if "signature" in fields else None
    except (binascii.Error, ValueError):
        return {**found, "problem": "the manifest or its signature came back damaged"}
    return found


def stat_lines(text: str) -> list[tuple[str, str, str, str]]:
    """``stat -c '%n %a %U %G'`` lines -> (path, octal mode, owner, group); other lines skipped."""
    return [(parts[0], parts[1], parts[2], parts[3]) for parts in (line.split() for line in text.splitlines())
            if len(parts) == 4 and re.fullmatch(r"[0-7]{3,4}", parts[1])]
