"""atlasctl doctor on the converged lab: healthy fleet, then one fault at a time on one SGLang node
(atlas-n4: the stand-in restarts in about a second), each expected as a finding and restored.
Then the API key: enforced by the engine, absent from every artifact of the run."""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from labtools import ENV, ROOT, atlasctl, doctor, lab, lab_api_key, lab_hosts, layout, on_node, playbook
from labtools import grep_tree as _grep_tree

pytestmark = pytest.mark.lab

NODE = "atlas-n4"


def _at(name: str) -> str:
    """A path of NODE's layout (branch west's: its inventory moves the config and model roots)."""
    return layout(NODE)[name]


@pytest.fixture(scope="module")
def converged(converged_lab):
    assert converged_lab.first.returncode == 0, converged_lab.first.stdout[-6000:]
    return converged_lab.hosts


def errors(doc: dict, host: str = NODE) -> list[dict]:
    return [f for f in doc["hosts"][host]["findings"] if f["severity"] == "error"]


def on_doctor_node(command: str) -> str:
    return on_node(NODE, command).stdout


def node_url(path: str) -> str:
    return f"http://{lab_hosts()[NODE]['ansible_host']}:30000{path}"


def status(path: str, key: str | None = None) -> int:
    request = urllib.request.Request(node_url(path), headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


# The hang check (two /metrics samples --hang-window apart, 10 s by default) is judged on the whole fleet by
# test_converged_fleet_is_healthy (no false positive) and by the drills (rank-frozen); the fault tests here are
# about other checks, so their doctor runs leave it out.
NO_HANG = ("--hang-window", "0")


def wait_healthy(timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if status("/health") == 200:
                return
        time.sleep(0.5)
    raise AssertionError(f"{NODE} /health did not answer 200 within {timeout}s")


def test_converged_fleet_is_healthy(converged):
    started = time.monotonic()
    rc, doc, out = doctor()
    wall = time.monotonic() - started
    assert rc == 0, out
    assert set(doc["hosts"]) == set(converged)
    assert all(not errors(doc, host) for host in converged), out
    print(f"doctor over {len(converged)} hosts: {wall:.1f}s wall, {doc['seconds']}s gather")
    assert wall < 60


@contextlib.contextmanager
def npu_state(*flags: str) -> Iterator[None]:
    before = json.loads(lab("npu", NODE, "--json").stdout)
    lab("npu", NODE, *flags)
    try:
        yield
    finally:
        for dev in before["devices"]:
            lab("npu", NODE, "--device", str(dev["id"]), "--health", dev["health"],
                     "--hbm-used-mb", str(dev["hbm_used_mb"]))
        lab("npu", NODE, "--driver", "loaded" if before.get("driver_loaded", True) else "unloaded")


@contextlib.contextmanager
def env_lines(*lines: str) -> Iterator[None]:
    env = _at("serving_env_file")
    on_doctor_node(f"cp -p {env} {env}.doctor-test && printf '%s\\n' {' '.join(lines)} >> {env}")
    try:
        yield
    finally:
        # Back through the link (the stable name points into the release directory).
        on_doctor_node(f"cat {env}.doctor-test > {env} && rm -f {env}.doctor-test")


@contextlib.contextmanager
def oom_line() -> Iterator[None]:
    # journalctl -u matches OBJECT_SYSTEMD_UNIT= from root (_UID=0): the line lands in the unit's journal.
    on_doctor_node("printf 'MESSAGE=RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\\n"
            "OBJECT_SYSTEMD_UNIT=atlas-serving.service\\nSYSLOG_IDENTIFIER=atlas-serving-launch\\n' "
            "| logger --journald && sleep 0.3")
    try:
        yield
    finally:
        time.sleep(1.1)  # the journal line and the restart fall in different seconds
        on_doctor_node("systemctl restart atlas-serving.service")
        wait_healthy()


@contextlib.contextmanager
def stamp_removed() -> Iterator[None]:
    stamps, link = _at("models_stamp_dir"), _at("models_path")
    on_doctor_node(f"rm -f {stamps}/model-atlas-tiny-llama-$(basename $(readlink {link})).json")
    try:
        yield
    finally:
        proc = playbook("playbooks/models.yml", "--limit", NODE)
        assert proc.returncode == 0, proc.stdout[-4000:]


FAULTS = {
    "npu-critical": (lambda: npu_state("--health", "Critical"), "npu-health", "Critical"),
    "driver-unloaded": (lambda: npu_state("--driver", "unloaded"), "npu-visible", "not loaded"),
    "hbm-over-limit": (lambda: npu_state("--hbm-used-mb", "31000"), "hbm", "above the profile's limit"),
    "device-id-list": (lambda: env_lines("ASCEND_DEVICE_ID=0,1,2,3"), "env-file", "ASCEND_RT_VISIBLE_DEVICES"),
    "fictional-env": (lambda: env_lines("VLLM_USE_CANN=1"), "env-file", "VLLM_USE_CANN"),
    "oom-in-journal": (oom_line, "oom", "NPU out of memory"),
    "model-stamp-missing": (stamp_removed, "model-stamp", "no verification stamp"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_injected_fault_is_found_then_cleared(converged, fault):
    inject, check, text = FAULTS[fault]
    with inject():
        rc, doc, out = doctor("-l", NODE, *NO_HANG)
        assert rc == 1, out
        found = [f for f in errors(doc) if f["check"] == check]
        assert found and any(text in f["message"] + f["evidence"] for f in found), out
        assert all(f["fix"] for f in found)
    rc, doc, out = doctor("-l", NODE, *NO_HANG)
    assert rc == 0, f"{fault} not cleared by its restore:\n{out}"


def test_hdk_installed_but_not_running_is_a_pending_reboot(converged):
    # As a driver stage run without driver_allow_reboot leaves a node: the record new, npu-smi old (a driver still
    # in CANN 8.5.0's window, 25.0.X to 25.5.X, so this is the one finding).
    info = "/usr/local/Ascend/driver/version.info"
    on_doctor_node(f"cp -p {info} {info}.doctor-test && sed -i 's/^Version=.*/Version=25.5.1/' {info}")
    try:
        rc, doc, out = doctor("-l", NODE, *NO_HANG)
        found = [f for f in doc["hosts"][NODE]["findings"] if f["check"] == "reboot-pending"]
        assert rc == 0 and found and "driver 25.5.1 is installed but 25.5.0 runs" in found[0]["message"], out
        assert "driver_allow_reboot=true" in found[0]["fix"]
    finally:
        on_doctor_node(f"mv -f {info}.doctor-test {info}")


def _unit() -> dict[str, str]:
    out = on_doctor_node("systemctl show -p ActiveState -p SubState -p NRestarts -p MainPID -p Result atlas-serving")
    return dict(line.split("=", 1) for line in out.split() if "=" in line)


def test_crash_loop_ends_failed_and_the_serving_stage_brings_it_back(converged):
    """SIGKILL the engine each time it comes up: systemd restarts it (RestartSec) until its start
    limit, then the unit stays failed; doctor names the start limit, the health stage fails, and the
    serving stage (a deliberate start) clears the limit and brings the engine back."""
    killer = ("for i in $(seq 1 400); do s=$(systemctl show -p ActiveState --value atlas-serving); "
              "[ \"$s\" = failed ] && { echo ended-failed; exit 0; }; "
              "p=$(systemctl show -p MainPID --value atlas-serving); "
              "[ \"$p\" != 0 ] && kill -9 \"$p\" 2>/dev/null; sleep 0.2; done; echo still-restarting")
    try:
        looped = on_doctor_node(killer)
        assert "ended-failed" in looped, f"the engine was still being restarted after 80 s: {_unit()}"
        time.sleep(7)  # longer than RestartSec: no restart comes any more
        unit = _unit()
        assert (unit["ActiveState"], unit["MainPID"]) == ("failed", "0"), unit
        rc, doc, out = doctor("-l", NODE, *NO_HANG)
        assert rc == 1 and any("start limit hit" in f["message"] for f in errors(doc)), out
        health = playbook("playbooks/health.yml", "--limit", NODE)
        assert health.returncode != 0 and "is failed" in health.stdout, health.stdout[-3000:]
    finally:
        served = playbook("playbooks/serving.yml", "--limit", NODE)
    assert served.returncode == 0, served.stdout[-4000:]
    wait_healthy()
    assert _unit()["ActiveState"] == "active"


def test_api_key_enforced_and_never_written_down(converged):
    key = "atlas-doctor-" + secrets.token_hex(16)
    log = Path(tempfile.mkdtemp(prefix="doctor-key-")) / "ansible.log"
    ENV["ANSIBLE_LOG_PATH"] = str(log)  # labtools.playbook runs with ENV
    try:
        keyed = playbook("playbooks/serving.yml", "--limit", NODE, "-e", f"serving_api_key={key}", "-v")
        assert keyed.returncode == 0, keyed.stdout[-4000:]
        wait_healthy()
        assert status("/v1/models") == 401
        assert status("/health") == 200
        assert status("/v1/models", key) == 200
        # another user on the node sees every process's command line, never the key (SGLang reads it
        # from its 0640 --config file in-process)
        seen = on_doctor_node("runuser -u nobody -- ps -eo pid,args")
        assert "sglang.launch_server" in seen and "--config" in seen, seen
        assert key not in seen, "the API key is in the process list"
        denied = lab("ssh", NODE, f"runuser -u nobody -- cat {_at('serving_release_dir')}/*/"
                          "atlas-serving.keys.yaml", check=False, timeout=60)
        assert "Permission denied" in denied.stdout + denied.stderr and key not in denied.stdout + denied.stderr
        rc, doc, out = doctor("-l", NODE, *NO_HANG)
        assert rc == 0, out
        assert not [f for f in doc["hosts"][NODE]["findings"] if f["check"] == "api-key"], out
        assert log.is_file() and log.stat().st_size > 0, f"no ansible log at {log}: the grep would prove nothing"
        leaks = [name for name, text in (("playbook stdout", keyed.stdout + keyed.stderr), ("doctor output", out))
                 if key in text]
        leaks += _grep_tree(log.parent, key.encode()) + _grep_tree(ROOT / "artifacts", key.encode())
        assert not leaks, f"the API key was written to: {leaks}"
    finally:
        ENV.pop("ANSIBLE_LOG_PATH", None)
        restored = playbook("playbooks/serving.yml", "--limit", NODE)
        assert restored.returncode == 0, restored.stdout[-4000:]
        wait_healthy()
    assert status("/v1/models", lab_api_key()) == 200 and status("/v1/models") == 401, "back on the lab's key"


def test_changed_host_key_makes_the_host_unreachable(converged, tmp_path):
    """Host key checking stays on: a known_hosts with another key for the node refuses it (exit 3)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    kind, blob = (tmp_path / "other.pub").read_text().split()[:2]
    address = lab_hosts()[NODE]["ansible_host"]
    (tmp_path / "known_hosts").write_text(f"{address} {kind} {blob}\n")
    hostvars = dict(lab_hosts()[NODE])
    # the node's own known_hosts replaced; its way there (the jump host's ProxyCommand, its known_hosts) kept
    common = hostvars["ansible_ssh_common_args"]
    known = common.split("UserKnownHostsFile=", 1)[1].split()[0]
    hostvars["ansible_ssh_common_args"] = common.replace(f"UserKnownHostsFile={known}",
                                                         f"UserKnownHostsFile={tmp_path / 'known_hosts'}", 1)
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"atlas_nodes": {"hosts": {NODE: hostvars}}}}}))
    proc = atlasctl("doctor", "-i", str(inv), check=False, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"{NODE}: UNREACHABLE" in proc.stdout and "Host key verification failed" in proc.stdout, proc.stdout
    assert f"unreachable: {NODE}" in proc.stdout
