"""Live figures from an inventory's Prometheus (docs/monitoring.md): p95 TTFT and TPOT, KV cache use and requests
running per node, through Prometheus's HTTP API (``/api/v1/query``).

The figures are the monitoring stage's recording rules, read as data from the suite
(``roles/monitoring/files/atlas-rules.yml``) and evaluated as expressions, over a window of the caller's
(the rules' own is 5 minutes) and at a time of the caller's: so they work against any Prometheus that scrapes
the fleet with the stage's labels, and one definition serves the rules, ``atlasctl health``, ``atlasctl live``
and the rollout's SLO gate. Where Prometheus is: ``monitoring_prometheus_url``, else the first host of group
``monitoring`` (plugin_utils/monitoring.py, shared with the roles). A Prometheus that does not answer is a
note in the result, not an exception: the caller's own work goes on.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import math
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from atlasctl import inventory as inv
from atlasctl.errors import AtlasError, UsageError
from atlasctl.paths import suite_root

RULE_WINDOW = "5m"
_WINDOW = re.compile(r"[1-9][0-9]*[smhd]")  # fullmatch
# (key, the recording rule, how it is aggregated per node, scale, column title, cell format)
FIGURES = (
    ("ttft_p95_ms", "atlas:engine_ttft_seconds:p95_5m", "max", 1000.0, "TTFT p95", "{:.0f}ms"),
    ("tpot_p95_ms", "atlas:engine_tpot_seconds:p95_5m", "max", 1000.0, "TPOT p95", "{:.0f}ms"),
    ("kv_cache_pct", "atlas:engine_kv_cache_usage:ratio", "max", 100.0, "KV", "{:.0f}%"),
    ("requests_running", "atlas:engine_requests_running:sum", "sum", 1.0, "RUN", "{:.0f}"),
)
# The probes ask Prometheus directly: proxy variables of the controller's environment never apply.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(AtlasError):
    """Prometheus did not answer, or answered with an error: the message names the URL and the query."""


def rules_file() -> Path:
    return suite_root() / "roles/monitoring/files/atlas-rules.yml"


@functools.cache
def recording_rules() -> dict[str, str]:
    """{recorded name: expression} of the suite's rules."""
    doc = yaml.safe_load(rules_file().read_text(encoding="utf-8"))
    return {r["record"]: " ".join(str(r["expr"]).split()) for g in doc["groups"] for r in g["rules"] if "record" in r}


def expression(record: str, window: str = RULE_WINDOW) -> str:
    """The expression of recording rule ``record`` over ``window`` (a Prometheus duration, e.g. 10m) instead of
    the rule's own 5 minutes."""
    if not _WINDOW.fullmatch(str(window)):
        raise UsageError(f"window {window!r} is not a Prometheus duration", fix="use e.g. 5m, 90s or 1h")
    return recording_rules()[record].replace(f"[{RULE_WINDOW}]", f"[{window}]")


@dataclasses.dataclass(frozen=True)
class Access:
    """How to reach a Prometheus (docs/security.md): its URL, the CA its certificate is checked against (None:
    the system's), and the API user and the file on this machine holding its password (None: no password)."""

    url: str
    ca_file: str | None = None
    user: str | None = None
    password_file: str | None = None

    @classmethod
    def of(cls, found: dict[str, Any]) -> Access:
        """From plugin_utils/monitoring.py's ``prometheus_access`` (the inventory's names)."""
        return cls(str(found.get("url") or ""), found.get("ca_file") or None, found.get("user") or None,
                   found.get("password_file") or None)

    def headers(self) -> dict[str, str]:
        if not self.password_file:
            return {}
        try:
            password = Path(self.password_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"{self.password_file}: the password of Prometheus's user {self.user} cannot be read "
                             f"({exc.strerror})", fix="check monitoring_api_password_file names a readable file "
                                                     "on this machine") from None
        token = base64.b64encode(f"{self.user or ''}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def opener(self) -> urllib.request.OpenerDirector:
        if not self.url.startswith("https://"):
            return _OPENER
        try:
            context = ssl.create_default_context(cafile=self.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"{self.ca_file}: not a CA certificate file ({exc})",
                             fix="check atlas_tls_ca_file names the site CA's PEM file on this machine") from None
        return urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                           urllib.request.HTTPSHandler(context=context))


def _access(where: str | Access) -> Access:
    return where if isinstance(where, Access) else Access(str(where))


def query(where: str | Access, promql: str, at: float | None = None, timeout: float = 5.0,
          opener: urllib.request.OpenerDirector | None = None) -> list[tuple[dict[str, str], float]]:
    """An instant query (at ``at``, unix seconds; None: now) -> [(labels, value)] of its vector. ``where``: the
    URL, or how to reach it (:class:`Access`: its CA and the API user's password)."""
    access = _access(where)
    url = access.url
    params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
    target = urllib.request.Request(f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode(params)}",
                                    headers=access.headers())
    try:
        with (opener or access.opener()).open(target, timeout=timeout) as response:
            doc = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            doc = json.loads(exc.read())
        except ValueError:
            raise PrometheusError(f"Prometheus at {url} answered HTTP {exc.code} to {promql[:80]!r}") from None
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {url} did not answer: {exc}",
                              fix="check that it runs (playbooks/monitoring.yml) and this machine reaches it") from None
    if doc.get("status") != "success":
        raise PrometheusError(f"Prometheus at {url} refused {promql[:80]!r}: {doc.get('error', doc)}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"Prometheus at {url} answered a {data.get('resultType')} to {promql[:80]!r}, "
                              "not a vector")
    return [(dict(item["metric"]), float(item["value"][1])) for item in data.get("result", [])]


@dataclasses.dataclass(frozen=True)
class Live:
    """Figures per node (``FIGURES`` keys, None where Prometheus has no value), or why there are none."""

    url: str
    window: str
    at: float | None
    nodes: dict[str, dict[str, float | None]]
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def live(where: str | Access, window: str = RULE_WINDOW, at: float | None = None,
         query_fn: Callable[..., list[tuple[dict[str, str], float]]] = query) -> Live:
    """Every figure of ``FIGURES`` per node, over ``window`` ending at ``at``. Prometheus not answering: ``error``."""
    access = _access(where)
    url = access.url
    nodes: dict[str, dict[str, float | None]] = {}
    try:
        for key, record, how, scale, _title, _cell in FIGURES:
            for labels, value in query_fn(access, f"{how} by (node) ({expression(record, window)})", at):
                figures = nodes.setdefault(labels.get("node", "?"), {k: None for k, *_ in FIGURES})
                figures[key] = None if math.isnan(value) or math.isinf(value) else value * scale
    except PrometheusError as exc:
        return Live(url, window, at, {}, exc.render())
    return Live(url, window, at, dict(sorted(nodes.items())))


def cells(figures: dict[str, float | None] | None) -> dict[str, str]:
    """The figures of one node as table cells ('-' where there is none)."""
    figures = figures or {}
    return {key: "-" if figures.get(key) is None else cell.format(figures[key]) for key, *_, cell in FIGURES}


def columns() -> list[tuple[str, str]]:
    return [(key, title) for key, _rule, _how, _scale, title, _cell in FIGURES]


def access_of(document: dict[str, Any]) -> Access:
    """How to reach the inventory's Prometheus, from an ``ansible-inventory --list`` document (url '' none): a
    host's ``monitoring_prometheus_url`` (group_vars/all), else the first host of group ``monitoring``, with the
    CA and the API user's password file the inventory names."""
    from ansible_collections.atlas.serving.plugins.plugin_utils import monitoring as mon

    hostvars = inv.hostvars(document)
    explicit = next((hv[mon.URL_VAR] for _, hv in sorted(hostvars.items()) if hv.get(mon.URL_VAR)), "")
    group = document.get(mon.MONITORING_GROUP) or {}
    hosts = list(group.get("hosts") or []) or sorted(inv.group_hosts(document, mon.MONITORING_GROUP))
    try:
        return Access.of(mon.prometheus_access(explicit, hosts, hostvars))
    except mon.MonitoringError as exc:
        raise UsageError(str(exc)) from None


def url_of(document: dict[str, Any]) -> str:
    """Where the inventory's Prometheus is ('' none): :func:`access_of`'s URL."""
    return access_of(document).url


def for_inventory(inventory: Path, window: str = RULE_WINDOW, at: float | None = None,
                  query_fn: Callable[..., list[tuple[dict[str, str], float]]] = query) -> Live | None:
    """The live figures of an inventory's fleet; None when the inventory names no Prometheus."""
    access = access_of(inv.listing(inventory))
    return live(access, window, at, query_fn) if access.url else None
