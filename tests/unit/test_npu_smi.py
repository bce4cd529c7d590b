"""npu-smi parsing (module_utils/npu_smi.py) and atlas.serving.npu_facts: tables of outputs -> facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import npu_smi

from atlasctl.paths import suite_root
from atlaslab.doubles import npu_smi as simulator

# docs/ascend-platform.md section 6, verbatim (a real 8 x 910B3 64 GB machine; NPUs 2-7 elided there).
SECTION_6 = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc1.b030            Version: 24.1.rc1.b030                                        |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 101.8       43                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3318 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 92.0        39                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3314 / 65536         |
+===========================+===============+====================================================+
... (NPUs 2-7, Bus-Id 81/82/01/02/41/42:00.0)
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
"""

SECTION_6_DEVICES = [
    {"id": 0, "chip": 0, "name": "910B3", "health": "OK", "power_w": 101.8, "temp_c": 43, "aicore_pct": 0,
     "hbm_used_mb": 3318, "hbm_total_mb": 65536, "memory_used_mb": 0, "memory_total_mb": 0,
     "bus_id": "0000:C1:00.0"},
    {"id": 1, "chip": 0, "name": "910B3", "health": "OK", "power_w": 92.0, "temp_c": 39, "aicore_pct": 0,
     "hbm_used_mb": 3314, "hbm_total_mb": 65536, "memory_used_mb": 0, "memory_total_mb": 0,
     "bus_id": "0000:C2:00.0"},
]  # fmt: skip

# Columns shifted: wider name cell, narrower metrics, five-digit HBM, busy NPU, process rows.
SHIFTED = """\
+----------------------------------------------------------------------------------------------------+
| npu-smi 23.0.6                          Version: 23.0.6                                            |
+-------------------------------+-----------+--------------------------------------------------------+
| NPU   Name                    | Health    | Power(W)  Temp(C)  Hugepages-Usage(page)               |
| Chip                          | Bus-Id    | AICore(%) Memory-Usage(MB) HBM-Usage(MB)               |
+===============================+===========+========================================================+
| 4     910B2C                  | Warning   | 312.4 71 0 / 0                                         |
| 0                             | 0000:01:00.0 | 87 0 / 0 58626/ 65536                               |
+===============================+===========+========================================================+
| 5     910B1                   | Critical  | NA  NA   0    / 0                                      |
| 0                             | 0000:02:00.0 | 0 0    / 0 0    / 65536                             |
+===============================+===========+========================================================+
+-------------------------------+-----------+--------------------------------------------------------+
| NPU     Chip                  | Process id    | Process name             | Process memory(MB)      |
+===============================+===============+==========================+=========================+
| 4       0                     | 182733        | python3.11               | 55012                   |
| 4       0                     | 182734        | sglang::scheduler        | 310                     |
+===============================+===============+==========================+=========================+
| No running processes found in NPU 5                                                                |
+===============================+===============+==========================+=========================+
"""

BOARD = """\
        NPU ID                         : 0
        Product Name                   : IT21PDDA01
        Software Version               : 24.1.rc1
        Firmware Version               : 7.5.0.1.129
        Compatibility                  : OK
        PCIe Bus Info                  : 0000:C1:00.0
        PCI Device ID                  : 0xD802
        Chip Count                     : 1
"""


@pytest.mark.parametrize(
    ("text", "version", "devices", "processes"),
    [
        (SECTION_6, "24.1.rc1.b030", SECTION_6_DEVICES, []),
        (
            SHIFTED,
            "23.0.6",
            [
                {"id": 4, "chip": 0, "name": "910B2C", "health": "Warning", "power_w": 312.4, "temp_c": 71,
                 "aicore_pct": 87, "hbm_used_mb": 58626, "hbm_total_mb": 65536, "memory_used_mb": 0,
                 "memory_total_mb": 0, "bus_id": "0000:01:00.0"},
                {"id": 5, "chip": 0, "name": "910B1", "health": "Critical", "power_w": None, "temp_c": None,
                 "aicore_pct": 0, "hbm_used_mb": 0, "hbm_total_mb": 65536, "memory_used_mb": 0,
                 "memory_total_mb": 0, "bus_id": "0000:02:00.0"},
            ],
            [
                {"npu": 4, "chip": 0, "pid": 182733, "name": "python3.11", "memory_mb": 55012},
                {"npu": 4, "chip": 0, "pid": 182734, "name": "sglang::scheduler", "memory_mb": 310},
            ],
        ),
        ("", None, [], []),
        ("dcmi module initialize failed. ret is -8005\n", None, [], []),
    ],
    ids=["section-6-literal", "shifted-columns", "empty", "driver-error-text"],
)  # fmt: skip
def test_parse_info(text: str, version, devices, processes) -> None:
    got = npu_smi.parse_info(text)
    assert got == {"version": version, "devices": devices, "processes": processes}


def _sim_state(**overrides) -> dict:
    names = ["910B1", "910B2C", "910B3", "910B4", "910B3", "910B3", "910B3", "910B3"]
    health = ["OK", "Warning", "Alarm", "Critical", "OK", "OK", "OK", "OK"]
    devices = []
    for i in range(8):
        devices.append({
            "id": i, "chip": 0, "name": names[i], "health": health[i], "power_w": 90.5 + i, "temp_c": 40 + i,
            "bus_id": f"0000:{('C1', 'C2', '81', '82', '01', '02', '41', '42')[i]}:00.0",
            "hbm_total_mb": 65536 if names[i] != "910B4" else 32768,
            "hbm_used_mb": 58626 if i == 2 else 3318, "aicore_pct": 12 * i,
            "processes": [{"pid": 4000 + i, "name": "python3", "memory_mb": 55000}] if i == 2 else [],
        })  # fmt: skip
    state = {"format": 1, "driver_loaded": True, "driver_version": "24.1.rc1", "firmware_version": "7.5.0.1.129",
             "npu_smi_version": "24.1.rc1.b030", "devices": devices}  # fmt: skip
    state.update(overrides)
    return state


def test_parse_simulator_output_all_names_and_health_values() -> None:
    state = _sim_state()
    got = npu_smi.parse_info(simulator.render_info(state))
    assert got["version"] == "24.1.rc1.b030"
    assert [d["name"] for d in got["devices"]] == [d["name"] for d in state["devices"]]
    assert [d["health"] for d in got["devices"]] == ["OK", "Warning", "Alarm", "Critical", "OK", "OK", "OK", "OK"]
    assert [(d["hbm_used_mb"], d["hbm_total_mb"]) for d in got["devices"]] == [
        (d["hbm_used_mb"], d["hbm_total_mb"]) for d in state["devices"]
    ]
    assert [d["bus_id"] for d in got["devices"]] == [d["bus_id"] for d in state["devices"]]
    assert [d["aicore_pct"] for d in got["devices"]] == [12 * i for i in range(8)]
    assert got["processes"] == [{"npu": 2, "chip": 0, "pid": 4002, "name": "python3", "memory_mb": 55000}]


def test_five_digit_hbm_prints_as_in_the_notes() -> None:
    """Guard the fixture: the simulator prints '58626/ 65536' and we read it."""
    text = simulator.render_info(_sim_state())
    assert "58626/ 65536" in text
    assert npu_smi.parse_info(text)["devices"][2]["hbm_used_mb"] == 58626


def test_parse_board() -> None:
    board = npu_smi.parse_board(BOARD)
    assert board["Software Version"] == "24.1.rc1"
    assert board["PCI Device ID"] == "0xD802"
    assert board["PCIe Bus Info"] == "0000:C1:00.0"
    assert board["Chip Count"] == "1"


# --- gather(): the real simulator CLI run as npu-smi ----------------------------------------


def _install_sim(tmp_path: Path, state: dict | None) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    state_path = tmp_path / "npu.json"
    if state is not None:
        state_path.write_text(json.dumps(state))
    exe = bindir / "npu-smi"
    exe.write_text(f'#!/bin/sh\nNPU_SMI_STATE={state_path} exec {sys.executable} {simulator.__file__} "$@"\n')
    exe.chmod(0o755)
    return exe


def _runner(argv: list) -> tuple[int, str, str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return proc.returncode, proc.stdout, proc.stderr


def test_gather_from_simulator(tmp_path: Path) -> None:
    exe = _install_sim(tmp_path, _sim_state())
    facts = npu_smi.gather(_runner, path_env=str(exe.parent))
    assert facts["present"] is True and facts["error"] is None
    assert facts["count"] == 8 and facts["npu_smi_path"] == str(exe)
    assert facts["health_ok"] is False  # Warning, Alarm, Critical present
    assert facts["hbm_total_mb"] == 7 * 65536 + 32768
    assert facts["hbm_used_mb"] == 58626 + 7 * 3318
    assert facts["board"]["PCI Device ID"] == "0xD802"
    assert facts["board"]["Firmware Version"] == "7.5.0.1.129"


def test_gather_all_ok_is_health_ok(tmp_path: Path) -> None:
    state = _sim_state()
    for dev in state["devices"]:
        dev["health"] = "OK"
    facts = npu_smi.gather(_runner, npu_smi_path=str(_install_sim(tmp_path, state)))
    assert facts["health_ok"] is True


@pytest.mark.parametrize(
    ("state", "error"),
    [
        ({"driver_loaded": False}, "exited 255: dcmi module initialize failed. ret is -8005"),
        (None, "-8005"),  # no state file: the simulator behaves as a missing driver
    ],
    ids=["driver-not-loaded", "no-state"],
)
def test_gather_driver_failure_is_a_fact_not_an_exception(tmp_path: Path, state, error: str) -> None:
    exe = _install_sim(tmp_path, _sim_state(**state) if state is not None else None)
    facts = npu_smi.gather(_runner, npu_smi_path=str(exe))
    assert facts["present"] is False and facts["count"] == 0 and error in facts["error"]


def test_gather_without_npu_smi(tmp_path: Path) -> None:
    facts = npu_smi.gather(_runner, path_env=str(tmp_path))
    if facts["npu_smi_path"] is None:  # a real npu-smi in /usr/local/bin would be found on a real node
        assert facts["present"] is False and "npu-smi not found" in facts["error"]
    missing = npu_smi.gather(_runner, npu_smi_path=str(tmp_path / "nope"))
    assert missing["present"] is False and str(tmp_path / "nope") in missing["error"]


def test_gather_unparseable_output_is_not_present(tmp_path: Path) -> None:
    exe = tmp_path / "npu-smi"
    exe.write_text("#!/bin/sh\necho 'something new'\n")
    exe.chmod(0o755)
    facts = npu_smi.gather(_runner, npu_smi_path=str(exe))
    assert facts["present"] is False and "listed no NPU" in facts["error"]


# --- the module through ansible --------------------------------------------------------------

ANSIBLE = Path(sys.executable).parent / "ansible"


@pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible is not installed in this virtualenv")
@pytest.mark.parametrize("loaded", [True, False])
def test_npu_facts_module(tmp_path: Path, loaded: bool) -> None:
    exe = _install_sim(tmp_path, _sim_state(driver_loaded=loaded))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(suite_root() / "collections"),
               ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)  # fmt: skip
    proc = subprocess.run(
        [str(ANSIBLE), "localhost", "-o", "--check", "-m", "atlas.serving.npu_facts", "-a", f"npu_smi_path={exe}"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.split("=>", 1)[1])
    npu = result["ansible_facts"]["npu"]
    assert result["changed"] is False
    assert npu["present"] is loaded and npu["count"] == (8 if loaded else 0)
    if not loaded:
        assert "-8005" in npu["error"]
