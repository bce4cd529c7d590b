"""Filters of the monitoring stage (logic in plugin_utils/monitoring.py; docs/monitoring.md).

``monitoring_targets``         fleet hosts + hostvars (+ gateways, serving_instances, the fact holding each
                               node's service record, ports) -> {scrape_configs: [three jobs], unread: [...]}
``monitoring_slo_rules``       fleet hosts + hostvars (+ serving_instances, the fact holding each node's
                               resolved profile, defaults) -> the rule file of the SLO thresholds
``monitoring_prometheus_url``  the monitoring group's hosts + hostvars + monitoring_prometheus_url -> URL or ''
``monitoring_prometheus_access``  the same -> {url, ca_file, user, password_file}: how a client reaches it
``monitoring_password_hash``   a password + a seed (host and user) -> its bcrypt hash for a web configuration file
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.atlas.serving.plugins.module_utils import npu_network
from ansible_collections.atlas.serving.plugins.plugin_utils import monitoring


def _facts(hosts, hostvars, name):
    return {h: npu_network.host_var(hostvars, h, name) for h in hosts or []}


def monitoring_targets(fleet, hostvars, gateways=None, serving_instances=None, record_fact="gateway_backend_record",
                       node_exporter_port=9100, npu_exporter_port=8082, branch_prefix="branch_") -> dict:
    try:
        return monitoring.targets(list(fleet or []), hostvars, gateways=list(gateways or []),
                                  serving_instances=serving_instances or {},
                                  records=_facts(fleet, hostvars, record_fact), node_exporter_port=node_exporter_port,
                                  npu_exporter_port=npu_exporter_port, branch_prefix=branch_prefix)
    except monitoring.MonitoringError as exc:
        raise AnsibleFilterError(str(exc)) from None


def monitoring_slo_rules(fleet, hostvars, serving_instances=None, defaults=None,
                         profile_fact="serving_profile_resolved") -> dict:
    profiles = _facts(fleet, hostvars, profile_fact)
    slos = {h: (p or {}).get("slo") for h, p in profiles.items()}
    try:
        return monitoring.slo_rules(list(fleet or []), serving_instances or {}, slos, defaults or {})
    except monitoring.MonitoringError as exc:
        raise AnsibleFilterError(str(exc)) from None


def monitoring_prometheus_url(monitoring_hosts, hostvars, explicit="") -> str:
    try:
        return monitoring.prometheus_url(explicit, list(monitoring_hosts or []), hostvars)
    except monitoring.MonitoringError as exc:
        raise AnsibleFilterError(str(exc)) from None


def monitoring_prometheus_access(monitoring_hosts, hostvars, explicit="") -> dict:
    try:
        return monitoring.prometheus_access(explicit, list(monitoring_hosts or []), hostvars)
    except monitoring.MonitoringError as exc:
        raise AnsibleFilterError(str(exc)) from None


def monitoring_password_hash(password, seed) -> str:
    try:
        return monitoring.web_password_hash(password, seed)
    except monitoring.MonitoringError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self):
        return {
            "monitoring_targets": monitoring_targets,
            "monitoring_slo_rules": monitoring_slo_rules,
            "monitoring_prometheus_url": monitoring_prometheus_url,
            "monitoring_prometheus_access": monitoring_prometheus_access,
            "monitoring_password_hash": monitoring_password_hash,
        }
