"""The preflight role's NPU and driver-account checks (ansible-playbook on localhost) over atlas.serving.npu_facts
reading the npu-smi double: a compatible node passes, a firmware that does not match the driver is refused, NOK and
unknown are warned of when the release replaces the HDK, another driver account than the recorded one is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atlasctl.paths import suite_root

PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")

pytestmark = pytest.mark.role
ROLE_PLAY = """
- name: preflight role checks
  hosts: localhost
  gather_facts: false
  tasks:
    - name: NPU facts from the npu-smi double
      atlas.serving.npu_facts:
        npu_smi_path: "{{ fake_npu_smi }}"
    - name: npu
      ansible.builtin.include_role: {name: preflight, tasks_from: npu.yml}
    - name: account
      ansible.builtin.include_role: {name: preflight, tasks_from: driver_account.yml}
"""


def _role_play(tmp_path: Path, devices_extra: dict | None = None, install_info: str | None = None,
               **extra: object) -> subprocess.CompletedProcess:
    from atlaslab.doubles import npu_smi as double

    devices = [{"id": i, "chip": 0, "name": "910B3", "health": "OK", "power_w": 90.0, "temp_c": 40,
                "bus_id": f"0000:C{i}:00.0", "hbm_total_mb": 65536, "hbm_used_mb": 3318, "aicore_pct": 0}
               | (devices_extra or {}).get(i, {}) for i in range(2)]
    state = tmp_path / "npu.json"
    state.write_text(json.dumps({"format": 1, "driver_loaded": True, "driver_version": "24.1.rc2",
                                 "firmware_version": "7.5.0.1.129", "devices": devices}))
    exe = tmp_path / "npu-smi"
    exe.write_text(f'#!/bin/sh\nNPU_SMI_STATE={state} exec {sys.executable} {double.__file__} "$@"\n')
    exe.chmod(0o755)
    info = tmp_path / "ascend_install.info"
    if install_info is not None:
        info.write_text(install_info)
    (tmp_path / "play.yml").write_text(ROLE_PLAY)
    variables = {"fake_npu_smi": str(exe), "atlas_hardware": {"npu_model": "910B3", "npu_count": 2, "hbm_mb": 65536},
                 "preflight_ascend_install_info": str(info), "ansible_python_interpreter": sys.executable} | extra
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_ROLES_PATH=str(suite_root() / "roles"), ANSIBLE_LOCALHOST_WARNING="False")
    return subprocess.run([str(PLAYBOOK), "-i", "localhost,", "-c", "local", "-e", json.dumps(variables),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, timeout=300)


RECORD = "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nDriver_Install_Type=full\nDriver_Install_Status=complete\n"


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible is not installed in this virtualenv")
def test_role_passes_a_compatible_node_with_the_recorded_account(tmp_path: Path) -> None:
    proc = _role_play(tmp_path, install_info=RECORD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "driver and firmware compatible on NPU 0, 1" in proc.stdout


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible is not installed in this virtualenv")
def test_role_refuses_an_npu_whose_firmware_does_not_match_the_driver(tmp_path: Path) -> None:
    proc = _role_play(tmp_path, devices_extra={1: {"compatibility": "NOK"}})
    assert proc.returncode != 0
    assert "NPU 1: npu-smi info -t board says Compatibility NOK" in proc.stdout
    assert "driver 24.1.rc2" in proc.stdout and "firmware 7.5.0.1.129" in proc.stdout and "reboot" in proc.stdout


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible is not installed in this virtualenv")
def test_role_warns_of_nok_when_the_release_replaces_the_hdk_and_of_unknown(tmp_path: Path) -> None:
    proc = _role_play(tmp_path, devices_extra={0: {"compatibility": "NOK"}, 1: {"compatibility": "UNKNOWN"}},
                      driver_version="25.5.0", driver_firmware_version="7.8.0.2.212")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING NPU 0: npu-smi info -t board says Compatibility NOK" in proc.stdout
    assert "WARNING NPU 1: npu-smi info -t board says Compatibility UNKNOWN" in proc.stdout
    assert "23.0.RC2" in proc.stdout


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible is not installed in this virtualenv")
def test_role_refuses_a_driver_account_other_than_the_recorded_one(tmp_path: Path) -> None:
    proc = _role_play(tmp_path, install_info=RECORD.replace("UserGroup=HwHiAiUser", "UserGroup=ascend"),
                      driver_user="HwHiAiUser", driver_group="HwHiAiUser")
    assert proc.returncode != 0
    assert "UserName=HwHiAiUser UserGroup=ascend" in proc.stdout and "0x0095" in proc.stdout
    assert "driver_group=HwHiAiUser" in proc.stdout and "driver_group: ascend" in proc.stdout
    assert "/usr/local/Ascend/driver/script/uninstall.sh" in proc.stdout


@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible is not installed in this virtualenv")
def test_role_passes_a_node_without_an_install_record(tmp_path: Path) -> None:
    proc = _role_play(tmp_path, driver_user="someone")
    assert proc.returncode == 0, proc.stdout + proc.stderr
