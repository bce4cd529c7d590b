"""The monitoring stage on the converged lab (docs/monitoring.md): Prometheus on atlas-mon scrapes every
target the inventory gives it (each entry's engine, each Atlas node's npu-exporter simulator and node
exporter, the gateways' node exporters), up, with the branch/node/instance/release labels; an NPU set
unhealthy fires AtlasNpuUnhealthy within its `for:` window (and clears when it is healthy again); and a
rollout's report carries the canary's live p95 latency from Prometheus before its restart and after its bench."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request

import pytest
from labtools import ENV, ROOT, atlasctl, lab, lab_api_key, lab_hosts, rollout

from atlasctl import inventory, prometheus

pytestmark = pytest.mark.lab

CANARY, SICK = "atlas-n3", "atlas-n1"
WAIT_S = 240  # the alert's for: 1m, plus scrape and evaluation intervals (15 s each), on a busy 2-core machine


def _prometheus() -> prometheus.Access:
    """How atlasctl reaches the lab's Prometheus: HTTPS with the lab CA, the API user and its password file."""
    return prometheus.access_of(inventory.listing(ROOT / "inventory/lab"))


def _get(path: str, **query: str) -> dict:
    access = _prometheus()
    url = f"{access.url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with access.opener().open(urllib.request.Request(url, headers=access.headers()), timeout=20) as response:
        return json.loads(response.read())


def _wait(predicate, timeout: float, poll: float = 5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(poll)


def _firing(alert: str, **labels: str) -> list[dict]:
    return [a for a in _get("/api/v1/alerts")["data"]["alerts"] if a["labels"].get("alertname") == alert
            and a["state"] == "firing" and all(a["labels"].get(k) == v for k, v in labels.items())]


@pytest.fixture(scope="module")
def monitored(converged_lab):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    return converged_lab.hosts


def test_every_target_the_inventory_gives_is_scraped_and_up_with_its_labels(monitored) -> None:
    def all_up():
        targets = _get("/api/v1/targets")["data"]["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = _wait(all_up, 120) or _get("/api/v1/targets")["data"]["activeTargets"]
    down = [(t["labels"].get("job"), t["labels"].get("node"), t.get("lastError"))
            for t in targets if t["health"] != "up"]
    assert down == [], down
    jobs: dict[str, set[str]] = {}
    for t in targets:
        jobs.setdefault(t["labels"]["job"], set()).add(t["labels"].get("node", ""))
    serving = {"atlas-n1", "atlas-n2", "atlas-n3", "atlas-n4", "atlas-n5"}
    assert jobs["atlas-engine"] == serving and jobs["atlas-npu-exporter"] == serving
    assert jobs["atlas-node"] == serving | {"atlas-gw-east", "atlas-gw-west"}
    engine = next(t["labels"] for t in targets
                  if t["labels"]["job"] == "atlas-engine" and t["labels"]["node"] == CANARY)
    assert (engine["branch"], engine["instance"], engine["engine"]) == ("west", CANARY, "sglang"), engine
    assert engine["release"].startswith("lab-"), engine


class _AlertWatch(threading.Thread):
    """Polls Prometheus until an alert fires for a node, from the moment it is started: the seconds it took and
    the alerts, or nothing by its deadline."""

    def __init__(self, alert: str, node: str, timeout: float):
        super().__init__(daemon=True)
        self.alert, self.node, self.timeout = alert, node, timeout
        self.fired: list[dict] = []
        self.took: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.fired = _wait(lambda: _firing(self.alert, node=self.node), self.timeout)
            self.took = time.monotonic() - started
        except BaseException as exc:  # noqa: BLE001 (reported by the test that reads it)
            self.error = exc


@pytest.fixture(scope="module")
def sick_npu(monitored):
    """NPU 1 of SICK set Critical and a watch for its AtlasNpuUnhealthy alert, kept for the rest of the module:
    the alert's for: window (1m) runs while the rollout test does, instead of the lab waiting on it alone. The
    NPU is set healthy again at the end whatever happened (the alert test does it first, to see the alert clear)."""
    assert _firing("AtlasNpuUnhealthy", node=SICK) == [], "firing before the fault"
    watch = _AlertWatch("AtlasNpuUnhealthy", SICK, WAIT_S)
    lab("npu", SICK, "--device", "1", "--health", "Critical", timeout=60)
    watch.start()
    try:
        yield watch
    finally:
        lab("npu", SICK, "--device", "1", "--health", "OK", timeout=60)


def test_the_rollout_report_has_the_canarys_live_latency_before_and_after(sick_npu) -> None:
    """Traffic on the canary first (so Prometheus has latency of the release that runs now), then the
    canary wave of a new release: its node report carries p95 TTFT/TPOT before the restart and after the
    bench, read from Prometheus. (It runs inside the NPU alert's window, sick_npu: the sick NPU is on a node of
    the other branch, which the canary wave does not touch.)"""
    url = f"http://{lab_hosts()[CANARY]['ansible_host']}:30000"
    ENV["ATLAS_BENCH_API_KEY"] = lab_api_key()  # the engine requires the lab's key; by environment, never argv
    atlasctl("bench", url, "--model", "atlas-tiny-llama", "--num-requests", "40", "--concurrency", "2",
             "--output-len", "8", "--duration", "60", timeout=300)
    # the rollout's own query (atlasctl.prometheus.live, its 5m window) has the canary's figures once Prometheus
    # scraped that traffic twice (a rate() needs two points): awaited, not slept
    assert _wait(lambda: (prometheus.live(_prometheus(), "5m").nodes.get(CANARY) or {}).get("ttft_p95_ms")
                 is not None, 120, poll=3), "Prometheus never had the canary's TTFT"
    rc, report = rollout("--release", "lab-2026.12.9", "-e", 'rollout_slo={"e2el_ms": 60000}',
                         "-e", 'rollout_waves=[{"name": "canary", "hosts": "canary"}]')
    assert rc == 0, report
    live = next(n for n in report["nodes"] if n["host"] == CANARY)["slo"]["prometheus"]
    assert live["error"] is None, live
    for when in ("before", "after"):
        assert live[when] and live[when]["ttft_p95_ms"] is not None, (when, live)


def test_an_unhealthy_npu_fires_its_alert_within_the_window_and_clears(sick_npu) -> None:
    sick_npu.join(WAIT_S + 30)
    assert sick_npu.error is None, repr(sick_npu.error)
    fired, took = sick_npu.fired, sick_npu.took
    assert fired, f"AtlasNpuUnhealthy did not fire within {WAIT_S} s"
    assert fired[0]["labels"]["id"] == "1" and fired[0]["labels"]["branch"] == "east", fired[0]["labels"]
    assert took is not None and took >= 60, f"fired after {took} s: its for: 1m was not respected"
    lab("npu", SICK, "--device", "1", "--health", "OK", timeout=60)
    assert _wait(lambda: not _firing("AtlasNpuUnhealthy", node=SICK), WAIT_S), "still firing once healthy again"
