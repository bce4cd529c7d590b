"""site.yml end to end on bare lab nodes: first run converges, second run changes nothing,
every service answers with the real engine endpoints."""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.request

import pytest
from labtools import GATEWAYS, SERVING, changed_tasks, lab, lab_api_key, layout, on_node, playbook, recap, urlopen
from labtools import model_service as _service
from labtools import new_model_version as _new_model_version

from atlasctl import layout as node_layout

pytestmark = pytest.mark.lab

PORTS = {"vllm": 8000, "sglang": 30000}


@pytest.fixture(scope="module")
def site_runs(converged_lab):
    return converged_lab.hosts, converged_lab.first


@pytest.fixture(scope="module")
def bare_check(converged_lab):
    return converged_lab.hosts, converged_lab.bare_check, converged_lab.bare_leftovers


def test_check_mode_on_bare_nodes_changes_nothing(bare_check):
    hosts, run, leftovers = bare_check
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    stats = recap(run.stdout)
    assert set(hosts) < set(stats), "the serving nodes and the gateways"
    assert all(s["changed"] > 0 for s in stats.values()), "check mode must report what it would change"
    assert leftovers == {host: [] for host in hosts}, "check mode wrote to a node"
    assert "+++ after" in run.stdout, "--diff shows the rendered files"


def _engine(host: str) -> str:
    record = lab("ssh", host, "cat", layout(host)["serving_record"], timeout=60)
    return json.loads(record.stdout)["engine"]


def _headers() -> dict[str, str]:
    """What the lab's clients send: the lab's API key (the engines and the gateways require it)."""
    return {"Content-Type": "application/json", "Authorization": f"Bearer {lab_api_key()}"}


def _get(url: str, timeout: float = 30) -> tuple[int, bytes]:
    with urlopen(urllib.request.Request(url, headers=_headers()), timeout=timeout) as resp:
        return resp.status, resp.read()


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=_headers())
    with urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def test_first_run_converges(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-3000:]
    stats = recap(first.stdout)
    assert set(hosts) < set(stats), "the serving nodes and the gateways"
    for host, s in stats.items():
        assert s["failed"] == 0 and s["unreachable"] == 0, (host, s)
        assert s["changed"] > 0, f"{host}: a first run on a bare node must change something"


def test_second_run_changes_nothing(site_runs, full_fleet):
    """The lab's second site.yml is full_fleet's (conftest.py): the lab's inventory and the declarations it adds,
    run from the site's controller. It runs late, with the tests on full_fleet."""
    hosts, _ = site_runs
    full_fleet.assert_converged()
    assert set(hosts) < set(recap(full_fleet.second.stdout)), "the serving nodes and the gateways"


def test_check_mode_after_convergence_reports_nothing(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0, first.stdout[-6000:]
    run = playbook("site.yml", "--check")
    assert run.returncode == 0, run.stdout[-6000:]
    stats = recap(run.stdout)
    assert set(hosts) < set(stats), "the serving nodes and the gateways"
    changed = {h: s["changed"] for h, s in stats.items() if s["changed"]}
    assert not changed, f"check mode after convergence reports changes: {changed_tasks(run.stdout)}"


def test_fleet_table_printed(site_runs):
    """The fleet table at the end of site.yml (a debug message, one JSON string per line): its header, then a row
    per serving node whose service is active and whose /health answered 200."""
    hosts, first = site_runs
    lines = [line.strip().rstrip(",").strip('"') for line in first.stdout.split("PLAY RECAP")[0].splitlines()]
    starts = [i for i, line in enumerate(lines) if line.split()[:1] == ["NODE"] and "/health" in line]
    assert starts, first.stdout[-4000:]
    rows = {cells[0]: cells for cells in (line.split() for line in lines[starts[-1] + 2:]) if cells}
    for host in SERVING:
        assert host in rows and "active" in rows[host] and "200" in rows[host], (host, rows.get(host))


def test_every_service_answers(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    for host, hv in hosts.items():
        engine = _engine(host)
        base = f"http://{hv['ansible_host']}:{PORTS[engine]}"
        status, _ = _get(f"{base}/health")
        assert status == 200, host
        _, body = _get(f"{base}/v1/models")
        names = [m["id"] for m in json.loads(body)["data"]]
        assert "atlas-tiny-llama" in names, (host, names)
        out = _post(f"{base}/v1/completions", {"model": "atlas-tiny-llama", "prompt": "Hello", "max_tokens": 5,
                                              "temperature": 0})
        assert out["usage"]["completion_tokens"] >= 1, (host, out)
        assert isinstance(out["choices"][0]["text"], str)


# A backend that answers every request with 500 (an engine's internal error).
FAULT_500 = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()
    do_GET = do_POST
http.server.HTTPServer(("127.0.0.1", 18500), H).serve_forever()
"""


def test_gateway_retries_a_backend_that_answers_500(site_runs):
    """A backend's 500 never reaches the client: nginx retries the request on the next backend
    (completions have no side effects) and takes the failing one out for its fail_timeout."""
    gateway, conf = "atlas-gw-west", "/etc/nginx/atlas-backends/west/zz-fault500.conf"
    on_node(gateway, f"systemd-run --unit atlas-fault500 python3 -c {shlex.quote(FAULT_500)}")
    try:
        on_node(gateway, f"echo 'server 127.0.0.1:18500 max_fails=1 fail_timeout=10s;' > {conf}"
                         " && nginx -t -q && systemctl reload nginx")
        body = json.dumps({"model": "atlas-tiny-llama", "prompt": "Hello", "max_tokens": 2}).encode()
        seen, failed = [], []
        for _ in range(12):
            req = urllib.request.Request(f"{GATEWAYS['west']}/v1/completions", data=body, headers=_headers())
            try:
                with urlopen(req, timeout=60) as resp:
                    seen.append(resp.headers.get("X-Atlas-Backend", ""))
            except urllib.error.HTTPError as exc:
                failed.append(f"{exc.code} {exc.headers.get('X-Atlas-Backend', '')}")
            if any("127.0.0.1:18500" in b for b in seen):
                break
        assert failed == [], failed
        assert any("127.0.0.1:18500" in b for b in seen), f"the failing backend was never tried: {seen}"
    finally:
        on_node(gateway, f"rm -f {conf}; nginx -t -q && systemctl reload nginx; systemctl stop atlas-fault500 || true",
                check=False)


def test_streaming_chat_with_usage(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    for host, hv in hosts.items():
        engine = _engine(host)
        url = f"http://{hv['ansible_host']}:{PORTS[engine]}/v1/chat/completions"
        body = {"model": "atlas-tiny-llama", "messages": [{"role": "user", "content": "Open an account"}],
                "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=_headers())
        chunks, usage, done = [], None, False
        with urlopen(req, timeout=120) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                chunks.append(event)
                usage = event.get("usage") or usage
        assert done, host
        assert chunks and usage and usage["completion_tokens"] >= 1, (host, usage)


def test_metrics_have_engine_names(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    for host, hv in hosts.items():
        engine = _engine(host)
        _, body = _get(f"http://{hv['ansible_host']}:{PORTS[engine]}/metrics")
        text = body.decode()
        wanted = "vllm:time_to_first_token_seconds" if engine == "vllm" else "sglang:time_to_first_token_seconds"
        assert wanted in text, host


def test_env_file_is_private(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    for host in hosts:
        out = lab("ssh", host, f"stat -L -c '%a %U' {layout(host)['serving_env_file']}", timeout=60)
        assert out.stdout.split() == ["600", "root"], host


def test_release_configuration_behind_current(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    for host in hosts:
        out = lab("ssh", host, f"cd {layout(host)['serving_config_dir']} && readlink current atlas-serving.env "
                       "atlas-serving.args atlas-serving.json && ls releases/lab-2026.11.1", timeout=60).stdout.split()
        assert out[:4] == ["releases/lab-2026.11.1", "current/atlas-serving.env", "current/atlas-serving.args",
                           "current/atlas-serving.json"], (host, out)
        # the lab serves with an API key (its --config keys file) on a pinned CANN (.cann): the release's files too
        assert sorted(out[4:]) == ["atlas-serving.args", "atlas-serving.cann", "atlas-serving.env",
                                   "atlas-serving.json", "atlas-serving.keys.yaml"], (host, out)


def test_a_branch_with_its_own_layout_keeps_nothing_at_the_default_paths(site_runs):
    """Branch west's inventory moves serving_config_dir and models_root (roles/layout): the service,
    its files and the model live there only, and the unit reads the moved files."""
    hosts, first = site_runs
    assert first.returncode == 0
    moved = [h for h in hosts if layout(h)["serving_config_dir"] != node_layout.default_layout().config_dir]
    assert moved, "the lab inventory gives branch west a layout of its own"
    for host in moved:
        where = layout(host)
        assert where["models_root"] != node_layout.default_layout().models_root, host
        out = lab("ssh", host, "ls -d /etc/atlas/serving /var/lib/atlas/models 2>/dev/null;"
                               f" test -f {where['serving_record']} && test -L {where['models_path']} && echo placed;"
                               " systemctl show -p EnvironmentFiles --value atlas-serving", check=False,
                  timeout=60).stdout.split()
        assert out[:1] == ["placed"], (host, out)
        assert out[1] == where["serving_env_file"], (host, out)


# --- model integrity: a bad new model version never reaches the engine ---------------------------

NODE = "atlas-n3"  # an SGLang stand-in node: restarts in about a second


def test_corrupt_new_model_version_is_refused_and_service_keeps_serving(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    before = _service(NODE)
    assert before[0] == "active"
    tampered = _new_model_version(NODE, corrupt=True)
    run = playbook("playbooks/models.yml", "playbooks/serving.yml", "--limit", NODE,
                   "-e", f"atlas_bundle_dir={tampered}")
    assert run.returncode != 0
    assert "model-00001-of-00002.safetensors" in run.stdout
    assert re.search(r"[0-9a-f]{64}[^\n]*[0-9a-f]{64}", run.stdout), "both sha256 digests named: " + run.stdout[-3000:]
    assert _service(NODE) == before, "the engine was restarted or the current model changed"
    out = _post(f"http://{hosts[NODE]['ansible_host']}:{PORTS['sglang']}/v1/completions",
                {"model": "atlas-tiny-llama", "prompt": "Balance?", "max_tokens": 3})
    assert out["usage"]["completion_tokens"] >= 1


def test_verified_new_model_version_becomes_current_and_restarts(site_runs):
    hosts, first = site_runs
    assert first.returncode == 0
    before = _service(NODE)
    good = _new_model_version(NODE, corrupt=False)
    run = playbook("playbooks/models.yml", "playbooks/serving.yml", "playbooks/health.yml", "--limit", NODE,
                   "-e", f"atlas_bundle_dir={good}")
    assert run.returncode == 0, run.stdout[-5000:]
    after = _service(NODE)
    assert after[0] == "active"
    assert after[2] != before[2], "current did not move to the new version"
    assert after[1] != before[1], "the engine was not restarted on the new model"
    # back to the lab bundle's version: the previous version is still on disk
    back = playbook("playbooks/models.yml", "playbooks/serving.yml", "playbooks/health.yml", "--limit", NODE)
    assert back.returncode == 0, back.stdout[-5000:]
    assert _service(NODE)[2] == before[2]
