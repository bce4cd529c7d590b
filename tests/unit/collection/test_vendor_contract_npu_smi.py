"""The npu-smi double prints what the real tool prints: for each command the suite or the lab runs, the double's
output has the layout of the vendor excerpt in tests/fixtures/vendor/npu_smi/ (SOURCES.md names their sources):
the same keys in the same order, the same line shapes and column positions; values may differ."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from atlaslab.doubles import npu_smi

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vendor" / "npu_smi"
_TOKEN = re.compile(r"[^\s/|]+|/")
_KEY_VALUE = re.compile(r"^(\s*)(.*?)\s*:(?: (.*))?$")
BUSES = ("C1", "C2", "81", "82", "01", "02", "41", "42")


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def device(dev_id: int, **extra: object) -> dict:
    return {"id": dev_id, "chip": 0, "name": "910B3", "health": "OK", "power_w": 90.5 + dev_id, "temp_c": 40 + dev_id,
            "bus_id": f"0000:{BUSES[dev_id]}:00.0", "hbm_total_mb": 65536, "hbm_used_mb": 3318 + dev_id,
            "aicore_pct": 0, **extra}


def run_double(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: int = 8,
               **device_extra: object) -> str:
    state = {"format": 1, "driver_loaded": True, "driver_version": "24.1.rc2", "firmware_version": "7.5.0.1.129",
             "devices": [device(i, **device_extra) for i in range(devices)]}
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(state))
    monkeypatch.setenv("NPU_SMI_STATE", str(path))
    monkeypatch.setenv("NPU_SMI_PROC", str(tmp_path / "no-proc"))
    (tmp_path / "no-proc").mkdir(exist_ok=True)
    out = io.StringIO()
    assert npu_smi.main(argv, out) == 0, out.getvalue()
    return out.getvalue()


# --- the table of `npu-smi info` ---------------------------------------------------------------------------


def row_kind(line: str) -> str:
    """What a line of the table is: rule, title, a header (its own text), npu/chip/process/idle row."""
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("+"):
        return "rule"
    if "npu-smi" in line and "Version:" in line:
        return "title"
    if cells[0].startswith(("NPU ", "Chip")) and not cells[0][:1].isdigit():
        return "header"
    if "No running processes found" in line:
        return "idle"
    if len(cells) >= 4:
        return "process"
    return "chip" if re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d", cells[1]) else "npu"


def table_shape(line: str) -> tuple:
    """A table line without its values: rules and headers as they are; other rows by the columns of their ``|``
    and of the start of each value (a left-aligned value starts at its column whatever it is)."""
    kind = row_kind(line)
    if kind in ("rule", "header"):
        return kind, line
    pipes = tuple(i for i, ch in enumerate(line) if ch == "|")
    return kind, pipes, tuple(m.start() for m in _TOKEN.finditer(line))


@pytest.mark.parametrize("width", ["info_910b_8npu_24.1.txt"])
def test_info_table_has_the_real_layout(width: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fixture(width).splitlines()
    double = run_double(["info"], tmp_path, monkeypatch).splitlines()
    assert [row_kind(line) for line in double] == [row_kind(line) for line in real]
    assert [table_shape(line) for line in double] == [table_shape(line) for line in real]


def test_the_wide_26_0_rc2_table_has_the_same_rows_and_headers() -> None:
    """The double prints the 24.1 widths; a 26.0.rc2 table differs in widths only (the parser reads both)."""
    narrow, wide = fixture("info_910b_8npu_24.1.txt").splitlines(), fixture("info_910b_26.0.rc2_wide.txt").splitlines()
    assert [row_kind(line) for line in wide] == [row_kind(line) for line in narrow][: len(wide)]
    words = [[c.split() for c in line.strip("|").split("|")] for line in (narrow[3], narrow[4])]
    assert [[c.split() for c in line.strip("|").split("|")] for line in (wide[3], wide[4])] == words


# --- Key : Value outputs -----------------------------------------------------------------------------------


def kv_shape(text: str) -> list:
    """Each line as (indent, key, column of the colon), None for a blank line; a continuation line (blank key)
    is left out: the number of error texts is a value."""
    shape = []
    for line in text.splitlines():
        if not line.strip():
            shape.append(None)
            continue
        match = _KEY_VALUE.match(line)
        assert match, f"not a Key : Value line: {line!r}"
        if match.group(2):
            shape.append((match.group(1), match.group(2), line.index(" : ") if " : " in line else line.index(":")))
    return shape


def values(text: str) -> dict[str, str]:
    return {m.group(2): (m.group(3) or "") for m in map(_KEY_VALUE.match, text.splitlines()) if m and m.group(2)}


@pytest.mark.parametrize(
    ("argv", "name", "extra"),
    [
        (["info", "-l"], "list_910b_8npu.txt", {}),
        (["info", "-t", "health", "-i", "0"], "health_910b_mcu.txt", {}),
        (["info", "-t", "health", "-i", "0"], "health_910b.txt", {"mcu": False}),
        (["info", "-t", "health", "-i", "0", "-c", "0"], "health_chip_ok.txt", {}),
        (["info", "-t", "health", "-i", "0", "-c", "0"], "health_chip_errors.txt", {"health": "Alarm"}),
        (["info", "-t", "board", "-i", "0"], "board_910b_ok.txt", {}),
    ],
    ids=["list", "health-mcu", "health", "chip-health-ok", "chip-health-errors", "board"],
)
def test_key_value_outputs_have_the_real_keys_in_order(argv, name, extra, tmp_path, monkeypatch) -> None:
    double = run_double(argv, tmp_path, monkeypatch, **extra)
    assert kv_shape(double) == kv_shape(fixture(name))
    assert double.endswith("\n")


def test_value_forms_are_the_real_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = values(run_double(["info", "-t", "board", "-i", "0"], tmp_path, monkeypatch))
    assert board["Compatibility"] in ("OK", "NOK", "UNKNOWN", "NOT SUPPORT")
    assert re.fullmatch(r"0x[0-9A-F]{4}", board["PCI Vendor ID"]) and re.fullmatch(r"0x[0-9A-F]{4}",
                                                                                    board["PCI Device ID"])
    assert re.fullmatch(r"[0-9A-F]{4}:[0-9A-F]{2}:[0-9A-F]{2}\.\d", board["PCIe Bus Info"])
    failing = values(run_double(["info", "-t", "health", "-i", "0", "-c", "0"], tmp_path, monkeypatch,
                                health="Alarm"))
    real = values(fixture("health_chip_errors.txt"))
    for got in (failing["Error Code"], real["Error Code"]):
        assert re.fullmatch(r"[0-9A-F]{4,8}( [0-9A-F]{4,8})*", got), got
    assert values(fixture("health_chip_ok.txt"))["Error Code"] == "NA"
    ok = values(run_double(["info", "-t", "health", "-i", "0", "-c", "0"], tmp_path, monkeypatch))
    assert ok["Error Code"] == ok["Error Information"] == "NA"


def test_every_fixture_is_cited_in_sources() -> None:
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert all(f"`{p.name}`" in sources for p in FIXTURES.glob("*.txt"))
