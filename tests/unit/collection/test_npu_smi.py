"""npu-smi parsing (module_utils/npu_smi.py) and atlas.serving.npu_facts: tables of outputs -> facts; every
layout over the vendor excerpts in tests/fixtures/vendor/npu_smi/ (SOURCES.md); every NPU's board checked."""

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
from support.npu_smi_text import SECTION_6

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

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "npu_smi"

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


# --- the vendor excerpts -----------------------------------------------------------------------------------


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_parse_info_of_the_24_1_table_of_eight_npus() -> None:
    got = npu_smi.parse_info(_fixture("info_910b_8npu_24.1.txt"))
    assert got["version"] == "24.1.0.3" and got["processes"] == []
    assert [d["id"] for d in got["devices"]] == list(range(8))
    assert {d["name"] for d in got["devices"]} == {"910B2"} and {d["health"] for d in got["devices"]} == {"OK"}
    assert got["devices"][0] == {"id": 0, "chip": 0, "name": "910B2", "health": "OK", "power_w": 96.4, "temp_c": 37,
                                 "aicore_pct": 0, "hbm_used_mb": 3397, "hbm_total_mb": 65536, "memory_used_mb": 0,
                                 "memory_total_mb": 0, "bus_id": "0000:C1:00.0"}


def test_parse_info_of_the_wider_26_0_rc2_table_reads_the_same() -> None:
    got = npu_smi.parse_info(_fixture("info_910b_26.0.rc2_wide.txt"))
    assert got["version"] == "26.0.rc2"
    assert [d for d in got["devices"]] == SECTION_6_DEVICES


def test_parse_health_without_c() -> None:
    assert npu_smi.parse_health(_fixture("health_910b.txt")) == {
        "npu_id": 0, "chip_count": 1, "chips": [{"chip": 0, "health": "OK"}], "others": []}
    assert npu_smi.parse_health(_fixture("health_910b_mcu.txt"))["others"] == [{"name": "MCU", "health": "OK"}]


def test_parse_health_of_a_310b_reads_chip_id_before_health() -> None:
    text = "\tNPU ID                         : 0\n\tChip Count                     : 1\n\n" \
           "\tChip ID                        : 0\n\tHealth                         : Alarm\n\n"
    assert npu_smi.parse_health(text)["chips"] == [{"chip": 0, "health": "Alarm"}]


def test_parse_chip_health_with_and_without_errors() -> None:
    assert npu_smi.parse_chip_health(_fixture("health_chip_ok.txt")) == {
        "health": "OK", "error_codes": [], "error_information": []}
    got = npu_smi.parse_chip_health(_fixture("health_chip_errors.txt"))
    assert got["health"] == "Alarm" and got["error_codes"] == ["80E18005", "80E38003"]
    assert len(got["error_information"]) == 2 and "overtemperature" in got["error_information"][1]


def test_parse_board_reads_compatibility() -> None:
    ok, nok = npu_smi.parse_board(_fixture("board_910b_ok.txt")), npu_smi.parse_board(_fixture("board_910b_nok.txt"))
    assert list(ok)[:8] == ["NPU ID", "Product Name", "Model", "Manufacturer", "Serial Number", "Software Version",
                            "Firmware Version", "Compatibility"]
    assert (ok["Compatibility"], nok["Compatibility"]) == ("OK", "NOK")
    assert nok["Software Version"] == "24.1.rc2" and nok["Firmware Version"] == "7.1.0.6.220"


def test_parse_boards_splits_prints_of_several_npus() -> None:
    second = _fixture("board_910b_nok.txt").replace(f"\t{'NPU ID':<30} : 0", f"\t{'NPU ID':<30} : 1")
    text = _fixture("board_910b_ok.txt") + "\n" + second
    boards = npu_smi.parse_boards(text)
    assert [(b["NPU ID"], b["Compatibility"]) for b in boards] == [("0", "OK"), ("1", "NOK")]
    assert npu_smi.parse_boards("") == []


def test_parse_list() -> None:
    got = npu_smi.parse_list(_fixture("list_910b_8npu.txt"))
    assert got == {"total": 8, "npus": [{"id": i, "chip_count": 1} for i in range(8)]}


# --- check_boards(): every NPU's board -------------------------------------------------------------------


def _board(compat: str = "OK", driver: str = "24.1.rc2", firmware: str = "7.5.0.1.129") -> dict[str, str]:
    return {"Software Version": driver, "Firmware Version": firmware, "Compatibility": compat}


def test_check_boards_all_ok() -> None:
    assert npu_smi.check_boards([0, 1], [_board(), _board()]) == {"errors": [], "warnings": []}


def test_check_boards_nok_names_the_npus_versions_and_fix() -> None:
    got = npu_smi.check_boards([0, 1, 2], [_board(), _board("NOK", firmware="7.1.0.6.220"),
                                           _board("NOK", firmware="7.1.0.6.220")])
    nok = [e for e in got["errors"] if "Compatibility NOK" in e]
    assert len(nok) == 1 and nok[0].startswith("NPU 1, 2: ")
    assert "driver 24.1.rc2" in nok[0] and "firmware 7.1.0.6.220" in nok[0] and "reboot" in nok[0]
    assert any("do not run the same driver and firmware" in e for e in got["errors"])


@pytest.mark.parametrize(
    ("board", "words"),
    [
        (_board("UNKNOWN"), ["Compatibility UNKNOWN", "broken", "23.0.RC2"]),
        (_board("NOT SUPPORT"), ["not run as root"]),
        ({"Software Version": "24.1.rc2", "Firmware Version": "7.5.0.1.129"}, ["no Compatibility line"]),
        ({}, ["npu-smi info -t board failed"]),
    ],
    ids=["unknown", "not-root", "no-field", "unread"],
)
def test_check_boards_warnings(board: dict, words: list[str]) -> None:
    got = npu_smi.check_boards([3], [board])
    assert got["errors"] == [] and len(got["warnings"]) == 1
    assert got["warnings"][0].startswith("NPU 3: ") and all(w in got["warnings"][0] for w in words)


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
    assert facts["npu_ids"] == list(range(8)) and len(facts["boards"]) == 8
    assert [b["NPU ID"] for b in facts["boards"]] == [str(i) for i in range(8)] and facts["board"] == facts["boards"][0]
    assert facts["board_errors"] == [] and facts["board_warnings"] == []


def test_gather_reads_every_npu_board_and_reports_nok(tmp_path: Path) -> None:
    state = _sim_state()
    state["devices"][5]["compatibility"] = "NOK"
    facts = npu_smi.gather(_runner, npu_smi_path=str(_install_sim(tmp_path, state)))
    assert facts["boards"][5]["Compatibility"] == "NOK" and facts["board"]["Compatibility"] == "OK"
    assert len(facts["board_errors"]) == 1 and facts["board_errors"][0].startswith("NPU 5: ")


def test_gather_without_boards_runs_npu_smi_once(tmp_path: Path) -> None:
    calls = []

    def runner(argv: list) -> tuple[int, str, str]:
        calls.append(argv[1:])
        return _runner(argv)

    facts = npu_smi.gather(runner, npu_smi_path=str(_install_sim(tmp_path, _sim_state())), read_boards=False)
    assert calls == [["info"]] and facts["count"] == 8 and facts["board"] == {} and facts["boards"] == []


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
