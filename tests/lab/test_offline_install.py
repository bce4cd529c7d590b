"""Air-gapped install on lab nodes: no route out, bundle verify -> CANN -> engine offline and
idempotent; tampered bundles refused before anything runs; power-off mid-install recovers;
CANN upgrade and downgrade read back. Runs on atlas-n3/atlas-n4 (the light SGLang stand-in)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labtools import (
    ENV,
    LEVEL_B,
    ROOT,
    atlasctl,
    cann_versions,
    lab,
    lab_hosts,
    on_node,
    playbook,
    release_hdk,
)

from atlasctl.bundle import write_manifest
from atlaslab.paths import bundle_dir
from atlaslab.signing import sign_bundle

pytestmark = pytest.mark.lab

LAB_BUNDLE = Path("/var/lib/atlas-lab/bundle")
PUSHED = "/var/lib/atlas/bundle"
NODE = "atlas-n3"
SCRATCH = "atlas-n4"


def recap(output: str) -> dict[str, dict[str, int]]:
    """Totals of each host's PLAY RECAP lines (several playbooks in one run: summed)."""
    stats: dict[str, dict[str, int]] = {}
    for match in re.finditer(r"^(\S+)\s+:\s+(ok=\d+.*)$", output, re.M):
        host = stats.setdefault(match[1], {})
        for key, value in (kv.split("=") for kv in match[2].split()):
            host[key] = host.get(key, 0) + int(value)
    return stats


def ssh(host: str, *argv: str, check: bool = True, timeout: int = 120) -> str:
    return on_node(host, argv, check=check, timeout=timeout).stdout


def npu_board(host: str) -> dict[str, str]:
    out = ssh(host, "npu-smi", "info", "-t", "board", "-i", "0")
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines()) if v}


def installer_steps(output: str) -> list[str]:
    """The HDK installers a driver run started, in order (roles/driver, install_step.yml: one task per step)."""
    return re.findall(r"^TASK \[[^\]]*run the installer, (\w+ \w+) ", output, re.M)


def boot_id(host: str) -> str:
    return ssh(host, "cat", "/proc/sys/kernel/random/boot_id").strip()


def test_hdk_upgrade_runs_firmware_then_driver_and_reboots_a_node_that_serves_nothing(fresh_lab):
    # The lab's nodes start on driver 24.1.rc1 / firmware 7.1.0.6.220; the release names 25.5.0 / 7.8.0.2.212.
    # A fresh node serves nothing: the driver's hot reset runs the new driver at once, the new firmware needs the
    # reboot, which the driver stage does itself (the lab inventory no longer allows reboots for every node).
    boot_id = ssh(SCRATCH, "cat", "/proc/sys/kernel/random/boot_id")
    upgraded = playbook("playbooks/driver.yml", "--limit", SCRATCH)
    assert upgraded.returncode == 0, upgraded.stdout[-3000:]
    assert installer_steps(upgraded.stdout) == ["upgrade firmware", "upgrade driver"], upgraded.stdout[-3000:]
    assert "changed: [atlas-n4]" in upgraded.stdout.split("Driver | reboot | reboot to run")[1].split("TASK")[0]
    assert ssh(SCRATCH, "cat", "/proc/sys/kernel/random/boot_id") != boot_id
    board = npu_board(SCRATCH)
    assert (board["Software Version"], board["Firmware Version"]) == ("25.5.0", "7.8.0.2.212")

    again = playbook("playbooks/driver.yml", "--limit", SCRATCH)
    assert again.returncode == 0 and recap(again.stdout)[SCRATCH]["changed"] == 0, again.stdout[-3000:]


def test_no_route_out_and_offline_install_converges(fresh_lab):
    probe = "import socket; socket.create_connection(('192.0.2.1', 80), 3)"
    out = on_node(NODE, ["python3", "-c", probe], check=False, timeout=60)
    assert out.returncode != 0 and "unreachable" in (out.stdout + out.stderr).lower()
    # the lab's bundle, against the key the lab's generated inventory pins
    assert atlasctl("bundle", "verify", str(bundle_dir()), "-i", "inventory/lab").returncode == 0
    stages = ("playbooks/preflight.yml", "playbooks/cann.yml", "playbooks/engines.yml")
    t0 = time.monotonic()
    first = playbook(*stages, "--limit", NODE)
    assert first.returncode == 0, first.stdout[-5000:]
    t1 = time.monotonic()
    second = playbook(*stages, "--limit", NODE)
    assert second.returncode == 0, second.stdout[-5000:]
    assert recap(second.stdout)[NODE]["changed"] == 0, second.stdout[-5000:]
    print(f"offline install {t1 - t0:.0f}s, second run {time.monotonic() - t1:.0f}s")
    assert cann_versions(NODE) == {"toolkit": "8.5.0", "kernels": "8.5.0", "nnal": "8.5.0"}
    pip = "/opt/atlas/engines/sglang-standin-0.5.6/bin/pip"
    dl = on_node(NODE, [pip, "download", "--no-deps", "--timeout", "5", "--retries", "0", "-d", "/tmp/dl", "six"],
                 check=False, timeout=120)
    assert dl.returncode != 0, "a node reached a package index"


@pytest.fixture(scope="module")
def small_bundle(fresh_lab, tmp_path_factory) -> Path:
    """A copy of the lab bundle with CANN 8.5.0 and the stand-in wheels only (small to push)."""
    root = tmp_path_factory.mktemp("small-bundle")
    for path in (LAB_BUNDLE / "cann").glob("*_8.5.0_*"):
        (root / "cann").mkdir(exist_ok=True)
        shutil.copy2(path, root / "cann" / path.name)
    shutil.copytree(LAB_BUNDLE / "wheels/sglang-standin-0.5.6", root / "wheels/sglang-standin-0.5.6")
    write_manifest(root, "small")
    sign_bundle(root)  # signatures are required: the lab's own key (lab/signing.py)
    return root


def _push(src: Path) -> dict:
    run = atlasctl("bundle", "push", "-i", "inventory/lab", "--limit", SCRATCH, "--src", str(src),
                   "--dest", PUSHED, "--json", check=False, timeout=300)
    return json.loads(run.stdout or "{}") | {"rc": run.returncode, "stderr": run.stderr}


def test_push_is_delta_and_verified_on_the_node(small_bundle):
    first = _push(small_bundle)
    assert first["rc"] == 0 and first["verified"], first
    assert first["hosts"][0]["files_sent"] >= 4
    again = _push(small_bundle)
    assert again["rc"] == 0 and again["hosts"][0]["files_sent"] == 0, again


def _tamper(kind: str, rel: str) -> str:
    path = f"{PUSHED}/{rel}"
    code = {
        "flip": f"p='{path}'; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=1; open(p,'wb').write(b)",
        "truncate": f"import os; p='{path}'; os.truncate(p, os.path.getsize(p)//2)",
        "missing": f"import os; os.remove('{path}')",
    }[kind]
    ssh(SCRATCH, "python3", "-c", code)
    return path


@pytest.mark.parametrize("kind, stage, rel_glob", [
    ("flip", "playbooks/cann.yml", "cann/Ascend-cann-toolkit_8.5.0_*"),
    ("missing", "playbooks/cann.yml", "cann/Ascend-cann-toolkit_8.5.0_*"),
    ("truncate", "playbooks/engines.yml", "wheels/sglang-standin-0.5.6/*.whl"),
])
def test_tampered_bundle_is_refused_before_anything_runs(small_bundle, kind, stage, rel_glob):
    assert _push(small_bundle)["rc"] == 0  # restore the good copy (delta: only the damaged file moves)
    rel = next(small_bundle.glob(rel_glob)).relative_to(small_bundle).as_posix()
    _tamper(kind, rel)
    run = playbook(stage, "--limit", SCRATCH, "-e", f"atlas_bundle_dir={PUSHED}")
    text = " ".join(run.stdout.split())
    assert run.returncode != 0
    assert Path(rel).name in text, text[-3000:]
    assert {"flip": "does not match", "missing": "missing", "truncate": "mismatch"}[kind] in text.lower()
    if stage.endswith("cann.yml"):
        assert "cann" not in ssh(SCRATCH, "ls", "/usr/local/Ascend", check=False), "an installer ran"
    else:
        assert "sglang-standin" not in ssh(SCRATCH, "ls", "/opt/atlas/engines", check=False)
    verify = atlasctl("bundle", "push", "-i", "inventory/lab", "--limit", SCRATCH, "--src", str(small_bundle),
                      "--dest", PUSHED, check=False, timeout=300)
    assert verify.returncode == 0  # pushing again repairs the node's copy


FANOUT = "/var/lib/atlas/fanout-bundle"


def test_fanout_push_sends_the_bundle_once_and_every_node_verifies_it(small_bundle):
    """docs/fleet-scale.md on the lab: the controller sends to the plan's root only, the other serving nodes pull
    from peers that verified the bundle, each verifying it; a second push moves nothing; no staging server stays."""
    def push() -> tuple[subprocess.CompletedProcess, dict]:
        run = atlasctl("bundle", "push", "-i", "inventory/lab", "--src", str(small_bundle), "--dest", FANOUT,
                       "--fan-out", "--json", check=False, timeout=900)
        return run, json.loads(run.stdout or "{}")

    nodes = sorted(lab_hosts())
    try:
        run, report = push()
        assert run.returncode == 0 and report.get("verified") is True, run.stdout[-3000:] + run.stderr[-3000:]
        assert report["mode"] == "fan-out" and report["controller_ratio"] <= 1.2, report
        via = {h["host"]: h["via"] for h in report["hosts"]}
        assert sorted(via) == nodes and [h for h, v in via.items() if v == "controller"] == report["roots"]
        assert all(v in nodes for h, v in via.items() if h not in report["roots"]), via  # from a peer
        run, again = push()
        assert run.returncode == 0 and again["verified"] is True, run.stderr[-3000:]
        assert all(h["files_sent"] == 0 and h["bytes_received"] == 0 for h in again["hosts"]), again
        for node in nodes:
            assert "gone" in ssh(node, "sh", "-c", "test -e /run/atlas-fanout || echo gone"), node
    finally:
        for node in nodes:
            ssh(node, "rm", "-rf", FANOUT, check=False)


def test_power_off_during_toolkit_install_recovers(fresh_lab):
    host = SCRATCH
    ssh(host, "mkdir", "-p", "/etc/atlas-lab")
    ssh(host, "sh", "-c", "echo 60 > /etc/atlas-lab/cann-install-delay")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("ansible-playbook")), "-i", "inventory/lab",
                             "playbooks/cann.yml", "--limit", host], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "cann-8.5.0" in ssh(host, "ls", "/usr/local/Ascend", check=False):
            break
        time.sleep(1)
    else:
        proc.kill()
        pytest.fail("the toolkit installer never started")
    lab("power", host, "off", timeout=120)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, "the play should fail when its node powers off"
    lab("power", host, "on", timeout=300)
    ssh(host, "rm", "-f", "/etc/atlas-lab/cann-install-delay")
    run = playbook("playbooks/cann.yml", "--limit", host)
    assert run.returncode == 0, run.stdout[-5000:]
    again = playbook("playbooks/cann.yml", "--limit", host)
    assert recap(again.stdout)[host]["changed"] == 0, again.stdout[-3000:]
    assert cann_versions(host) == {"toolkit": "8.5.0", "kernels": "8.5.0", "nnal": "8.5.0"}


def test_upgrade_and_back(fresh_lab):
    host = SCRATCH
    seen = []
    for version in ("8.3.RC2", "8.5.0", "8.3.RC2"):
        run = playbook("playbooks/cann.yml", "--limit", host, "-e", f"cann_version={version}")
        assert run.returncode == 0, run.stdout[-5000:]
        seen.append(cann_versions(host)["toolkit"])
        assert cann_versions(host) == {"toolkit": version, "kernels": version, "nnal": version}
    assert seen == ["8.3.RC2", "8.5.0", "8.3.RC2"]


# A real first driver installation exits 2 ("There are some chips not ready, please check after reboot"; Huawei's
# install.sh, docs/ascend-platform.md): the driver runs only after a reboot, which the driver stage does on a node
# that serves nothing. Then a run changes nothing. On a lab of its own (make ci-lab): two reboots of a node.
@pytest.mark.ci_lab
def test_first_driver_install_reboots_on_the_installers_word_then_changes_nothing(fresh_lab):
    host = SCRATCH
    # the driver as Huawei's installer leaves it (with its uninstaller), whatever ran on this node before
    installed = playbook("playbooks/driver.yml", "--limit", host)
    assert installed.returncode == 0, installed.stdout[-3000:]
    ssh(host, "bash", "/usr/local/Ascend/driver/script/uninstall.sh")
    ssh(host, "rm", "-f", "/etc/atlas-lab/chips-ready")
    lab("power", host, "off", timeout=120)
    lab("power", host, "on", timeout=300)
    assert on_node(host, ["npu-smi", "info"], check=False, timeout=60).returncode != 0, "a driver still runs"
    before = boot_id(host)
    first = playbook("playbooks/driver.yml", "--limit", host)
    assert first.returncode == 0, first.stdout[-4000:]
    assert installer_steps(first.stdout)[:1] == ["install driver"], first.stdout[-4000:]
    log = ssh(host, "cat", "/var/log/ascend_seclog/ascend_install.log")
    assert "There are some chips not ready" in log and "Reboot needed" in log, log[-2000:]
    assert "exited 2" in first.stdout, first.stdout[-4000:]
    assert boot_id(host) != before, "the node was not rebooted"
    assert npu_board(host)["Software Version"] == release_hdk().split("/")[0]
    again = playbook("playbooks/driver.yml", "--limit", host)
    assert again.returncode == 0 and recap(again.stdout)[host]["changed"] == 0, again.stdout[-3000:]


# Huawei's order on an upgrade is firmware, then driver: a firmware installer that fails stops the driver stage
# there, and the driver stays as it was, installed and running.
@pytest.mark.ci_lab
def test_a_failing_firmware_step_leaves_the_driver_untouched(fresh_lab):
    host = SCRATCH
    driver, firmware = (npu_board(host)[k] for k in ("Software Version", "Firmware Version"))
    record = ssh(host, "cat", "/usr/local/Ascend/driver/version.info")
    level_b = ["-e", f"driver_version={LEVEL_B['driver_version']}",
               "-e", f"driver_firmware_version={LEVEL_B['driver_firmware_version']}"]
    ssh(host, "sh", "-c", "mkdir -p /etc/atlas-lab && echo firmware > /etc/atlas-lab/fail-install")
    try:
        failed = playbook("playbooks/driver.yml", "--limit", host, *level_b)
    finally:
        ssh(host, "rm", "-f", "/etc/atlas-lab/fail-install")
    assert failed.returncode != 0, failed.stdout[-3000:]
    assert installer_steps(failed.stdout) == ["upgrade firmware"], failed.stdout[-3000:]
    said = " ".join(failed.stdout.split())
    assert "the firmware step failed" in said and "Not run after it: upgrade driver" in said, said[-2000:]
    assert ssh(host, "cat", "/usr/local/Ascend/driver/version.info") == record
    assert (npu_board(host)["Software Version"], npu_board(host)["Firmware Version"]) == (driver, firmware)
    moved = playbook("playbooks/driver.yml", "--limit", host, *level_b)
    assert moved.returncode == 0, moved.stdout[-3000:]
    assert installer_steps(moved.stdout) == ["upgrade firmware", "upgrade driver"], moved.stdout[-3000:]
    board = npu_board(host)
    assert (board["Software Version"], board["Firmware Version"]) == (LEVEL_B["driver_version"],
                                                                        LEVEL_B["driver_firmware_version"])
