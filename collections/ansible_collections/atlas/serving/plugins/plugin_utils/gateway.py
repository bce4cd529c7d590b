# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The branch gateway as the one door to its engines (docs/security.md): the API keys it enforces and the
paths it forwards, rendered for nginx.

Controller only (the atlas.serving filters ``gateway_keys_map`` and ``gateway_paths``).

The keys are those the branch's serving nodes accept (``serving_api_keys``, else ``serving_api_key``), so a
rotation with overlap (``[new, previous]``) is accepted at the gateway while it is accepted at the engines.
They go into an nginx ``map`` include file (0600, root) matched against the whole ``Authorization`` header;
a key with a character outside RFC 6750's ``b64token`` (``A-Z a-z 0-9 - . _ ~ + /``, then ``=`` padding) is
refused, since the file quotes it for nginx.
"""

from __future__ import annotations

import ipaddress
import re

# RFC 6750, section 2.1: b64token = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
# An OpenAI-compatible path the engines serve (vLLM's and SGLang's HTTP servers: /v1/...).
_API_PATH = re.compile(r"/v1(/[a-z0-9_-]+)+")
DEFAULT_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/models")


class GatewayError(ValueError):
    """A bad input: the message names the variable and the fix."""


def keys_map(keys, allow_none=False, branch=""):
    """The body of the branch's key ``map`` (nginx): ``default 0;`` and one line per accepted key, or
    ``default 1;`` (every request passes) for a branch without a key when ``allow_none``."""
    keys = list(keys or [])
    where = f"branch {branch}: " if branch else ""
    if not keys:
        if not allow_none:
            raise GatewayError(
                f"{where}no API key: none of the branch's serving nodes sets serving_api_key (or serving_api_keys), "
                "so the gateway would serve anyone. Set serving_api_key (vault it) for the branch, or "
                "gateway_allow_no_api_key: true to serve without a key (not for production)")
        return "# no API key configured (gateway_allow_no_api_key): every request passes\ndefault 1;\n"
    bad = [i for i, key in enumerate(keys) if not isinstance(key, str) or not _B64TOKEN.fullmatch(key)]
    if bad:
        raise GatewayError(
            f"{where}API key number {bad[0] + 1} of the branch has a character a bearer token cannot carry: use "
            "letters, digits and - . _ ~ + / only, with = padding at the end (RFC 6750 b64token)")
    lines = ["default 0;"] + [f'"Bearer {key}" 1;' for key in dict.fromkeys(keys)]
    return "\n".join(lines) + "\n"


def paths(extra=(), records=()):
    """The paths the gateway forwards: DEFAULT_PATHS, then ``extra`` (gateway_extra_paths) and each service
    record's ``api_paths`` (a serving profile's own), each once, in order."""
    out = list(DEFAULT_PATHS)
    sources = [("gateway_extra_paths", extra)] + [(f"{name}: the serving profile's api_paths", record.get("api_paths"))
                                                  for name, record in records if isinstance(record, dict)]
    for where, listed in sources:
        if listed in (None, ""):
            continue
        if isinstance(listed, str) or not isinstance(listed, (list, tuple)):
            raise GatewayError(f"{where} must be a list of paths such as /v1/embeddings, got {listed!r}")
        for path in listed:
            if not isinstance(path, str) or not _API_PATH.fullmatch(path):
                raise GatewayError(f"{where}: {path!r} is not an API path the gateway can forward: name one "
                                   "OpenAI-compatible path such as /v1/embeddings (lower case, no query, no pattern)")
            if path not in out:
                out.append(path)
    return out


def keys_problem(keys, allow_none=False, branch=""):
    """'' where :func:`keys_map` accepts ``keys``, else its refusal (which never names a key)."""
    try:
        keys_map(keys, allow_none=allow_none, branch=branch)
    except GatewayError as exc:
        return str(exc)
    return ""


def trusted_sources(monitoring, extra=()):
    """The networks told which backend served a request (nginx ``geo``): each monitoring host's address
    (``(name, ansible_host)`` pairs) and ``extra`` (gateway_backend_header_sources), as addresses or CIDRs."""
    out = []
    for where, value in [(f"monitoring host {name}: ansible_host", addr) for name, addr in monitoring] + \
            [("gateway_backend_header_sources", v) for v in (extra or [])]:
        try:
            network = ipaddress.ip_network(str(value), strict=False)
        except ValueError:
            raise GatewayError(f"{where}: {value!r} is not an IP address or network; the gateway tells which "
                               "backend served a request only to addresses (set ansible_host to the host's "
                               "address, or list addresses/CIDRs)") from None
        if str(network) not in out:
            out.append(str(network))
    return out
