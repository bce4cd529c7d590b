"""The fleet probed as an attacker would (docs/security.md), on the converged lab: the branch gateway is the only
door (HTTPS with the lab CA's certificate, the API key enforced by the gateway, only the OpenAI paths forwarded,
which backend served told only to the monitoring network); an engine is reached from its gateway and the
monitoring host, never from another node; the exporters and Prometheus refuse a scrape without credentials."""

from __future__ import annotations

import json
import shlex
import ssl
import urllib.error
import urllib.request

import pytest
import yaml
from labtools import GATEWAYS, MODEL, ROOT, lab_api_key, on_node, urlopen

pytestmark = pytest.mark.lab

GATEWAY, GATEWAY_HOST = GATEWAYS["east"], "atlas-gw-east"
NODE, OTHER, MON = "atlas-n1", "atlas-n2", "atlas-mon"
ENGINE_PORT = 8000
WEB_DIR = "/etc/prometheus/atlas-web"  # roles/monitoring: monitoring_web_dir


@pytest.fixture(scope="module")
def converged(converged_lab):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    return converged_lab.hosts


def _completion(path: str = "/v1/completions", key: str | None = None, base: str = GATEWAY) -> tuple[int, dict]:
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 2}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urlopen(urllib.request.Request(f"{base}{path}", data=body, headers=headers), timeout=60) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def _address(host: str) -> str:
    """Any lab host's address (lab_hosts() has the serving nodes only)."""
    found = {}

    def walk(group: dict) -> None:
        for name, hv in ((group or {}).get("hosts") or {}).items():
            if hv and "ansible_host" in hv:
                found[name] = hv["ansible_host"]
        for child in ((group or {}).get("children") or {}).values():
            walk(child)

    walk(yaml.safe_load((ROOT / "inventory/lab/hosts.yml").read_text())["all"])
    return found[host]


def _curl(host: str, url: str, *options: str) -> str:
    """curl on ``host``: the HTTP status, or 000 when nothing answered within 5 s (a dropped connection)."""
    words = " ".join(shlex.quote(o) for o in options)
    return on_node(host, f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 {words} {shlex.quote(url)}",
                   check=False, timeout=60).stdout.strip()


def test_the_gateway_serves_over_tls_with_the_key(converged):
    status, headers = _completion(key=lab_api_key())
    assert status == 200
    assert headers.get("X-Atlas-Backend", "").endswith(f":{ENGINE_PORT}"), "the lab host is on the monitoring list"
    with pytest.raises(urllib.error.URLError) as refused:  # the system's CAs do not know the lab CA
        urllib.request.urlopen(f"{GATEWAY}/v1/models", timeout=10, context=ssl.create_default_context())  # noqa: S310
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    plain = GATEWAY.replace("https://", "http://")
    try:
        with urllib.request.urlopen(f"{plain}/v1/models", timeout=10) as response:  # noqa: S310 (lab address)
            code = response.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    assert code == 400, "plain HTTP to the TLS port is refused (nginx: 'plain HTTP request sent to HTTPS port')"


@pytest.mark.parametrize("key", [None, "atlas-wrong-key"])
def test_no_key_or_a_wrong_key_is_refused_by_the_gateway(converged, key):
    status, headers = _completion(key=key)
    assert status == 401 and "X-Atlas-Backend" not in headers, (status, headers)


@pytest.mark.parametrize("path", ["/invocations", "/health", "/metrics", "/v1/completions/../../invocations",
                                  "/v1/load_lora_adapter", "/tokenize"])
def test_paths_other_than_the_api_are_never_forwarded(converged, path):
    status, headers = _completion(path, key=lab_api_key())
    assert status == 404 and "X-Atlas-Backend" not in headers, (path, status)


def test_which_backend_served_is_not_told_to_clients(converged):
    key = lab_api_key()
    out = on_node(OTHER, f"curl -s -D - -o /dev/null -m 30 -k -H 'Authorization: Bearer {key}' "
                         f"-H 'Content-Type: application/json' -d '{{\"model\": \"{MODEL}\", \"prompt\": \"Hi\", "
                         f"\"max_tokens\": 1}}' https://{_address(GATEWAY_HOST)}:8443/v1/completions",
                  check=False, timeout=60).stdout
    assert out.startswith("HTTP/1.1 200"), out
    assert "x-atlas-backend" not in out.lower(), out


def test_an_engine_is_reached_from_its_gateway_and_monitoring_never_from_another_node(converged):
    engine = f"http://{_address(NODE)}:{ENGINE_PORT}/health"
    assert _curl(GATEWAY_HOST, engine) == "200"
    assert _curl(MON, engine) == "200"
    assert _curl(OTHER, engine) == "000", "another node reached the engine"
    assert _curl("atlas-gw-west", engine) == "000", "another branch's gateway reached the engine"
    listening = [line.split()[3] for line in on_node(NODE, f"ss -Htln 'sport = :{ENGINE_PORT}'").stdout.splitlines()]
    assert listening == [f"{_address(NODE)}:{ENGINE_PORT}"], f"the engine listens on {listening}, not its address alone"


def test_the_exporters_and_prometheus_refuse_a_scrape_without_credentials(converged):
    node_exporter = f"https://{_address(NODE)}:9100/metrics"
    ca = ("--cacert", f"{WEB_DIR}/ca.pem")
    assert _curl(MON, node_exporter, *ca) == "401"
    assert _curl(MON, node_exporter, *ca, "-u", "atlas-scrape:wrong-password") == "401"
    scrape = on_node(MON, f"cat {WEB_DIR}/scrape-password").stdout.strip()
    assert _curl(MON, node_exporter, *ca, "-u", f"atlas-scrape:{scrape}") == "200"
    assert _curl(OTHER, node_exporter, "-k") == "000", "another node reached the node exporter"
    assert _curl(OTHER, f"http://{_address(NODE)}:8082/metrics") == "000", "another node reached the NPU exporter"
    prometheus = f"https://{_address(MON)}:9090/api/v1/targets"
    assert _curl(OTHER, prometheus, "-k") == "401"
    assert _curl(OTHER, f"https://{_address('atlas-gw-west')}:9100/metrics", "-k") == "401"
    args = on_node(NODE, "cat /etc/default/prometheus-node-exporter").stdout
    assert "--web.config.file=" in args and scrape not in args and "basic_auth" not in args
