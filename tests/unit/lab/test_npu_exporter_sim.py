"""The lab's npu-exporter simulator: Huawei npu-exporter's names and labels, computed from the simulated NPUs (npu.json
through the npu-smi simulator's code, the NPU ports through the hccn_tool double's), served on 127.0.0.1 from a state
under tmp_path; installed on every lab node as a unit started at boot."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils.progress import samples

from atlaslab import config, npu
from atlaslab.doubles import hccn_tool, npu_exporter, npu_smi
from support.monitoring_names import exported

LAB = {
    "lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
    "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
    "nodes": [{"name": "n1", "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}}],
}
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture()
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = config.parse(LAB, tmp_path / "lab.yml")
    npu.install(tmp_path, cfg, cfg.nodes[0])
    (tmp_path / "proc").mkdir()
    monkeypatch.setenv("NPU_SMI_STATE", str(tmp_path / npu.STATE_REL))
    monkeypatch.setenv("HCCN_TOOL_STATE", str(tmp_path / npu.HCCN_STATE_REL))
    monkeypatch.setenv("ATLAS_LAB_DEV_DIR", str(tmp_path / "dev"))
    monkeypatch.setenv("NPU_SMI_PROC", str(tmp_path / "proc"))
    monkeypatch.setenv("HCCN_TOOL_FABRIC", str(tmp_path / "fabric"))
    return tmp_path


@pytest.fixture()
def url(root: Path):
    server = npu_exporter.server("127.0.0.1", 0, npu_exporter.Collector(npu_smi=npu_smi, hccn_tool=hccn_tool))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def scrape(url: str) -> dict[str, dict[str, float]]:
    """{name: {npu id (or "" for a machine series): value}}."""
    with OPENER.open(f"{url}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    out: dict[str, dict[str, float]] = {}
    for name, labels, value in samples(text):
        out.setdefault(name, {})[labels.get("id", "")] = value
    return out


def test_a_healthy_node(url: str) -> None:
    got = scrape(url)
    assert got["machine_npu_nums"] == {"": 4}
    assert got["npu_chip_info_health_status"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert got["npu_chip_info_link_status"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    # a new node's NPU ports have no address yet: net health Init, not Success
    assert set(got["npu_chip_info_network_status"].values()) == {0}
    assert set(got["npu_chip_info_hbm_total_memory"].values()) == {32768}
    assert all(0 < v < 32768 for v in got["npu_chip_info_hbm_used_memory"].values())
    assert "npu_chip_info_error_code" not in got  # reported only while a chip has one
    assert set(got["npu_chip_info_hbm_ecc_double_bit_error_cnt"].values()) == {0}


def test_labels_are_npu_exporters_card_labels(url: str) -> None:
    with OPENER.open(f"{url}/metrics", timeout=10) as response:
        found = [labels for name, labels, _ in samples(response.read().decode())
                 if name == "npu_chip_info_health_status"]
    assert [set(lab) for lab in found] == [{"id", "model_name", "vdie_id", "pcie_bus_info", "namespace", "pod_name",
                                            "container_name"}] * 4
    assert found[0]["model_name"] == "910B4-Ascend-V1" and found[0]["pcie_bus_info"] == "0000:C1:00.0"
    assert len({lab["vdie_id"] for lab in found}) == 4


def test_health_set_by_atlas_lab_npu_shows_at_the_next_scrape(root: Path, url: str) -> None:
    npu.update_file(root, device=1, health="Critical")  # what `atlas-lab npu NODE --device 1 --health Critical` does
    got = scrape(url)
    assert got["npu_chip_info_health_status"] == {"0": 1, "1": 0, "2": 1, "3": 1}
    assert got["npu_chip_info_error_code"] == {"1": int(npu_smi.HEALTH_ERROR_CODE, 16)}
    npu.update_file(root, health="Warning")
    assert set(scrape(url)["npu_chip_info_health_status"].values()) == {0}


def test_a_link_down_and_net_health_from_the_hccn_tool_state(root: Path, url: str) -> None:
    npu.update_network_file(root, device=2, link="DOWN")  # `atlas-lab npu NODE --device 2 --link down`
    got = scrape(url)
    assert got["npu_chip_info_link_status"] == {"0": 1, "1": 1, "2": 0, "3": 1}
    state = json.loads((root / npu.HCCN_STATE_REL).read_text())
    for dev in state["devices"]:
        dev.update(address=f"10.20.0.{dev['id'] + 10}", netmask="255.255.255.0", netdetect="10.20.0.1")
    (root / npu.HCCN_STATE_REL).write_text(json.dumps(state))
    assert scrape(url)["npu_chip_info_network_status"] == {"0": 1, "1": 1, "2": 0, "3": 1}


def test_unreadable_ports_and_an_unloaded_driver_are_unknown(root: Path, url: str) -> None:
    (root / npu.HCCN_STATE_REL).unlink()
    got = scrape(url)
    assert set(got["npu_chip_info_link_status"].values()) == {-1}
    assert set(got["npu_chip_info_network_status"].values()) == {-1}
    npu.update_file(root, driver="unloaded")
    got = scrape(url)
    assert got["npu_chip_info_health_status"] == {"0": -1, "1": -1, "2": -1, "3": -1}
    assert set(got) == {"machine_npu_nums", "npu_chip_info_health_status"}


def test_hbm_in_use_and_ecc_counts(root: Path, url: str) -> None:
    npu.update_file(root, device=0, hbm_used_mb=30000)
    state = json.loads((root / npu.STATE_REL).read_text())
    state["devices"][3]["hbm_ecc_double_bit_errors"] = 2
    (root / npu.STATE_REL).write_text(json.dumps(state))
    got = scrape(url)
    assert got["npu_chip_info_hbm_used_memory"]["0"] == 30000
    assert got["npu_chip_info_hbm_ecc_double_bit_error_cnt"] == {"0": 0, "1": 0, "2": 0, "3": 2}


def test_only_metrics_is_served(url: str) -> None:
    with pytest.raises(urllib.error.HTTPError) as exc:
        OPENER.open(f"{url}/", timeout=10)
    assert exc.value.code == 404


def test_it_exports_exactly_the_npu_exporter_names_the_monitoring_tests_know(url: str, root: Path) -> None:
    npu.update_file(root, device=0, health="Alarm")  # so that the error code is there too
    assert set(scrape(url)) == exported("npu-exporter")


def _port_in_range() -> int:
    for port in range(npu_exporter.PORT_RANGE[1], npu_exporter.PORT_RANGE[0], -7):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in npu-exporter's range")


def test_the_command_line_as_the_unit_runs_it(root: Path) -> None:
    """The installed script, with the doubles where the lab installs them (here: under root)."""
    script = root / npu.NPU_EXPORTER_REL
    env = {**os.environ, "ATLAS_LAB_NPU_SMI": str(root / npu.NPU_SMI_REL),
           "ATLAS_LAB_HCCN_TOOL": str(root / npu.HCCN_TOOL_REL)}
    bad = subprocess.run([sys.executable, str(script), "-port", "80"], env=env, capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "-port 80 is outside [1025-40000]" in bad.stderr
    port = _port_in_range()
    proc = subprocess.Popen([sys.executable, str(script), "-ip", "127.0.0.1", "-port", str(port), "-updateTime", "5"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                got = scrape(f"http://127.0.0.1:{port}")
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "the simulator did not answer"
                time.sleep(0.1)
        assert got["machine_npu_nums"] == {"": 4}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_installed_on_every_node_as_a_unit_started_at_boot(root: Path) -> None:
    assert (root / npu.NPU_EXPORTER_REL).read_text() == npu.NPU_EXPORTER.read_text()
    assert (root / npu.NPU_EXPORTER_REL).stat().st_mode & 0o111
    unit = (root / npu.NPU_EXPORTER_UNIT_REL).read_text()
    assert f"ExecStart=/{npu.NPU_EXPORTER_REL} -port 8082 " in unit and "WantedBy=multi-user.target" in unit
    assert os.readlink(root / npu.NPU_EXPORTER_UNIT_LINK_REL) == f"/{npu.NPU_EXPORTER_UNIT_REL}"


def test_the_lab_inventory_names_the_unit_the_lab_installs() -> None:
    import yaml

    common = yaml.safe_load((Path(__file__).resolve().parents[3] / "inventory/lab/group_vars/all.yml").read_text())
    assert common["monitoring_npu_exporter_unit"] == npu.NPU_EXPORTER_UNIT
