"""The driver role against localhost on a fake node root (the lab's NPU layer written by atlaslab.npu):
plan and order, the installers' argument rules kept for a first install and for an upgrade (the doubles refuse
what Huawei's install.sh refuses), one installer at a time (a failed firmware leaves the driver untouched), the
installers' exit 2 in the reboot decision (a first install ends so), the hot reset (a new driver runs at once unless
a process holds an NPU), manifest check before anything runs, reboot refused unless allowed, found again on the next
run, nothing to do after the boot, check mode, going back refused unless asked for and then run as --upgrade, a
package swapped in the bundle after its check never runs (the checked copy does), a bundle another account can write
refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

from atlaslab import npu
from atlaslab.doubles.hdk_run import CHIPS_READY_REL, FAIL_INSTALL_REL
from support.driver_nodes import DRIVER, FIRMWARE, FakeNode, make_bundle
from support.playbooks import ok, recap, swap_at_exec

pytestmark = [pytest.mark.role, pytest.mark.skipif(os.geteuid() != 0, reason="Huawei's HDK installers run as root")]


@pytest.fixture()
def node(tmp_path: Path, bundle: Path) -> FakeNode:
    return FakeNode(tmp_path, bundle)


@pytest.mark.slow
def test_check_mode_plans_and_changes_nothing(node: FakeNode) -> None:
    check = node.play("--check")
    assert check.returncode == 0, check.stdout[-4000:]
    out = " ".join(check.stdout.split())
    assert "upgrade: firmware, then driver: firmware upgrade 7.1.0.6.220 7.8.0.2.212; driver upgrade" in out
    assert recap(check)["changed"] == 0
    assert node.installed("driver") == "24.1.rc1" and node.running() == ("24.1.rc1", "7.1.0.6.220")


@pytest.mark.slow
def test_upgrade_in_order_stops_for_the_reboot_and_is_idempotent_after_it(node: FakeNode) -> None:
    first = node.play()
    assert first.returncode != 0
    out = " ".join(first.stdout.split())
    assert out.index("item=upgrade firmware 7.1.0.6.220 -> 7.8.0.2.212") < out.index("item=upgrade driver 24.1.rc1")
    # No process holds an NPU: the driver's hot reset runs it at once; the firmware waits for the reboot.
    assert ("installed but not running until the node reboots: firmware 7.8.0.2.212 (running: 7.1.0.6.220; its "
            "installer (upgrade) exited 2: reboot needed).") in out
    assert node.running() == (DRIVER, "7.1.0.6.220")
    assert (node.installed("driver"), node.installed("firmware")) == (DRIVER, FIRMWARE)
    # The upgrade passes the installers' rules: no --install-path, no account with --upgrade.
    assert node.installer_params("driver") == ["--upgrade --quiet --install-for-all"]
    assert node.installer_params("firmware") == ["--upgrade --quiet"]
    # Not rebooted: the next run finds the pending reboot without running an installer again.
    pending = node.play()
    assert pending.returncode != 0 and "installed but not running" in " ".join(pending.stdout.split())
    assert recap(pending)["changed"] == 0
    node.boot()
    assert ok(node.play())["changed"] == 0
    assert node.running() == (DRIVER, FIRMWARE)


@pytest.mark.slow
def test_first_install_passes_the_installers_rules(tmp_path: Path, bundle: Path) -> None:
    """A bare node: the driver with its path and account (--full), then the firmware. Like a real first install
    the driver's installer exits 2 (its chips do not all come up before a reboot): both wait for the reboot."""
    bare = FakeNode(tmp_path, bundle, installed=False)
    run = bare.play()
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and out.index("item=install driver") < out.index("item=install firmware")
    assert ("installed but not running until the node reboots: driver 25.5.0 (running: none; its installer (install) "
            "exited 2: reboot needed), firmware 7.8.0.2.212 (running: none; its installer (install) exited 2: reboot "
            "needed).") in out  # no driver loaded: npu-smi answers nothing
    path = bare.root / "usr/local/Ascend"
    assert bare.installer_params("driver") == [
        f"--full --quiet --install-path={path} --install-for-all --install-username=root --install-usergroup=root"]
    assert bare.installer_params("firmware") == ["--full --quiet"]
    assert (bare.installed("driver"), bare.installed("firmware")) == (DRIVER, FIRMWARE)
    assert not bare.loaded()
    assert (bare.sysroot / "etc/ascend_install.info").read_text().splitlines()[-3:] == [
        "Driver_Install_Status=complete", "Firmware_Install_Type=full", f"Firmware_Install_Path_Param={path}"]
    bare.boot()
    assert ok(bare.play())["changed"] == 0
    assert bare.running() == (DRIVER, FIRMWARE)


@pytest.mark.slow
def test_a_first_install_whose_chips_come_up_runs_the_driver_at_once(tmp_path: Path, bundle: Path) -> None:
    bare = FakeNode(tmp_path, bundle, installed=False)
    bare.hook(CHIPS_READY_REL)
    out = " ".join(bare.play().stdout.split())
    assert ("installed but not running until the node reboots: firmware 7.8.0.2.212 (running: 7.1.0.6.220; its "
            "installer (install) exited 2: reboot needed).") in out
    assert bare.loaded() and bare.running()[0] == DRIVER


def test_a_failed_firmware_step_stops_before_the_driver(node: FakeNode) -> None:
    """Each installer runs only when every one before it succeeded: the firmware (first in an upgrade) fails, the
    driver's installer never runs and the driver stays as it was; the play names the step and the log."""
    node.hook(FAIL_INSTALL_REL, "firmware\n")
    run = node.play()
    out = " ".join(run.stdout.split())
    assert run.returncode != 0, out[-3000:]
    assert ("the firmware step failed (upgrade 7.1.0.6.220 -> 7.8.0.2.212, exit status 1). Not run after it: "
            "upgrade driver 25.5.0. Its log on the node: /var/log/ascend_seclog/ascend_install.log.") in out
    assert "fail-install names firmware" in out
    assert node.installer_params("driver") == [] and node.installer_params("firmware") == ["--upgrade --quiet"]
    assert (node.installed("driver"), node.installed("firmware")) == ("24.1.rc1", "7.1.0.6.220")
    assert node.running() == ("24.1.rc1", "7.1.0.6.220")
    assert "Driver | install | run the installer, upgrade firmware 7.8.0.2.212" in out
    assert "Driver | install | run the installer, upgrade driver 25.5.0" not in out


class HeldUpgrade(NamedTuple):
    node: FakeNode
    run: subprocess.CompletedProcess
    holder_pid: int
    copy: Path
    pwned: Path


@pytest.fixture(scope="module")
def held_upgrade(tmp_path_factory: pytest.TempPathFactory, bundle: Path) -> HeldUpgrade:
    """One upgrade run that two tests read (an ansible-playbook run costs seconds of CPU): a process holds an NPU,
    and the account that can write the pushed bundle swaps its packages as each installer starts. Neither fault
    touches what the other test checks: the checked copies are Huawei's installers whatever the bundle holds,
    and the hot reset is the installer's, whichever file it was started from."""
    tmp = tmp_path_factory.mktemp("held-upgrade")
    node = FakeNode(tmp, bundle)
    copy = tmp / "pushed-bundle"
    subprocess.run(["cp", "-a", str(bundle), str(copy)], check=True)
    bindir, pwned = swap_at_exec(tmp, copy, "hdk/*.run")
    node.boot()  # the loaded driver's device nodes
    device = next((node.root / npu.STATE_REL).parent.glob("dev/davinci0"))
    with open(device) as held:
        holder = subprocess.Popen(["sleep", "300"], stdin=held, stdout=subprocess.DEVNULL)
    try:
        run = node.play(driver_bundle_dir=str(copy), path=bindir)
    finally:
        holder.kill()
        holder.wait()
    return HeldUpgrade(node, run, holder.pid, copy, pwned)


def test_a_process_holding_an_npu_stops_the_hot_reset(held_upgrade: HeldUpgrade) -> None:
    """Huawei's installer exits 2 when its hot reset fails, which it does while a process holds a davinci
    device: the driver then runs only after the reboot, and the role says so."""
    node, run = held_upgrade.node, held_upgrade.run
    out = " ".join(run.stdout.split())
    assert run.returncode != 0
    assert ("installed but not running until the node reboots: driver 25.5.0 (running: 24.1.rc1; its installer "
            "(upgrade) exited 2: reboot needed), firmware 7.8.0.2.212") in out
    assert node.running() == ("24.1.rc1", "7.1.0.6.220") and node.installed("driver") == DRIVER
    log = node.installer_log()
    assert f"hot reset not done: processes hold the NPUs: NPU 0: pid {held_upgrade.holder_pid} (sleep)" in log
    assert "Reboot needed for installation/upgrade to take effect!" in log


def test_tampered_package_is_refused_before_anything_runs(node: FakeNode, tmp_path: Path, bundle: Path) -> None:
    bad = tmp_path / "bad-bundle"
    subprocess.run(["cp", "-a", str(bundle), str(bad)], check=True)
    firmware = next((bad / "hdk").glob("*firmware*"))
    data = bytearray(firmware.read_bytes())
    data[len(data) // 2] ^= 0xFF
    firmware.write_bytes(bytes(data))
    run = node.play(driver_bundle_dir=str(bad))
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and "Refused before any installer ran" in out and firmware.name in out
    assert node.installed("driver") == "24.1.rc1" and node.installed("firmware") == "7.1.0.6.220"


def test_going_back_is_refused_naming_the_opt_in(node: FakeNode) -> None:
    run = node.play(driver_version="23.0.rc3", driver_firmware_version="")
    out = " ".join(run.stdout.split())
    assert run.returncode != 0 and "going back is a downgrade" in out and "driver_allow_downgrade=true" in out
    assert node.installed("driver") == "24.1.rc1"


def test_a_downgrade_asked_for_runs_upgrade_firmware_then_driver(node: FakeNode, tmp_path: Path) -> None:
    """driver_allow_downgrade: Huawei's installers' --upgrade to the older versions, firmware then driver."""
    older = make_bundle(tmp_path / "older-bundle", "23.0.rc3", "7.1.0.5.220")
    run = node.play(driver_version="23.0.rc3", driver_firmware_version="7.1.0.5.220", driver_bundle_dir=str(older),
                    driver_allow_downgrade=True)
    out = " ".join(run.stdout.split())
    assert ("downgrade: firmware, then driver: firmware downgrade 7.1.0.6.220 7.1.0.5.220; driver downgrade "
            "24.1.rc1 23.0.rc3") in out
    assert out.index("item=downgrade firmware") < out.index("item=downgrade driver")
    assert node.installer_params("driver") == ["--upgrade --quiet --install-for-all"]
    assert node.installer_params("firmware") == ["--upgrade --quiet"]
    assert (node.installed("driver"), node.installed("firmware")) == ("23.0.rc3", "7.1.0.5.220")
    assert "firmware 7.1.0.5.220 (running: 7.1.0.6.220; its installer (downgrade) exited 2" in out


def test_nothing_named_nothing_done(node: FakeNode) -> None:
    assert ok(node.play(driver_version="", driver_firmware_version=""))["changed"] == 0


def test_a_package_swapped_after_its_check_never_runs(held_upgrade: HeldUpgrade) -> None:
    """Every package is checked before the first runs; the account that can write the bundle swaps the
    driver package while the firmware installs. The checked copies run, and are removed after."""
    node, run = held_upgrade.node, held_upgrade.run
    assert "installed but not running until the node reboots" in " ".join(run.stdout.split()), run.stdout[-3000:]
    swapped = sorted((held_upgrade.copy / "hdk").glob("*.run"))  # the swap did happen: both packages replaced
    assert len(swapped) == 2 and all(path.read_text().startswith("#!/bin/sh\ntouch") for path in swapped)
    assert not held_upgrade.pwned.exists(), "a package swapped in the bundle after its check was run"
    assert (node.installed("driver"), node.installed("firmware")) == (DRIVER, FIRMWARE)
    assert list((node.tmp / "work").iterdir()) == []


def test_a_bundle_another_account_can_write_is_refused(node: FakeNode, tmp_path: Path, bundle: Path) -> None:
    copy = tmp_path / "pushed-bundle"
    subprocess.run(["cp", "-a", str(bundle), str(copy)], check=True)
    (copy / "hdk").chmod(0o775)
    run = node.play(driver_bundle_dir=str(copy))
    out = " ".join(run.stdout.split())
    assert run.returncode != 0
    assert f"{copy / 'hdk'}: owner root (0), group root (0), mode 0775: writable by its group" in out
    assert f"fix: chown -R root:root {copy} && chmod -R go-w {copy}" in out
    assert node.installed("driver") == "24.1.rc1" and node.installed("firmware") == "7.1.0.6.220"
