"""Filters of the atlas.serving collection.

``engine_argv``  a profile's flag dict -> the engine's argv list
``env_lines``    an environment dict -> sorted ``KEY=value`` lines for a systemd EnvironmentFile
``fleet_table``  play hosts + hostvars -> the fleet health table (list of lines)
``manifest_sha256``   a bundle's manifest.json (parsed) -> {path: sha256}; a zip's members as ``<zip>!<member>``
``trusted_manifest_problem``  a manifest slurped from a node, the verified sha256, its path -> '' or the refusal
``api_keys``     serving_api_keys (list, current first) or serving_api_key (one) -> the keys, current first
``engine_url``   a service record -> the engine's base URL from its own node (the address it listens on)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils.engine_lint import ENV_NAME, FLAG_NAME
from ansible_collections.atlas.serving.plugins.module_utils.manifest import ManifestError, sha256_index
from ansible_collections.atlas.serving.plugins.module_utils.progress import local_url
from ansible_collections.atlas.serving.plugins.module_utils.signature import check_trusted_sha256


def engine_argv(flags: dict, positional: list | None = None) -> list[str]:
    """Turn ``{'--max-model-len': 2048, '--enable-chunked-prefill': True}`` into argv.

    True -> bare flag; False/None -> omitted; list -> flag repeated per value is NOT
    assumed: lists become one flag followed by each value (argparse ``nargs``);
    dict -> compact JSON (``--additional-config``). Keys keep their order.
    """
    import json

    if not isinstance(flags, dict):
        raise AnsibleFilterError(f"engine_argv expects a dict of flags, got {type(flags).__name__}")
    argv = [str(p) for p in (positional or [])]
    for flag, value in flags.items():
        if not isinstance(flag, str) or not FLAG_NAME.fullmatch(flag):
            raise AnsibleFilterError(
                f"engine flag {flag!r} is not of the form --lower-case-name; "
                "write flags as the engine's CLI spells them"
            )
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        elif isinstance(value, list | tuple):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


def env_lines(env: dict) -> list[str]:
    """Render an environment dict as sorted ``KEY=value`` lines (systemd EnvironmentFile syntax)."""
    if not isinstance(env, dict):
        raise AnsibleFilterError(f"env_lines expects a dict, got {type(env).__name__}")
    lines = []
    for key in sorted(env):
        value = env[key]
        if not ENV_NAME.fullmatch(str(key)):
            raise AnsibleFilterError(f"environment variable name {key!r} is not valid")
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if "\n" in text:
            raise AnsibleFilterError(f"environment variable {key} has a newline in its value")
        if re.search(r"[\s\"'\\$]", text):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{key}={text}")
    return lines


def manifest_sha256(manifest: dict, source: str = "manifest.json") -> dict[str, str]:
    """A bundle's manifest.json, parsed -> {path: sha256}, read as ``atlasctl bundle verify`` reads it
    (module_utils/manifest.py ``sha256_index``)."""
    try:
        return sha256_index(manifest, source)
    except ManifestError as exc:
        raise AnsibleFilterError(f"{exc}: the bundle is damaged; rebuild it or copy it again") from None


def trusted_manifest_problem(content: str, expected: str, path: str) -> str:
    """'' when a manifest read from a node (``slurp`` content, base64) is the one whose signature
    was verified, else why not. The check is on the very bytes the stage then parses."""
    try:
        data = base64.b64decode(str(content), validate=True)
    except (binascii.Error, ValueError):
        return f"{path}: the content read from the node is not base64 (not a slurp result)"
    return check_trusted_sha256(hashlib.sha256(data).hexdigest(), str(expected or ""), str(path))


FLEET_COLUMNS = (
    ("host", "NODE"),
    ("branch", "BRANCH"),
    ("release", "RELEASE"),
    ("engine", "ENGINE"),
    ("service", "SERVICE"),
    ("health", "/health"),
    ("model", "MODEL"),
    ("hbm", "HBM"),
    ("npu", "NPU"),
)


def table_lines(rows: list[dict], columns=FLEET_COLUMNS) -> list[str]:
    """Left-aligned text table; missing cells print as '-'. Shared with `atlasctl health`."""
    cells = [[str(row.get(key, "-")) for key, _title in columns] for row in rows]
    widths = [max([len(title)] + [len(c[i]) for c in cells]) for i, (_key, title) in enumerate(columns)]
    lines = ["  ".join(title.ljust(w) for (_key, title), w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return lines


def fleet_table(hosts: list, hostvars) -> list[str]:
    """One row per play host from its ``health_report`` fact; hosts without one say so."""
    rows = []
    for host in hosts:
        report = dict(hostvars[host].get("health_report") or {})
        report.setdefault("host", host)
        report.setdefault("service", "no report")
        rows.append(report)
    return table_lines(rows)


def api_keys(keys, key: str = "") -> list[str]:
    """The API keys an engine accepts, the current one first: ``serving_api_keys`` when it lists
    any (a rotation: ``[new, previous]``), else ``[serving_api_key]``, else none."""
    if keys in (None, "", []):
        keys = [key] if key else []
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise AnsibleFilterError("serving_api_keys must be a list of keys, the current one first "
                                 "(e.g. [new, previous] during a rotation)")
    bad = [i for i, k in enumerate(keys) if not isinstance(k, str) or not k or any(c.isspace() for c in k)]
    if bad:
        raise AnsibleFilterError(f"serving_api_keys[{bad[0]}] is not a key: each key is a non-empty string "
                                 "without spaces")
    if len(set(keys)) != len(keys):
        raise AnsibleFilterError("serving_api_keys lists the same key twice")
    return list(keys)


def engine_url(record) -> str:
    """The engine's base URL as its own node reaches it (module_utils/progress.py, ``local_url``)."""
    try:
        return local_url(record)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"engine_url: a service record with a port is needed, got {record!r} "
                                 f"({exc})") from None


class FilterModule:
    def filters(self):
        return {
            "engine_argv": engine_argv,
            "env_lines": env_lines,
            "fleet_table": fleet_table,
            "manifest_sha256": manifest_sha256,
            "trusted_manifest_problem": trusted_manifest_problem,
            "api_keys": api_keys,
            "engine_url": engine_url,
        }
