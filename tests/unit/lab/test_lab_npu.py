"""The node's simulated driver layer: initial npu.json from lab.yml, version files, fault-test changes."""

from __future__ import annotations

import grp
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl.errors import UsageError
from atlaslab import config, npu
from atlaslab.doubles import lab_driver, npu_smi

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


# --- the driver's device nodes (atlas-lab-driver load) --------------------------------------------

NODES = ["davinci0", "davinci1", "davinci2", "davinci3", "davinci_manager", "devmm_svm", "hisi_hdc"]
FILES = (stat.S_IFREG, 0)  # what a unit test makes instead of /dev/null's character device


def _state(count: int = 4, loaded: bool = True) -> dict:
    return {"driver_loaded": loaded, "devices": [{"id": i} for i in range(count)]}


def test_load_makes_the_device_nodes_beside_a_test_state_never_in_dev(root: Path) -> None:
    env = {"NPU_SMI_STATE": str(root / npu.STATE_REL), "ATLAS_LAB_ASCEND": str(root / "usr/local/Ascend"),
           "PATH": os.environ["PATH"]}
    subprocess.run([sys.executable, str(root / npu.LAB_DRIVER_REL), "load"], env=env, check=True)
    dev = root / npu.STATE_REL.parent / "dev"
    assert sorted(p.name for p in dev.iterdir()) == sorted(NODES)
    assert {stat.S_IMODE(p.lstat().st_mode) for p in dev.iterdir()} == {0o660}
    if os.geteuid() == 0:  # the kind a node makes: /dev/null's character device
        assert {(stat.S_ISCHR(p.lstat().st_mode), p.lstat().st_rdev) for p in dev.iterdir()} == \
            {(True, os.makedev(1, 3))}


def test_sync_is_idempotent_follows_the_npu_count_and_removes_all_without_a_driver(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "null").write_text("")  # not the driver's: left alone
    (dev / "davinci7").write_text("")  # an NPU the node no longer has
    assert lab_driver.sync_devices(_state(), str(dev), FILES) == NODES
    inodes = {p.name: p.lstat().st_ino for p in dev.iterdir()}
    assert sorted(inodes) == sorted([*NODES, "null"])
    lab_driver.sync_devices(_state(), str(dev), FILES)
    assert {p.name: p.lstat().st_ino for p in dev.iterdir()} == inodes  # kept, not made again
    lab_driver.sync_devices(_state(2), str(dev), FILES)
    assert sorted(p.name for p in dev.iterdir()) == sorted(["davinci0", "davinci1", *NODES[4:], "null"])
    lab_driver.sync_devices(_state(loaded=False), str(dev), FILES)
    assert [p.name for p in dev.iterdir()] == ["null"]


def test_a_node_of_the_wrong_kind_mode_or_group_is_put_right(tmp_path: Path) -> None:
    path = tmp_path / "davinci0"
    path.mkdir()  # not a device at all
    lab_driver.ensure_node(str(path), os.getgid(), FILES)
    assert stat.S_ISREG(path.lstat().st_mode) and stat.S_IMODE(path.lstat().st_mode) == 0o660
    path.chmod(0o666)
    lab_driver.ensure_node(str(path), os.getgid(), FILES)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o660 and path.lstat().st_gid == os.getgid()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_as_root_each_npu_is_a_dev_null_clone_an_engine_can_hold(tmp_path: Path) -> None:
    lab_driver.sync_devices(_state(1), str(tmp_path), gid=0)
    node = tmp_path / "davinci0"
    assert stat.S_ISCHR(node.lstat().st_mode) and node.lstat().st_rdev == os.makedev(1, 3)
    fd = os.open(node, os.O_RDWR)
    os.close(fd)


def test_device_group_is_hwhiaiuser_when_the_node_has_it_else_root() -> None:
    assert lab_driver.device_gid("no-such-group-here") == 0
    assert lab_driver.device_gid(grp.getgrgid(os.getgid()).gr_name) == os.getgid()


# --- the driver's account on a new node -----------------------------------------------------------


def test_a_new_node_gets_the_driver_account_once(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "group").write_text("root:x:0:\nsystemd-journal:x:999:\nnogroup:x:65534:\n")
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nsystemd-network:x:998:998::/:/usr/sbin/nologin")
    (etc / "gshadow").write_text("root:*::\n")
    (etc / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    npu.add_driver_account(tmp_path)
    npu.add_driver_account(tmp_path)
    assert (etc / "group").read_text().endswith("nogroup:x:65534:\nHwHiAiUser:x:997:\n")
    assert (etc / "passwd").read_text().endswith(
        "/usr/sbin/nologin\nHwHiAiUser:x:997:997::/nonexistent:/usr/sbin/nologin\n")
    assert (etc / "gshadow").read_text() == "root:*::\nHwHiAiUser:!::\n"
    assert (etc / "shadow").read_text().count("HwHiAiUser:!:") == 1


def test_install_adds_the_account_to_a_new_node_only(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/group").write_text("root:x:0:\n")
    (tmp_path / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    cfg = config.parse(LAB, tmp_path / "lab.yml")
    npu.install(tmp_path, cfg, cfg.nodes[0])
    assert "HwHiAiUser:x:999:" in (tmp_path / "etc/group").read_text()
    (tmp_path / "etc/group").write_text("root:x:0:\n")  # removed on the node later: a power-on keeps that
    npu.install(tmp_path, cfg, cfg.nodes[0])
    assert (tmp_path / "etc/group").read_text() == "root:x:0:\n"
