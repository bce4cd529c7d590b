"""The node's simulated driver layer: initial npu.json from lab.yml, version files, fault-test changes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl.errors import UsageError
from atlaslab import config, npu
from atlaslab.doubles import npu_smi

LAB = {
    "lab_name": "atlas", "bridge": "atlasbr0", "subnet": "10.77.0.0/24",
    "driver_version": "24.1.rc1", "firmware_version": "7.1.0.6.220",
    "nodes": [{"name": "n1", "npu": {"model": "910B4", "count": 4, "hbm_mb": 32768}}],
}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    cfg = config.parse(LAB, tmp_path / "lab.yml")
    npu.install(tmp_path, cfg, cfg.nodes[0])
    return tmp_path


def test_install_writes_the_driver_layer(root: Path) -> None:
    state = json.loads((root / npu.STATE_REL).read_text())
    assert len(state["devices"]) == 4 and state["driver_loaded"] is True
    assert {d["name"] for d in state["devices"]} == {"910B4"}
    assert {d["hbm_total_mb"] for d in state["devices"]} == {32768}
    assert len({d["bus_id"] for d in state["devices"]}) == 4
    assert (root / npu.NPU_SMI_REL).stat().st_mode & 0o111
    assert "Version=24.1.rc1\n" in (root / npu.DRIVER_INFO_REL).read_text()
    assert (root / npu.FIRMWARE_INFO_REL).read_text().startswith("Version=7.1.0.6.220\n")
    assert "Driver_Install_Path_Param=/usr/local/Ascend" in (root / npu.INSTALL_INFO_REL).read_text()


def test_initial_state_renders_through_the_simulator(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_SMI_STATE", str(root / npu.STATE_REL))
    out = io.StringIO()
    assert npu_smi.main(["info"], out) == 0
    assert out.getvalue().count("910B4") == 4


def test_install_keeps_existing_state(root: Path) -> None:
    npu.update_file(root, health="Alarm")
    (root / npu.DRIVER_INFO_REL).write_text("Version=25.5.0\n")  # an HDK installed on the node survives power-on
    cfg = config.parse(LAB, root / "lab.yml")
    npu.install(root, cfg, cfg.nodes[0])
    assert {d["health"] for d in json.loads((root / npu.STATE_REL).read_text())["devices"]} == {"Alarm"}
    assert (root / npu.DRIVER_INFO_REL).read_text() == "Version=25.5.0\n"


def test_boot_unit_loads_the_installed_driver(root: Path) -> None:
    unit = root / npu.BOOT_UNIT_LINK_REL
    assert unit.is_symlink()
    assert "ExecStart=/usr/local/sbin/atlas-lab-driver load" in (root / npu.BOOT_UNIT_REL).read_text()
    env = {"NPU_SMI_STATE": str(root / npu.STATE_REL), "ATLAS_LAB_ASCEND": str(root / "usr/local/Ascend")}
    (root / npu.DRIVER_INFO_REL).write_text("Version=25.5.0\n")
    tool = [sys.executable, str(root / npu.LAB_DRIVER_REL)]
    assert subprocess.run([*tool, "running", "driver"], env=env, capture_output=True, text=True).stdout == "24.1.rc1\n"
    subprocess.run([*tool, "load"], env=env, check=True)
    assert subprocess.run([*tool, "running", "driver"], env=env, capture_output=True, text=True).stdout == "25.5.0\n"


def test_update_one_device(root: Path) -> None:
    state = npu.update_file(root, device=2, health="Critical", hbm_used_mb=30000)
    assert [d["health"] for d in state["devices"]] == ["OK", "OK", "Critical", "OK"]
    assert state["devices"][2]["hbm_used_mb"] == 30000
    assert json.loads((root / npu.STATE_REL).read_text()) == state


def test_driver_unload_and_reload(root: Path) -> None:
    assert npu.update_file(root, driver="unloaded")["driver_loaded"] is False
    assert npu.update_file(root, driver="loaded")["driver_loaded"] is True


@pytest.mark.parametrize(
    ("changes", "match"),
    [({"device": 9}, "--device 9"), ({"health": "Bad"}, "--health"), ({"hbm_used_mb": 40000}, "--hbm-used-mb"),
     ({"driver": "maybe"}, "--driver")],
)
def test_invalid_changes_name_the_option(root: Path, changes: dict, match: str) -> None:
    before = (root / npu.STATE_REL).read_text()
    with pytest.raises(UsageError, match=match):
        npu.update_file(root, **changes)
    assert (root / npu.STATE_REL).read_text() == before
