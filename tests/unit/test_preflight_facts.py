"""atlas.serving.preflight_facts: everything preflight reads on a node in one call. The pieces
(module_utils/node_facts.py) directly, then the module through `ansible localhost`, its platform
facts compared with what `setup` itself reports on the same host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import node_facts

from atlasctl.paths import suite_root

ANSIBLE = Path(sys.executable).with_name("ansible")


def test_free_space_is_what_statvfs_says_and_a_missing_path_is_named(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    free, errors = node_facts.free_gib([str(tmp_path), str(tmp_path / "nope")])
    assert free == {str(tmp_path): round(st.f_bavail * st.f_frsize / 2**30, 2)}
    assert errors == {str(tmp_path / "nope"): f"{tmp_path / 'nope'} does not exist on the node"}


def test_an_install_path_not_made_yet_is_measured_where_it_will_be(tmp_path: Path) -> None:
    """A CANN version installs under the Ascend root, which a bare node may not have yet: its nearest existing
    directory's filesystem is the one that will hold it."""
    free, where = node_facts.free_gib_where(str(tmp_path / "usr/local/Ascend"))
    assert where == str(tmp_path) and free == node_facts.free_gib([str(tmp_path)])[0][str(tmp_path)]
    assert node_facts.free_gib_where(str(tmp_path))[1] == str(tmp_path)


def test_readable_means_a_regular_file_that_can_be_read(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text("{}")
    got = node_facts.readable([str(tmp_path / "m.json"), str(tmp_path), str(tmp_path / "gone")])
    assert got == {str(tmp_path / "m.json"): True, str(tmp_path): False, str(tmp_path / "gone"): False}


def test_exist_means_any_kind_of_path_links_followed(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    paths = [str(tmp_path / n) for n in ("f", "link", "dangling", "gone")] + [str(tmp_path), "/dev/null"]
    assert node_facts.exist(paths) == dict(zip(paths, [True, True, False, False, True, True], strict=True))


def _ansible(module: str, args: dict) -> dict:
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="0")
    proc = subprocess.run([str(ANSIBLE), "localhost", "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-m", module, "-a", json.dumps(args)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.split("=>", 1)[1])


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
def test_module_reads_everything_in_one_call_as_setup_and_the_fact_modules_do(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{}")
    args = {"npu_smi_path": str(tmp_path / "no-npu-smi"), "install_path": str(tmp_path / "Ascend"),
            "free_space": [str(tmp_path), "/nonexistent-path"], "readable": [str(tmp_path / "manifest.json")],
            "exist": [str(tmp_path), "/nonexistent-path"]}
    got = _ansible("atlas.serving.preflight_facts", args)
    setup = _ansible("ansible.builtin.setup", {"gather_subset": ["!all", "min"]})["ansible_facts"]
    facts = got["ansible_facts"]
    for key in ("architecture", "python_version", "service_mgr"):
        assert facts[key] == setup[f"ansible_{key}"], key
    npu = _ansible("atlas.serving.npu_facts", {"npu_smi_path": args["npu_smi_path"]})["ansible_facts"]["npu"]
    cann = _ansible("atlas.serving.cann_facts", {"install_path": args["install_path"]})["ansible_facts"]["cann"]
    assert facts["npu"] == npu and facts["npu"]["present"] is False and "not found" in facts["npu"]["error"]
    assert facts["cann"] == cann
    assert list(got["free_gib"]) == [str(tmp_path)] and got["free_gib"][str(tmp_path)] > 0
    assert "does not exist" in got["free_errors"]["/nonexistent-path"]
    assert got["readable"] == {str(tmp_path / "manifest.json"): True}
    assert got["exist"] == {str(tmp_path): True, "/nonexistent-path": False}
    assert got["install_path_measured"] == str(tmp_path) and got["install_path_free_gib"] > 0
    assert got["changed"] is False


# --- the preflight role's checks of the NPU boards and of the driver installer's account ---------------------

PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
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
