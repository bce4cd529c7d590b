"""The npu-smi simulator against the real tool's layout (docs/ascend-platform.md section 6, an 8 x 910B3 machine;
test_vendor_contract_npu_smi.py holds every layout to the vendor excerpts), and its Compatibility rule."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ansible_collections.atlas.serving.plugins.module_utils import (
    npu_smi as npu_smi_parser,  # the product's parser reads what the double prints
)

from atlaslab.doubles import npu_smi
from support.npu_smi_text import REAL_HEAD, REAL_PROCESS_HEADER


def device(dev_id: int, bus: str, power: float, temp: int, hbm_used: int, **extra: object) -> dict:
    return {"id": dev_id, "chip": 0, "name": "910B3", "health": "OK", "power_w": power, "temp_c": temp,
            "bus_id": f"0000:{bus}:00.0", "hbm_total_mb": 65536, "hbm_used_mb": hbm_used, "aicore_pct": 0,
            **extra}


def sample_state(**overrides: object) -> dict:
    state = {"format": 1, "driver_loaded": True, "driver_version": "24.1.rc1.b030",
             "firmware_version": "7.1.0.6.220",
             "devices": [device(0, "C1", 101.8, 43, 3318), device(1, "C2", 92.0, 39, 3314)]}
    state.update(overrides)
    return state


def run_sim(argv: list[str], state: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(state))
    monkeypatch.setenv("NPU_SMI_STATE", str(path))
    out = io.StringIO()
    return npu_smi.main(argv, out), out.getvalue()


def test_info_matches_the_real_table_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, text = run_sim(["info"], sample_state(), tmp_path, monkeypatch)
    assert code == 0
    assert text.startswith(REAL_HEAD)
    assert REAL_HEAD.splitlines()[-1] + "\n" + REAL_PROCESS_HEADER in text
    assert "| No running processes found in NPU 1" in text
    assert all(len(line) == 98 for line in text.splitlines())


def test_five_digit_hbm_prints_like_the_real_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = sample_state()
    state["devices"][0]["hbm_used_mb"] = 58626
    _, text = run_sim(["info"], state, tmp_path, monkeypatch)
    assert "| 0                         | 0000:C1:00.0  | 0           0    / 0          58626/ 65536         |" in text


def test_health_and_processes_render_in_their_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = sample_state()
    state["devices"][1]["health"] = "Critical"
    state["devices"][1]["processes"] = [{"pid": 123456, "name": "python3", "memory_mb": 3200}]
    _, text = run_sim(["info"], state, tmp_path, monkeypatch)
    assert "| 1     910B3               | Critical      | 92.0" in text
    row = "| 1       0                 | 123456        | python3                  | 3200                    |"
    assert row in text and "No running processes found in NPU 1" not in text


def test_board_key_value_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, text = run_sim(["info", "-t", "board", "-i", "1"], sample_state(), tmp_path, monkeypatch)
    assert code == 0
    assert "\tNPU ID                         : 1\n" in text  # "\t%-30s : %s\n", as npu-smi prints it
    fields = npu_smi_parser.parse_board(text)
    assert fields["Software Version"] == "24.1.rc1.b030"
    assert fields["Firmware Version"] == "7.1.0.6.220"
    assert fields["PCIe Bus Info"] == "0000:C2:00.0"
    assert fields["PCI Device ID"] == "0xD802"
    assert fields["Compatibility"] == "OK" and fields["Chip Count"] == "1"


def test_health_without_c_is_the_card_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-t health -i N``: the card header, the chip's Health and Chip ID, the MCU's block; no error codes."""
    state = sample_state()
    state["devices"][1]["health"] = "Critical"
    _, text = run_sim(["info", "-t", "health", "-i", "1"], state, tmp_path, monkeypatch)
    assert npu_smi_parser.parse_health(text) == {"npu_id": 1, "chip_count": 1,
                                                 "chips": [{"chip": 0, "health": "Critical"}],
                                                 "others": [{"name": "MCU", "health": "OK"}]}
    assert "Error Code" not in text and "Health Status" not in text


def test_health_with_c_names_the_error_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = sample_state()
    state["devices"][1]["health"] = "Critical"
    _, text = run_sim(["info", "-t", "health", "-i", "1", "-c", "0"], state, tmp_path, monkeypatch)
    got = npu_smi_parser.parse_chip_health(text)
    assert got["health"] == "Critical" and got["error_codes"] == [npu_smi.HEALTH_ERROR_CODE]
    _, text = run_sim(["info", "-t", "health", "-i", "0", "-c", "0"], state, tmp_path, monkeypatch)
    assert npu_smi_parser.parse_chip_health(text) == {"health": "OK", "error_codes": [], "error_information": []}


def _records(tmp_path: Path, driver: str = "", firmware: str = "") -> None:
    """The installed HDK records beside the test's state file (where the double looks for them)."""
    for kind, text in (("driver", driver), ("firmware", firmware)):
        if text:
            (tmp_path / "Ascend" / kind).mkdir(parents=True, exist_ok=True)
            (tmp_path / "Ascend" / kind / "version.info").write_text(text)


def _compatibility(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: dict | None = None) -> str:
    _, text = run_sim(["info", "-t", "board", "-i", "0"], state or sample_state(), tmp_path, monkeypatch)
    return npu_smi_parser.parse_board(text)["Compatibility"]


@pytest.mark.parametrize(
    ("driver", "firmware", "expected"),
    [
        ("", "", "OK"),  # no record: nothing to judge by
        ("Version=24.1.rc1.b030\ncompatible_version_fw=[7.0.0,8.9.9]\n", "", "OK"),
        ("Version=24.1.rc1.b030\ncompatible_version_fw=[7.3.0,7.5.99]\n", "", "NOK"),
        ("Version=24.1.rc1.b030\ncompatible_version_fw=[7.0.0,7.0.9],[7.1.0,7.1.9]\n", "", "OK"),
        ("Version=25.5.0\ncompatible_version_fw=[7.3.0,7.5.99]\n", "", "OK"),  # installed, not running
        ("", "Version=7.1.0.6.220\ncompatible_version_drv=[24.1.rc1,24.1.rc1.],[24.1.0,24.1.0.]\n", "OK"),
        ("", "Version=7.1.0.6.220\ncompatible_version_drv=[23.0.rc3,23.0.rc3.],[23.0.0,23.0.0.]\n", "NOK"),
    ],
    ids=["no-records", "fw-in-range", "fw-outside", "fw-in-second-range", "record-not-running",
         "drv-in-range", "drv-outside"],
)
def test_compatibility_follows_the_running_versions_records(driver, firmware, expected, tmp_path, monkeypatch) -> None:
    _records(tmp_path, driver, firmware)
    assert _compatibility(tmp_path, monkeypatch) == expected


def test_compatibility_set_in_the_state_overrides_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = sample_state(compatibility="UNKNOWN")
    state["devices"][0]["compatibility"] = "NOK"
    assert _compatibility(tmp_path, monkeypatch, state) == "NOK"
    _, text = run_sim(["info", "-t", "board", "-i", "1"], state, tmp_path, monkeypatch)
    assert npu_smi_parser.parse_board(text)["Compatibility"] == "UNKNOWN"


def test_version_order_puts_a_release_candidate_before_its_release() -> None:
    key = npu_smi.version_key
    assert key("23.0.rc3") < key("23.0.0") < key("23.0.1") and key("7.1.0.6.220") < key("7.5.0.1.129")
    assert npu_smi.in_ranges("23.0.rc3.b060", "[23.0.rc3,23.0.rc3.]") is True
    assert npu_smi.in_ranges("23.0.rc2", "[23.0.rc3,23.0.rc3.]") is False
    assert npu_smi.in_ranges("x", "") is None


def test_absent_device_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, text = run_sim(["info", "-t", "board", "-i", "7"], sample_state(), tmp_path, monkeypatch)
    assert code != 0 and "invalid" in text and "NPU ID" not in text


def test_unloaded_driver_fails_every_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in (["info"], ["info", "-t", "board", "-i", "0"], ["info", "-l"]):
        code, text = run_sim(argv, sample_state(driver_loaded=False), tmp_path, monkeypatch)
        assert code != 0
        assert text == "dcmi module initialize failed. ret is -8005\n"


def test_list_and_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, text = run_sim(["info", "-l"], sample_state(), tmp_path, monkeypatch)
    assert npu_smi_parser.parse_list(text) == {"total": 2, "npus": [{"id": 0, "chip_count": 1},
                                                                    {"id": 1, "chip_count": 1}]}
    _, text = run_sim(["info", "-m"], sample_state(), tmp_path, monkeypatch)
    assert text.count("Ascend 910B3") == 2


def test_bad_usage_exits_non_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for argv in ([], ["bogus"], ["info", "-t", "board"], ["info", "-x"]):
        code, text = run_sim(argv, sample_state(), tmp_path, monkeypatch)
        assert code != 0 and "Usage:" in text


def test_runs_as_a_standalone_stdlib_script(tmp_path: Path) -> None:
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(sample_state()))
    script = Path(npu_smi.__file__)
    assert os.access(script, os.X_OK)
    proc = subprocess.run([sys.executable, "-I", str(script), "info"], capture_output=True, text=True,
                          env={"NPU_SMI_STATE": str(path)}, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith(REAL_HEAD)


# --- live processes holding an NPU's device ----------------------------------------------------------------


@pytest.fixture()
def holder(tmp_path: Path):
    """Start a real process holding <tmp>/dev/davinci<N> open (the devices beside the test's state file, where
    the simulator looks for them); yields start(*npus) -> pid."""
    (tmp_path / "dev").mkdir()
    children: list[subprocess.Popen] = []

    def start(*npus: int) -> int:
        opens = " ".join(f"{3 + i}<{tmp_path / 'dev' / f'davinci{n}'}" for i, n in enumerate(npus))
        for n in npus:
            (tmp_path / "dev" / f"davinci{n}").touch()
        child = subprocess.Popen(["bash", "-c", f"exec {opens} sleep 60"])
        children.append(child)
        _wait_holding(child.pid, len(npus))
        return child.pid

    yield start
    for child in children:
        child.kill()
        child.wait()


def _wait_holding(pid: int, count: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            held = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            held, comm = [], ""
        if comm == "sleep" and sum("davinci" in h for h in held) == count:
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} did not come to hold {count} device(s)")


def test_a_process_holding_a_device_is_listed_and_its_memory_counted(tmp_path, monkeypatch, holder) -> None:
    pid = holder(1)
    code, text = run_sim(["info"], sample_state(), tmp_path, monkeypatch)
    assert code == 0 and all(len(line) == 98 for line in text.splitlines())  # the same table
    share = int(0.85 * 65536) - 3314  # fills NPU 1 to 85 % of its HBM, as SGLang's static pool does
    assert f"| 1       0                 | {pid:<14}| sleep                    | {share:<24}|" in text
    assert "| 0                         | 0000:C2:00.0  | 0           0    / 0          55705/ 65536         |" in text
    assert "No running processes found in NPU 0" in text and "3318 / 65536" in text
    parsed = npu_smi_parser.parse_info(text)
    assert parsed["processes"] == [{"npu": 1, "chip": 0, "pid": pid, "name": "sleep", "memory_mb": share}]
    assert [d["hbm_used_mb"] for d in parsed["devices"]] == [3318, 55705]
    _, common = run_sim(["info", "-t", "common", "-i", "1"], sample_state(), tmp_path, monkeypatch)
    assert "HBM Usage Rate(%)              : 85\n" in common


def test_holders_share_the_engine_memory_set_in_the_state(tmp_path, monkeypatch, holder) -> None:
    first, second = holder(0), holder(0, 1)
    state = sample_state()
    state["devices"][0].update(engine_hbm_mb=40001, processes=[{"pid": 7, "name": "static", "memory_mb": 5}])
    state["devices"][1]["engine_hbm_mb"] = 90000  # more than the NPU has: HBM-Usage stops at its capacity
    _, text = run_sim(["info"], state, tmp_path, monkeypatch)
    parsed = npu_smi_parser.parse_info(text)
    assert [(p["npu"], p["pid"], p["memory_mb"]) for p in parsed["processes"]] == [
        (0, 7, 5), (0, first, 20001), (0, second, 20000), (1, second, 90000)]
    assert [d["hbm_used_mb"] for d in parsed["devices"]] == [3318 + 40001, 65536]


def test_a_device_elsewhere_is_not_the_node_s_npu(tmp_path, monkeypatch) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "davinci0").touch()
    with open(tmp_path / "other" / "davinci0"):  # another directory's davinci0: not this node's NPU
        _, text = run_sim(["info"], sample_state(), tmp_path, monkeypatch)
    assert text.count("No running processes found") == 2 and "3318 / 65536" in text and "3314 / 65536" in text
