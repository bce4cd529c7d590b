"""The HDK (driver and firmware): the install plan, and the installer doubles run for real with the lab's
running-version helper (installed vs running, exit status 2 = reboot needed, load at boot)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import hdk

from atlasctl.bundle import BundleSpec, _kind_and_version
from atlasctl.errors import UsageError
from atlaslab.doubles.cann_run import CannBuildError
from atlaslab.doubles.hdk_run import CHIPS_READY_REL, FAIL_INSTALL_REL, hdk_package_files
from support.hdk_nodes import bare, installed, make_node, raw, root_only, run, running

DRV, FW = "hdk/drv.run", "hdk/fw.run"


def kinds_and_ops(plan: dict) -> list[tuple[str, str]]:
    return [(s["kind"], s["op"]) for s in plan["steps"]]


def test_first_installation_is_driver_then_firmware() -> None:
    plan = hdk.plan("", "", "25.5.0", "7.8.0.2.212", DRV, FW)
    assert kinds_and_ops(plan) == [("driver", "install"), ("firmware", "install")]
    assert plan["problem"] == "" and plan["order"].startswith("first installation")


def test_upgrade_is_firmware_then_driver() -> None:
    plan = hdk.plan("24.1.rc1", "7.1.0.6.220", "25.5.0", "7.8.0.2.212", DRV, FW)
    assert kinds_and_ops(plan) == [("firmware", "upgrade"), ("driver", "upgrade")]
    assert plan["steps"][1]["from"] == "24.1.rc1" and plan["steps"][1]["file"] == DRV


def test_nothing_to_do_and_parts_left_alone() -> None:
    assert hdk.plan("25.5.0", "7.8.0.2.212", "25.5.0", "7.8.0.2.212", DRV, FW)["steps"] == []
    assert kinds_and_ops(hdk.plan("24.1.rc1", "7.1.0.6.220", "24.1.0", "", DRV, FW)) == [("driver", "upgrade")]


def test_going_back_is_refused_naming_the_opt_in() -> None:
    plan = hdk.plan("25.5.0", "7.8.0.2.212", "24.1.rc1", "", DRV, FW)
    assert plan["steps"] == [] and plan["order"] == "refused"
    assert "driver_allow_downgrade=true" in plan["problem"] and "24.1.rc1" in plan["problem"]


def test_a_downgrade_asked_for_is_upgrade_steps_in_the_upgrade_order() -> None:
    """Huawei's installer performs --upgrade to an older version: asked for, the plan is firmware then driver."""
    plan = hdk.plan("25.5.0", "7.8.0.2.212", "24.1.rc1", "7.1.0.6.220", DRV, FW, allow_downgrade=True)
    assert kinds_and_ops(plan) == [("firmware", "downgrade"), ("driver", "downgrade")]
    assert plan["order"] == "downgrade: firmware, then driver" and plan["problem"] == ""
    mixed = hdk.plan("25.5.0", "7.1.0.6.220", "24.1.rc1", "7.8.0.2.212", DRV, FW, allow_downgrade=True)
    assert kinds_and_ops(mixed) == [("firmware", "upgrade"), ("driver", "downgrade")]
    assert mixed["order"].startswith("downgrade")
    # asked for, a newer version is still an upgrade
    assert hdk.plan("24.1.rc1", "", "25.5.0", "", DRV, FW, allow_downgrade=True)["order"].startswith("upgrade")


def test_installer_exit_statuses() -> None:
    """hicann/driver install.sh: 0 running, 2 reboot needed, anything else failed; no run (check mode) is 0."""
    assert [hdk.installer_outcome(rc) for rc in (0, 2, 1, 127, None)] == [
        "running", "reboot", "failed", "failed", "running"]


def test_installer_error_lines() -> None:
    out = ("[Driver] [2025-01-01 10:00:00] [INFO]Start time: 2025-01-01 10:00:00\n"
           "[Driver] [2025-01-01 10:00:00] [ERROR]ERR_NO:0x0095;ERR_DES:The user and group are not same with last "
           "installation,do not support overwriting installation\n"
           "[Driver] [2025-01-01 10:00:00] [ERROR]ERR_NO:0x0004;ERR_DES: Unrecognized parameters: --x. Try it\n"
           "[Firmware] [2025-01-01 10:00:00] [ERROR]Failed to upgrade\n")
    assert hdk.installer_errors(out) == [
        {"code": "0x0095", "description": "The user and group are not same with last installation,do not support "
                                          "overwriting installation"},
        {"code": "0x0004", "description": "Unrecognized parameters: --x. Try it"}]
    assert hdk.installer_errors("") == []


def test_pending_merges_npu_smi_and_installer_exit_2() -> None:
    wanted = {"driver": "25.5.0", "firmware": "7.8.0.2.212"}
    step = {"kind": "firmware", "op": "upgrade", "from": "7.1.0.6.220", "to": "7.8.0.2.212", "file": FW}
    assert hdk.pending(wanted, {"driver": "25.5.0", "firmware": "7.8.0.2.212"}) == []
    assert hdk.pending(wanted, {"driver": "25.5.0", "firmware": "7.8.0.2.212"}, [step]) == [
        "firmware 7.8.0.2.212 (its installer (upgrade) exited 2: reboot needed)"]
    assert hdk.pending(wanted, {"driver": "none", "firmware": "7.1.0.6.220"}, [step]) == [
        "driver 25.5.0 (running: none)",
        "firmware 7.8.0.2.212 (running: 7.1.0.6.220; its installer (upgrade) exited 2: reboot needed)"]
    assert hdk.pending({"driver": "", "firmware": ""}, {}) == []


def test_firmware_without_any_driver_is_refused() -> None:
    assert "needs an installed driver" in hdk.plan("", "", "", "7.8.0.2.212", DRV, FW)["problem"]


def test_bad_versions_are_named() -> None:
    assert "25.x" in hdk.plan("", "", "25.x", "", DRV, FW)["problem"]
    assert "7,8" in hdk.plan("25.5.0", "", "25.5.0", "7,8", DRV, FW)["problem"]


def test_version_order_and_running_match() -> None:
    assert hdk.driver_key("24.1.rc3") < hdk.driver_key("24.1.0") < hdk.driver_key("25.5.0")
    assert hdk.same_version("24.1.rc1.b030", "24.1.rc1") and hdk.same_version("25.5.0", "25.5.0")
    assert not hdk.same_version("24.1.rc1", "25.5.0") and not hdk.same_version("none", "")


def test_package_names() -> None:
    names = [s.file_name for s in hdk_package_files("25.5.0", "7.8.0.2.212", "aarch64")]
    assert names == ["Ascend-hdk-910b-npu-driver_25.5.0_linux-aarch64.run",
                     "Ascend-hdk-910b-npu-firmware_7.8.0.2.212.run"]
    with pytest.raises(CannBuildError, match="7.8"):
        hdk_package_files("25.5.0", "7.8")


def test_bundle_spec_and_manifest_kinds(tmp_path: Path) -> None:
    spec = tmp_path / "b.yml"
    spec.write_text("name: x\nhdk:\n  - {driver: 25.5.0, firmware: 7.8.0.2.212}\n")
    assert BundleSpec.load(spec).extra["hdk"] == [{"driver": "25.5.0", "firmware": "7.8.0.2.212"}]
    spec.write_text("name: x\nhdk:\n  - 25.5.0\n")
    with pytest.raises(UsageError, match="driver and firmware"):
        BundleSpec.load(spec)
    assert _kind_and_version("hdk/Ascend-hdk-910b-npu-firmware_7.8.0.2.212.run") == ("firmware", "7.8.0.2.212")
    assert _kind_and_version("hdk/Ascend-hdk-910b-npu-driver_25.5.0_linux-x86_64.run") == ("driver", "25.5.0")


# --- the installer doubles, for real ---------------------------------------------------------------------


@pytest.fixture()
def node(tmp_path: Path) -> dict:
    return make_node(tmp_path)


@root_only
def test_upgrade_exits_2_and_runs_after_the_boot_load(node: dict) -> None:
    fw = run(node, "firmware", "--upgrade")
    assert fw.returncode == 2, fw.stdout + fw.stderr
    assert "Reboot" in fw.stdout and installed(node, "firmware") == "7.8.0.2.212"
    drv = run(node, "driver", "--upgrade")
    assert drv.returncode == 2 and "Driver package upgraded successfully! Reboot needed" in drv.stdout
    assert installed(node, "driver") == "25.5.0" and running(node) == ("24.1.rc1", "7.1.0.6.220")
    record = (Path(node["env"]["ATLAS_HDK_SYSROOT"]) / "etc/ascend_install.info").read_text()
    assert f"Driver_Install_Path_Param={node['ascend']}" in record
    subprocess.run([str(node["helper"]), "load"], env=node["env"], check=True)  # what the node does at boot
    assert running(node) == ("25.5.0", "7.8.0.2.212")
    again = run(node, "driver", "--upgrade")
    assert again.returncode == 0, again.stdout + again.stderr


@root_only
def test_a_first_driver_install_exits_2_and_runs_after_the_boot(node: dict) -> None:
    """hicann/driver install.sh: a first install (no driver before, none loaded, no --force) exits 2 unless every
    chip reports boot status 16; the driver runs after the reboot. The firmware needs the driver installed first."""
    bare(node)
    fw_first = run(node, "firmware", "--full")
    assert fw_first.returncode == 1 and "install the driver first" in fw_first.stdout
    drv = run(node, "driver", "--full")
    assert drv.returncode == 2, drv.stdout + drv.stderr
    assert "[WARNING]There are some chips not ready, please check after reboot" in drv.stdout
    assert "[INFO]Driver package installed successfully! Reboot needed for installation/upgrade to take effect!" \
        in drv.stdout
    assert installed(node, "driver") == "25.5.0" and running(node)[0] == "none"
    assert run(node, "firmware", "--full").returncode == 2
    subprocess.run([str(node["helper"]), "load"], env=node["env"], check=True)  # what the node does at boot
    assert running(node) == ("25.5.0", "7.8.0.2.212")


@root_only
def test_a_first_driver_install_whose_chips_come_up_runs_at_once(node: dict) -> None:
    bare(node)
    (node["sysroot"] / CHIPS_READY_REL).parent.mkdir(parents=True, exist_ok=True)
    (node["sysroot"] / CHIPS_READY_REL).touch()
    drv = run(node, "driver", "--full")
    assert drv.returncode == 0, drv.stdout + drv.stderr
    assert "Driver package installed successfully! The new version takes effect immediately." in drv.stdout
    assert running(node)[0] == "25.5.0"


@root_only
@pytest.mark.parametrize("kind", ["firmware", "driver"])
def test_the_fail_install_hook_fails_that_installer_and_writes_nothing(node: dict, kind: str) -> None:
    hook = node["sysroot"] / FAIL_INSTALL_REL
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text(f"{kind}\n")
    record = (node["sysroot"] / "etc/ascend_install.info").read_text()
    failed = run(node, kind, "--upgrade")
    assert failed.returncode == 1 and f"fail-install names {kind}" in failed.stdout
    assert (installed(node, "driver"), installed(node, "firmware")) == ("24.1.rc1", "7.1.0.6.220")
    assert (node["sysroot"] / "etc/ascend_install.info").read_text() == record
    other = "driver" if kind == "firmware" else "firmware"
    assert run(node, other, "--upgrade").returncode in (0, 2)


@root_only
@pytest.mark.parametrize(("pkg", "args", "message"), [
    # hicann/driver scripts/package/driver/common/scripts/install.sh, unsupportParam and the option loop
    ("driver", ["--upgrade", "--quiet", "--install-path=/usr/local/Ascend"],
     "ERR_NO:0x0004;ERR_DES:install-path param need used with full/run/docker/devel."),
    ("driver", ["--upgrade", "--quiet", "--install-username=root", "--install-usergroup=root", "--install-for-all"],
     "ERR_NO:0x0004;ERR_DES:install-username and install-usergroup params need used with full/run/docker/devel."),
    ("driver", ["--full", "--quiet", "--install-username=atlas"],
     "ERR_DES:Username and usergroup are not specified at the same time."),
    ("driver", ["--full", "--quiet", "--install-username=root", "--install-usergroup=root"],
     "ERR_NO:0x0091;ERR_DES:username not permission for root"),
    ("driver", ["--quiet"], "ERR_NO:0x0004;ERR_DES:param need used with full/run/docker/upgrade/devel."),
    ("driver", ["--full", "--upgrade", "--quiet"], "ERR_DES:param need used with full/run/docker/upgrade/devel."),
    ("driver", ["--uninstall", "--quiet"], "ERR_DES:version/uninstall/check can't use with other parameters."),
    ("driver", ["--install", "--quiet"], "ERR_DES: Unrecognized parameters: --install."),
    ("driver", ["--full", "--quiet", "--install-path="], "ERR_NO:0x0003;ERR_DES:install path is null"),
    # the firmware: only what its documentation shows
    ("firmware", ["--upgrade", "--quiet", "--install-path=/usr/local/Ascend"], "Unrecognized parameters"),
])
def test_the_driver_installers_argument_rules(node: dict, pkg: str, args: list[str], message: str) -> None:
    refused = raw(node, pkg, "--nox11", *args)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"[ERROR]{message}" in refused.stdout if message.startswith("ERR_NO") else message in refused.stdout
    assert (installed(node, "driver"), installed(node, "firmware")) == ("24.1.rc1", "7.1.0.6.220")


@root_only
def test_the_hot_reset_runs_the_new_driver_unless_a_process_holds_an_npu(node: dict, tmp_path: Path) -> None:
    """With npu-smi answering and no process on an NPU the upgrade's hot reset succeeds: exit 0, the new driver
    runs at once. A process in npu-smi's process table makes it fail: exit 2, reboot needed."""
    smi = tmp_path / "npu-smi"
    table = tmp_path / "npu-smi.out"
    table.write_text("| 0       0                 | 4242          | vllm                     | 3000"
                     "                    |\n")
    smi.write_text(f"#!/bin/sh\ncat {table}\n")
    smi.chmod(0o755)
    node["env"]["ATLAS_LAB_NPU_SMI"] = str(smi)
    held = run(node, "driver", "--upgrade")
    assert held.returncode == 2 and "NPU 0: pid 4242 (vllm)" in held.stdout + held.stderr
    assert running(node)[0] == "24.1.rc1"
    table.write_text("| No running processes found in NPU 0 |\n")
    (node["ascend"] / "driver/version.info").write_text("Version=24.1.rc1\n")
    free = run(node, "driver", "--upgrade")
    assert free.returncode == 0 and "Driver package upgraded successfully! The new version takes effect" in free.stdout
    assert running(node)[0] == "25.5.0"


@root_only
def test_refusals_name_the_fix(node: dict) -> None:
    nouser = raw(node, "driver", "--nox11", "--quiet", f"--install-path={node['ascend']}", "--full",
                 "--install-username=atlas-no-such-user", "--install-usergroup=root", "--install-for-all")
    assert nouser.returncode == 1 and "[ERROR]ERR_NO:0x0095;ERR_DES:The user and group are not same" in nouser.stdout
    (node["sysroot"] / "etc/ascend_install.info").write_text(f"Driver_Install_Path_Param={node['ascend']}\n")
    nouser = raw(node, "driver", "--nox11", "--quiet", f"--install-path={node['ascend']}", "--full",
                 "--install-username=atlas-no-such-user", "--install-usergroup=root", "--install-for-all")
    assert nouser.returncode == 1 and "useradd" in nouser.stdout and installed(node, "driver") == "24.1.rc1"
    assert raw(node, "firmware", "--uninstall").returncode == 1
    data = bytearray(node["driver"].read_bytes())
    data[-100] ^= 1
    node["driver"].write_bytes(bytes(data))
    # makeself's own integrity check exits 2 too (the role checks every copy's sha256 before it runs one)
    assert run(node, "driver", "--upgrade").returncode == 2 and installed(node, "driver") == "24.1.rc1"


@root_only
def test_upgrade_to_an_older_driver_is_performed(node: dict) -> None:
    """Huawei's driver installer has no "older refused" rule: --upgrade to an older version installs it."""
    (node["ascend"] / "driver/version.info").write_text("Version=26.0.rc1\n")
    back = run(node, "driver", "--upgrade")
    assert back.returncode == 2, back.stdout + back.stderr
    assert "Driver package upgraded successfully!" in back.stdout and installed(node, "driver") == "25.5.0"
