# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Monitoring (docs/monitoring.md): what Prometheus scrapes, generated from the inventory, the SLO
thresholds its rules compare with, and where an inventory's Prometheus is.

Controller only (never shipped to a node). One implementation for the monitoring role (the atlas.serving
filters ``monitoring_targets``, ``monitoring_slo_rules``, ``monitoring_prometheus_url``), the rollout's SLO
gate and atlasctl (``health``, ``live``).

Scrape jobs (``JOBS``; the shipped rules, roles/monitoring/files/atlas-rules.yml, name them):

- ``atlas-engine``: every serving *entry* node's engine ``/metrics`` at the port of its service record (a
  non-head rank of a multi-node instance serves no HTTP; docs/multinode-serving.md);
- ``atlas-npu-exporter``: every Atlas node's NPU exporter (Huawei's npu-exporter, default port 8082);
- ``atlas-node``: every Atlas node's and gateway's node exporter (port 9100).

Every target carries ``LABELS``: ``branch`` (the node's ``<prefix><branch>`` group, a gateway's
``gateway_branch``), ``node`` (inventory name), ``instance`` (its serving instance of two or more nodes, else
the node), ``release`` (its service record's ``release_id``) and ``engine`` (the record's ``engine``); a node
whose record was not read has ``unknown`` there, a gateway ``none``. A target label wins over a scraped one
of the same name, which Prometheus keeps as ``exported_<name>`` (vLLM's own ``engine`` label, the index of
its engine core, becomes ``exported_engine``).
"""

from __future__ import annotations

import hashlib
import math

from ansible_collections.atlas.serving.plugins.module_utils import npu_network, serving_instance

JOBS = {"engine": "atlas-engine", "npu": "atlas-npu-exporter", "node": "atlas-node"}
LABELS = ("branch", "node", "instance", "release", "engine")
UNKNOWN = "unknown"  # a node whose service record was not read
NOT_SERVING = "none"  # a gateway: no release, no engine; a node in no branch group
METRICS_PATH = "/metrics"
# Where Prometheus is (docs/monitoring.md, "Where Prometheus is"): monitoring_prometheus_url when set,
# else the first host of group `monitoring` at monitoring_prometheus_port (the role's default below).
MONITORING_GROUP = "monitoring"
URL_VAR = "monitoring_prometheus_url"
PORT_VAR = "monitoring_prometheus_port"
DEFAULT_PROMETHEUS_PORT = 9090
# TLS and basic authentication (docs/security.md): Prometheus's API user and its password file on the
# controller; monitoring_tls false serves plain HTTP (the role's defaults name the same values).
TLS_VAR = "monitoring_tls"
API_USER_VAR = "monitoring_api_user"
API_PASSWORD_FILE_VAR = "monitoring_api_password_file"
DEFAULT_API_USER = "atlas"
# The SLO thresholds the rules compare p95 latencies with: one series per serving entry node, from its
# serving profile's `slo` (the keys `atlasctl bench --slo-*` takes), in seconds, the value also as a label.
SLO_RECORDS = {"ttft_ms": "atlas:slo_ttft_seconds", "tpot_ms": "atlas:slo_tpot_seconds"}
SLO_GROUP = "atlas-slo-thresholds"


class MonitoringError(ValueError):
    """A bad input: the message names the host or variable and the fix."""


def _port(value, name):
    if isinstance(value, bool) or not str(value).isdigit() or not 1 <= int(value) <= 65535:
        raise MonitoringError(f"{name} must be a TCP port (1-65535), got {value!r}")
    return int(value)


def address(host, hostvars, port):
    """``host:port`` as Prometheus reaches the host: its ``ansible_host``, else its inventory name."""
    where = str(npu_network.host_var(hostvars, host, "ansible_host") or host)
    return f"[{where}]:{port}" if ":" in where else f"{where}:{port}"


def branch_of(host, hostvars, prefix):
    """The branch of a fleet node: its one ``<prefix><branch>`` group (``none`` in no branch group)."""
    found = sorted(g[len(prefix):] for g in npu_network.host_var(hostvars, host, "group_names", []) or []
                   if g.startswith(prefix))
    if len(found) > 1:
        raise MonitoringError(f"{host} is in {len(found)} branch groups ({', '.join(prefix + b for b in found)}): "
                              "a node belongs to one branch; remove it from all but one")
    return found[0] if found else NOT_SERVING


def node_labels(host, hostvars, serving_instances, record, prefix):
    """The labels of every target of fleet node ``host`` (``record``: its service record, or None)."""
    try:
        found = serving_instance.instance_of(host, serving_instances or {})
    except serving_instance.InstanceError as exc:
        raise MonitoringError(str(exc)) from None
    record = record or {}
    return {"branch": branch_of(host, hostvars, prefix), "node": host, "instance": found[0] if found else host,
            "release": str(record.get("release_id") or UNKNOWN), "engine": str(record.get("engine") or UNKNOWN)}


def gateway_labels(host, hostvars):
    return {"branch": str(npu_network.host_var(hostvars, host, "gateway_branch") or NOT_SERVING), "node": host,
            "instance": host, "release": NOT_SERVING, "engine": NOT_SERVING}


def _readable(record):
    return isinstance(record, dict) and record.get("port") not in (None, "")


def targets(fleet, hostvars, *, gateways=(), serving_instances=None, records=None, node_exporter_port=9100,
            npu_exporter_port=8082, branch_prefix="branch_"):
    """``{"scrape_configs": [three jobs], "unread": [entry nodes without a service record]}``.

    ``records``: ``{host: service record}`` as the nodes' records were read (roles/gateway, tasks/port.yml); an
    entry node without one has no engine target (it is named in ``unread``), its exporters are scraped."""
    node_port = _port(node_exporter_port, "monitoring_node_exporter_port")
    npu_port = _port(npu_exporter_port, "monitoring_npu_exporter_port")
    records = records or {}
    fleet = list(fleet or [])
    labels = {h: node_labels(h, hostvars, serving_instances, records.get(h), branch_prefix) for h in fleet}
    engine, unread = [], []
    for host in serving_instance.entry_nodes(fleet, serving_instances or {}):
        record = records.get(host)
        if not _readable(record):
            unread.append(host)
            continue
        port = _port(record["port"], f"{host}: the service record's port")
        engine.append({"targets": [address(host, hostvars, port)], "labels": labels[host]})
    npu = [{"targets": [address(h, hostvars, npu_port)], "labels": labels[h]} for h in fleet]
    node = [{"targets": [address(h, hostvars, node_port)], "labels": labels[h]} for h in fleet]
    node += [{"targets": [address(g, hostvars, node_port)], "labels": gateway_labels(g, hostvars)}
             for g in gateways or [] if g not in labels]
    jobs = ((JOBS["engine"], engine), (JOBS["npu"], npu), (JOBS["node"], node))
    return {"scrape_configs": [{"job_name": name, "metrics_path": METRICS_PATH, "static_configs": configs}
                               for name, configs in jobs],
            "unread": unread}


def _threshold(host, key, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise MonitoringError(f"{host}: slo.{key} must be a number of milliseconds > 0, got {value!r}; fix the "
                              "`slo` section of its serving profile (or monitoring_slo_default)")
    return float(value)


def slo_rules(fleet, serving_instances=None, slos=None, defaults=None):
    """The rule file of the SLO thresholds: for each serving entry node, one recording rule per key of
    ``SLO_RECORDS`` its ``slos[host]`` (its serving profile's ``slo``) or ``defaults`` sets."""
    rules = []
    for host in sorted(serving_instance.entry_nodes(list(fleet or []), serving_instances or {})):
        slo = {**(defaults or {}), **((slos or {}).get(host) or {})}
        for key, record in SLO_RECORDS.items():
            if slo.get(key) is None:
                continue
            value = _threshold(host, key, slo[key])
            rules.append({"record": record, "expr": f"vector({value / 1000:g})",
                          "labels": {"node": host, "slo_ms": f"{value:g}"}})
    return {"groups": [{"name": SLO_GROUP, "rules": rules}] if rules else []}


def prometheus_url(explicit, monitoring_hosts, hostvars):
    """Where the inventory's Prometheus answers: ``explicit`` (monitoring_prometheus_url) when set, else the
    first of ``monitoring_hosts`` at its ``monitoring_prometheus_port`` (9090), over HTTPS unless its
    ``monitoring_tls`` is false, else '' (none)."""
    if explicit:
        text = str(explicit).rstrip("/")
        if not text.startswith(("http://", "https://")):
            raise MonitoringError(f"{URL_VAR} {explicit!r} is not an http(s) URL; write e.g. https://10.0.0.5:9090")
        return text
    hosts = list(monitoring_hosts or [])
    if not hosts:
        return ""
    port = _port(npu_network.host_var(hostvars, hosts[0], PORT_VAR, DEFAULT_PROMETHEUS_PORT), PORT_VAR)
    scheme = "https" if _bool(npu_network.host_var(hostvars, hosts[0], TLS_VAR, True)) else "http"
    return f"{scheme}://" + address(hosts[0], hostvars, port)


def _bool(value):
    return str(value).strip().lower() not in ("false", "no", "0", "off", "")


def prometheus_access(explicit, monitoring_hosts, hostvars):
    """How a client reaches the inventory's Prometheus (docs/security.md): ``{url, ca_file, user,
    password_file}``, the CA (``atlas_tls_ca_file``) and the API user's credentials
    (``monitoring_api_user``, ``monitoring_api_password_file``: a file on the controller) as the first
    monitoring host's variables name them (any host's, for an explicit URL); ``url`` '' when none."""
    hosts = list(monitoring_hosts or [])
    url = prometheus_url(explicit, hosts, hostvars)
    source = hosts[0] if hosts else next(iter(sorted(hostvars.keys())), None) if hasattr(hostvars, "keys") else None

    def var(name, default):
        return str(npu_network.host_var(hostvars, source, name, default) or default) if source else default

    return {"url": url, "ca_file": var("atlas_tls_ca_file", ""), "user": var(API_USER_VAR, DEFAULT_API_USER),
            "password_file": var(API_PASSWORD_FILE_VAR, "")}


# bcrypt's own base64 alphabet (salts and hashes), and the cost of the web configuration's password hashes:
# Prometheus's exporter-toolkit checks a password against its bcrypt hash on each request it has not cached.
_BCRYPT_ALPHABET = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
WEB_PASSWORD_COST = 10


def web_password_hash(password, seed):
    """The bcrypt hash of ``password`` for a ``basic_auth_users`` entry of a web configuration file
    (``--web.config.file``), with a salt derived from ``seed`` (the host and the user): the same file on every
    run (a converged host changes nothing), another salt on every host and for every user."""
    if not isinstance(password, str) or not password.strip():
        raise MonitoringError(f"{seed}: the password is empty: put one line of at least 16 characters in the file "
                              "monitoring_scrape_password_file / monitoring_api_password_file names")
    try:
        import bcrypt  # the controller's closure has it (paramiko's dependency); only this function needs it
    except ImportError:
        raise MonitoringError("the Python package bcrypt is not installed on the controller: install the controller "
                              "from its kit (requirements-controller.txt pins it)") from None
    bits = int.from_bytes(hashlib.sha256(f"atlas-web-password:{seed}".encode()).digest()[:16], "big") << 4
    salt = "".join(_BCRYPT_ALPHABET[(bits >> (6 * (21 - i))) & 63] for i in range(22))
    return bcrypt.hashpw(password.strip().encode(), f"$2b${WEB_PASSWORD_COST:02d}${salt}".encode()).decode()
