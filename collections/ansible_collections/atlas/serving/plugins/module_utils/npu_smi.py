# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read Ascend NPU state from ``npu-smi`` (the one place that runs and parses it).

One parser per output layout of the 910B (non-950) npu-smi; each names its sources (their keys are listed in
docs/ascend-platform.md, section "npu-smi"):

- :func:`parse_info`: ``npu-smi info``, a box table;
- :func:`parse_health`: ``npu-smi info -t health -i <id>`` (no ``-c``), a per-card header and one block per chip;
- :func:`parse_chip_health`: ``npu-smi info -t health -i <id> -c <chip>``, Health Status and error codes;
- :func:`parse_board`: ``npu-smi info -t board -i <id>``, ``Key : Value`` lines with Compatibility;
- :func:`parse_list`: ``npu-smi info -l``, Total Count and one block per NPU.

Column widths change between driver releases (npu-smi 26.0.rc2 prints wider columns than 24.1; a five-digit
HBM value prints as ``58626/ 65536``), so table rows are split on ``|`` and ``Key : Value`` lines on the first
``:``; nothing is read by character offset.

:func:`check_boards` is the one reading of every NPU's board (Compatibility, driver and firmware versions)
that preflight and ``atlasctl doctor`` share.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable

# run_command(argv) -> (rc, stdout, stderr); AnsibleModule.run_command fits.
Runner = Callable[[list], tuple]

EXTRA_DIRS = ("/usr/local/bin", "/usr/local/sbin", "/usr/local/Ascend/driver/tools")
HEALTH_OK = "OK"
# The Health values npu-smi prints (docs D12; npu_common_get_health_state_str, V5).
HEALTH_VALUES = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION = re.compile(r"Version:\s*(\S+)")
_TOOL_VERSION = re.compile(r"npu-smi\s+(\d\S*)")
_NO_PROCESS = re.compile(r"No running processes found in NPU\s+(\d+)")
# The values of the board's Compatibility line (V5 print_chip_compatibility_info).
COMPAT_OK, COMPAT_NOK, COMPAT_UNKNOWN, COMPAT_NOT_SUPPORT = "OK", "NOK", "UNKNOWN", "NOT SUPPORT"


def _cells(line: str) -> list[str] | None:
    text = line.strip()
    if not (text.startswith("|") and text.endswith("|")) or len(text) < 2:
        return None
    return [cell.strip() for cell in text[1:-1].split("|")]


def _int(token: str | None) -> int | None:
    try:
        return int(token) if token is not None else None
    except ValueError:
        return None


def _float(token: str | None) -> float | None:
    try:
        return float(token) if token is not None else None
    except ValueError:
        return None


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in _PAIR.findall(text)]


def _leading_tokens(text: str) -> list[str]:
    """Tokens before the first ``a / b`` pair."""
    match = _PAIR.search(text)
    return (text[: match.start()] if match else text).split()


def _parse_npu_row(cells: list[str]) -> dict | None:
    """``| 0     910B3 | OK | 101.8  43  0 / 0 |`` -> id, name, health, power, temp."""
    if len(cells) < 3:
        return None
    head = cells[0].split()
    npu_id = _int(head[0]) if head else None
    if npu_id is None or _BUS_ID.match(cells[1]):
        return None
    health = cells[1].split()[0] if cells[1].split() else None
    metrics = _leading_tokens(cells[2])
    return {
        "id": npu_id,
        "name": " ".join(head[1:]) or None,
        "health": health,
        "power_w": _float(metrics[0]) if metrics else None,
        "temp_c": _int(metrics[1]) if len(metrics) > 1 else None,
    }


def _parse_chip_row(cells: list[str]) -> dict | None:
    """``| 0 | 0000:C1:00.0 | 0  0 / 0  3318 / 65536 |`` -> chip, bus id, aicore, memory, HBM."""
    if len(cells) < 3 or not _BUS_ID.match(cells[1]):
        return None
    head = cells[0].split()
    pairs = _pairs(cells[2])
    metrics = _leading_tokens(cells[2])
    hbm = pairs[-1] if len(pairs) >= 2 else None
    memory = pairs[0] if pairs else None
    return {
        "chip": _int(head[0]) if head else None,
        "bus_id": cells[1],
        "aicore_pct": _int(metrics[0]) if metrics else None,
        "memory_used_mb": memory[0] if memory else None,
        "memory_total_mb": memory[1] if memory else None,
        "hbm_used_mb": hbm[0] if hbm else None,
        "hbm_total_mb": hbm[1] if hbm else None,
    }


def _parse_process_row(cells: list[str]) -> dict | None:
    if len(cells) < 4:
        return None
    head = cells[0].split()
    npu_id, pid = (_int(head[0]) if head else None), _int(cells[1])
    if npu_id is None or pid is None:
        return None
    memory = _int(cells[3].split()[0]) if cells[3].split() else None
    return {
        "npu": npu_id,
        "chip": _int(head[1]) if len(head) > 1 else None,
        "pid": pid,
        "name": cells[2],
        "memory_mb": memory,
    }


def parse_version(text: str) -> str | None:
    """The driver version of the ``npu-smi info`` title (``Version: <driver>``), else the tool's own version."""
    for line in text.splitlines()[:5]:
        match = _VERSION.search(line) or _TOOL_VERSION.search(line)
        if match:
            return match.group(1)
    return None


def parse_info(text: str) -> dict:
    """``npu-smi info`` -> {"version", "devices": [...], "processes": [...]}; one device per chip row.

    Layout: npu-smi of the 910B (non-950) lines, 23.0 to 26.0.rc2: a title ``| npu-smi <tool> Version: <driver> |``,
    two rows per NPU (``| <npu> <name> | <health> | <power> <temp> <hugepages used> / <total> |`` and
    ``| <chip> | <bus id> | <aicore> <memory used> / <total> <HBM used> / <total> |``), then a process table
    (``| <npu> <chip> | <pid> | <name> | <memory> |`` or ``| No running processes found in NPU <n> |``).
    The A3 (910_93) print (``Chip  Phy-ID``, two chips per NPU) reads the same way. Widths differ between
    releases (26.0.rc2 is wider). Sources: hicann/driver@ef377e95 npucli/src/npu_info_print.c
    (print_total_info_header_v1, print_card_total_info_with_HBM_first/second) [V5]; real prints
    Ascend/mind-cluster@22bb3d98 docs/en/faultdiag/user_guide/03_collecting_logs.md [M1] and
    https://github.com/vllm-project/vllm-ascend/issues/1767, /12980 [X15].
    """
    devices: list[dict] = []
    processes: list[dict] = []
    in_processes = False
    npu: dict | None = None
    for line in text.splitlines():
        cells = _cells(line)
        if cells is None:
            continue
        joined = " ".join(cells)
        if "Process id" in joined or "Process name" in joined:
            in_processes = True
            continue
        if in_processes:
            if not _NO_PROCESS.search(joined):
                proc = _parse_process_row(cells)
                if proc:
                    processes.append(proc)
            continue
        chip = _parse_chip_row(cells)
        if chip is not None:
            if npu is not None:
                devices.append(_device(npu, chip))
            continue
        row = _parse_npu_row(cells)
        if row is not None:
            npu = row
    return {"version": parse_version(text), "devices": devices, "processes": processes}


def _device(npu: dict, chip: dict) -> dict:
    return {
        "id": npu["id"],
        "chip": chip["chip"],
        "name": npu["name"],
        "health": npu["health"],
        "power_w": npu["power_w"],
        "temp_c": npu["temp_c"],
        "aicore_pct": chip["aicore_pct"],
        "hbm_used_mb": chip["hbm_used_mb"],
        "hbm_total_mb": chip["hbm_total_mb"],
        "memory_used_mb": chip["memory_used_mb"],
        "memory_total_mb": chip["memory_total_mb"],
        "bus_id": chip["bus_id"],
    }


def key_value_lines(text: str) -> list[tuple[str, str] | None]:
    """The ``Key : Value`` lines of an ``npu-smi info -t ...`` print, in order: (key, value), or None for a blank
    line (npu-smi separates blocks with one). The key is what precedes the first ``:`` (npu-smi pads it to 30
    characters after a tab); a line with an empty key continues the value above it. Other lines are skipped."""
    lines: list[tuple[str, str] | None] = []
    for line in text.splitlines():
        if not line.strip():
            lines.append(None)
            continue
        key, sep, value = line.partition(":")
        if sep:
            lines.append((key.strip(), value.strip()))
    return lines


def _blocks(text: str) -> list[list[tuple[str, str]]]:
    """The blank-line separated blocks of ``Key : Value`` lines."""
    blocks: list[list[tuple[str, str]]] = [[]]
    for item in key_value_lines(text):
        if item is None:
            if blocks[-1]:
                blocks.append([])
        else:
            blocks[-1].append(item)
    return [block for block in blocks if block]


def parse_board(text: str) -> dict[str, str]:
    """``npu-smi info -t board -i <id>`` -> {"NPU ID": "0", "Software Version": "24.1.rc1", ...}.

    Layout (910B, non-950 npu-smi, every release seen): one ``\\t<key padded to 30> : <value>`` line per key:
    NPU ID, Product Name, Model, Manufacturer, Serial Number, Software Version (the running driver), Firmware
    Version (the running firmware), Compatibility (OK, NOK, UNKNOWN; NOT SUPPORT when not run as root; absent
    on SoC and 310 boards), Board ID, PCB ID, BOM ID, PCIe Bus Info, Slot ID, Class ID, PCI Vendor ID, PCI Device
    ID, Subsystem Vendor ID, Subsystem Device ID, Chip Count. Sources: hicann/driver@ef377e95
    npucli/src/npu_info_print.c (print_ascend_board_info, print_chip_compatibility_info) [V5]; real 910B prints
    [X16]. ``-t board -i <id> -c <chip>`` (the chip view: Chip Type, Chip Name, Chip Version, ...) [M2] is a
    different layout, not read by the suite.
    """
    result: dict[str, str] = {}
    for item in key_value_lines(text):
        if item is not None and item[0]:
            result.setdefault(item[0], item[1])
    return result


def parse_boards(text: str) -> list[dict[str, str]]:
    """Several ``npu-smi info -t board -i <id>`` prints one after another (a shell loop over the NPUs) -> one
    :func:`parse_board` dict per print, each starting at its ``NPU ID`` line."""
    boards: list[dict[str, str]] = []
    for item in key_value_lines(text):
        if item is None or not item[0]:
            continue
        if item[0] == "NPU ID" or not boards:
            boards.append({})
        boards[-1].setdefault(item[0], item[1])
    return boards


def parse_health(text: str) -> dict:
    """``npu-smi info -t health -i <id>`` (no ``-c``) -> {"npu_id", "chip_count", "chips": [{"chip", "health"}],
    "others": [{"name", "health"}]}.

    Layout (non-950 npu-smi; 910B and A3): a card header ``NPU ID : <id>`` / ``Chip Count : <n>``, a blank line,
    then per chip ``Health : <value>`` / ``Chip ID : <chip>`` and a blank line; a card with an MCU adds
    ``Health : <value>`` / ``Chip Name : MCU`` (``others``). On 310/310B ``Chip ID`` comes before ``Health``:
    blocks are read by key, not by order. Sources: hicann/driver@ef377e95 npucli/src/npu_card_info.c
    (show_ascend_card_info, printf_ascend_card_info_header, show_ascend_card_mcu_info) and npu_chip_info.c
    (show_ascend_chip_health_state) [V5]; the Atlas 200I A2 npu-smi reference, npusmi_027/028 [D12].
    """
    result: dict = {"npu_id": None, "chip_count": None, "chips": [], "others": []}
    for block in _blocks(text):
        fields = dict(block)
        if "NPU ID" in fields:
            result["npu_id"], result["chip_count"] = _int(fields["NPU ID"]), _int(fields.get("Chip Count"))
        elif "Chip ID" in fields:
            result["chips"].append({"chip": _int(fields["Chip ID"]), "health": fields.get("Health")})
        elif "Chip Name" in fields:
            result["others"].append({"name": fields["Chip Name"], "health": fields.get("Health")})
    return result


def parse_chip_health(text: str) -> dict:
    """``npu-smi info -t health -i <id> -c <chip>`` -> {"health", "error_codes": [...], "error_information": [...]}.

    Layout (non-950 npu-smi, every release seen): ``Health Status : <value>``, ``Error Code : NA`` and
    ``Error Information : NA`` when the chip has no error; else ``Error Code :`` followed by space-separated hex
    codes (``%04X``) and ``Error Information :`` by one text per code, each further one on a line whose key is
    blank. Sources: hicann/driver@ef377e95 npucli/src/npu_info_print.c (print_health_status,
    print_diagnosis_info) [V5]; Ascend/mind-cluster@22bb3d98 docs/en/faultdiag/user_guide/03_collecting_logs.md
    and component/ascend-faultdiag/test/st_module_testcase/kg_parse/npu_info_before.txt [M2].
    """
    result: dict = {"health": None, "error_codes": [], "error_information": []}
    last = None
    for item in key_value_lines(text):
        if item is None:
            continue
        key, value = item
        if key == "Health Status":
            result["health"] = value
        elif key == "Error Code":
            result["error_codes"] = [] if value in ("", "NA") else value.split()
        elif key == "Error Information" or (not key and last == "Error Information"):
            key = "Error Information"
            if value not in ("", "NA"):
                result["error_information"].append(value)
        last = key
    return result


def parse_list(text: str) -> dict:
    """``npu-smi info -l`` -> {"total": <n>, "npus": [{"id", "chip_count"}]}.

    Layout (non-950 npu-smi): ``Total Count : <n>`` and a blank line, then per NPU ``NPU ID : <id>``,
    ``Chip Count : <n>`` and a blank line; other products add ``Product Name`` and ``Serial Number`` lines (read
    past). 310/310B print ``Card Count`` instead of ``Total Count``. Source: hicann/driver@ef377e95
    npucli/src/npu_info_print.c (print_all_info) [V5].
    """
    result: dict = {"total": None, "npus": []}
    for block in _blocks(text):
        fields = dict(block)
        if "Total Count" in fields or "Card Count" in fields:
            result["total"] = _int(fields.get("Total Count", fields.get("Card Count")))
        if "NPU ID" in fields:
            result["npus"].append({"id": _int(fields["NPU ID"]), "chip_count": _int(fields.get("Chip Count"))})
    return result


# --- every NPU's board: Compatibility and versions --------------------------------------------------------

FIRMWARE_FIX = ("install the firmware of the driver's own HDK release (Ascend-hdk-910b-npu-firmware from the HDK "
                "of Ascend-hdk-910b-npu-driver {driver}), then reboot")


def _ids_text(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in ids)


def _by_npu(ids: list[int], boards: list[dict[str, str]]) -> list[tuple[int, dict[str, str]]]:
    """(NPU id, board) pairs (zip without ``strict``, which the nodes' Python 3.9 lacks)."""
    return [(ids[k], boards[k]) for k in range(min(len(ids), len(boards)))]


def _grouped(pairs: list[tuple[int, dict[str, str]]], key) -> dict[tuple, list[int]]:
    """NPU ids by ``key(board)``, in first-seen order."""
    groups: dict[tuple, list[int]] = {}
    for npu_id, board in pairs:
        groups.setdefault(key(board), []).append(npu_id)
    return groups


def _versions(board: dict[str, str]) -> tuple[str, str]:
    return board.get("Software Version") or "unknown", board.get("Firmware Version") or "unknown"


def _compat_message(value: str, ids: list[int], driver: str, firmware: str) -> tuple[str, str] | None:
    """(kind "error"/"warning", text) for one Compatibility value of the NPUs ``ids``; None for OK."""
    where = f"NPU {_ids_text(ids)}: npu-smi info -t board says Compatibility {value or '(no value)'}"
    pair = f"driver {driver} (Software Version), firmware {firmware} (Firmware Version)"
    if value == COMPAT_OK:
        return None
    if value == COMPAT_NOK:
        return "error", (f"{where}: the firmware does not match the driver ({pair}). Fix: "
                         + FIRMWARE_FIX.format(driver=driver))
    if value == COMPAT_UNKNOWN:
        return "warning", (f"{where} ({pair}): the pair could not be judged: the firmware installation is broken, "
                           f"or the firmware is older than 23.0.RC2, which does not report it. Fix: "
                           + FIRMWARE_FIX.format(driver=driver))
    if value == COMPAT_NOT_SUPPORT:
        return "warning", (f"{where}: npu-smi was not run as root, so the driver/firmware pair ({pair}) was not "
                           "checked; run it as root (become: true)")
    return "warning", f"{where} ({pair}), a value this suite does not know: not checked"


def check_boards(ids: list[int], boards: list[dict[str, str]]) -> dict[str, list[str]]:
    """{"errors": [...], "warnings": [...]} of every NPU's board (``boards[i]`` is NPU ``ids[i]``'s
    :func:`parse_board`, ``{}`` where it could not be read): Compatibility NOK, or NPUs that disagree on the driver
    or firmware, is an error; UNKNOWN, NOT SUPPORT, a missing Compatibility line or board a warning. NPUs with
    the same finding share one message."""
    errors: list[str] = []
    warnings: list[str] = []
    unread = [i for i, board in _by_npu(ids, boards) if not board]
    read = [(i, board) for i, board in _by_npu(ids, boards) if board]
    if unread:
        warnings.append(f"NPU {_ids_text(unread)}: npu-smi info -t board failed: driver/firmware compatibility "
                        "not checked")
    no_field = [i for i, board in read if "Compatibility" not in board]
    if no_field:
        warnings.append(f"NPU {_ids_text(no_field)}: npu-smi info -t board has no Compatibility line (SoC and "
                        "310 boards print none): driver/firmware compatibility not checked")
    with_field = [(i, b) for i, b in read if "Compatibility" in b]
    groups = _grouped(with_field, lambda b: (b["Compatibility"], *_versions(b)))
    for (value, driver, firmware), group in groups.items():
        found = _compat_message(value, group, driver, firmware)
        if found is not None:
            (errors if found[0] == "error" else warnings).append(found[1])
    pairs = _grouped(read, _versions)
    if len(pairs) > 1:
        listed = "; ".join(f"NPU {_ids_text(group)}: driver {d}, firmware {f}" for (d, f), group in pairs.items())
        driver = next(iter(pairs))[0]
        errors.append(f"the NPUs do not run the same driver and firmware ({listed}). Fix: "
                      + FIRMWARE_FIX.format(driver=driver))
    return {"errors": errors, "warnings": warnings}


# --- running npu-smi ------------------------------------------------------------------------------------------


def find_npu_smi(explicit: str | None = None, path_env: str | None = None) -> str | None:
    """An explicit path if it is executable, else ``npu-smi`` (or ``explicit`` when it is a bare command
    name) on PATH or in the usual install dirs."""
    if explicit and os.sep in explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    search = os.pathsep.join([path_env if path_env is not None else os.environ.get("PATH", ""), *EXTRA_DIRS])
    return shutil.which(explicit or "npu-smi", path=search)


def not_found(explicit: str | None = None) -> str:
    """The error of a node where :func:`find_npu_smi` found nothing."""
    if explicit and os.sep in explicit:
        name, where = "npu-smi", explicit
    else:
        name, where = explicit or "npu-smi", f"PATH and {', '.join(EXTRA_DIRS)}"
    return f"{name} not found ({where}); the Ascend NPU driver is not installed"


def _error_text(argv: list, rc: int, out: str, err: str) -> str:
    detail = " ".join((err or "").split() + (out or "").split()[:40]) or "no output"
    return f"{' '.join(argv)} exited {rc}: {detail}"


def read_info(run: Runner, exe: str) -> tuple[dict | None, str | None]:
    """``<exe> info`` parsed (:func:`parse_info`) and None, or None and why it could not be read."""
    argv = [exe, "info"]
    try:
        rc, out, err = run(argv)
    except OSError as exc:
        return None, f"{exe}: cannot run: {exc}"
    if rc != 0:
        return None, _error_text(argv, rc, out, err)
    return parse_info(out), None


def absent_facts(error: str) -> dict:
    return {
        "present": False,
        "count": 0,
        "devices": [],
        "processes": [],
        "version": None,
        "health_ok": False,
        "hbm_total_mb": 0,
        "hbm_used_mb": 0,
        "board": {},
        "npu_ids": [],
        "boards": [],
        "board_errors": [],
        "board_warnings": [],
        "npu_smi_path": None,
        "error": error,
    }


def npu_ids(devices: list[dict]) -> list[int]:
    """The NPU ids of ``npu-smi info``'s devices, each once, in the table's order (an A3 NPU has two chips)."""
    return list(dict.fromkeys(d["id"] for d in devices))


def gather(run: Runner, npu_smi_path: str | None = None, path_env: str | None = None,
           read_boards: bool = True) -> dict:
    """NPU facts. Never raises for a missing tool or driver: present=false and the error text instead.
    ``read_boards`` False leaves out the boards (one ``npu-smi info -t board`` per NPU): board {}, boards []."""
    exe = find_npu_smi(npu_smi_path, path_env)
    if exe is None:
        return absent_facts(not_found(npu_smi_path))
    info, error = read_info(run, exe)
    if info is None:
        return dict(absent_facts(error), npu_smi_path=exe)
    devices = info["devices"]
    if not devices:
        return dict(
            absent_facts(
                f"{exe} info listed no NPU (driver loaded but no device, or an output format this parser does not know)"
            ),
            version=info["version"],
            npu_smi_path=exe,
        )
    ids = npu_ids(devices)
    boards = [read_board(run, exe, npu_id) for npu_id in ids] if read_boards else []
    checked = check_boards(ids, boards) if read_boards else {"errors": [], "warnings": []}
    return {
        "present": True,
        "count": len(devices),
        "devices": devices,
        "processes": info["processes"],
        "version": info["version"],
        "health_ok": all(d["health"] == HEALTH_OK for d in devices),
        "hbm_total_mb": sum(d["hbm_total_mb"] or 0 for d in devices),
        "hbm_used_mb": sum(d["hbm_used_mb"] or 0 for d in devices),
        "board": boards[0] if boards else {},
        "npu_ids": ids,
        "boards": boards,
        "board_errors": checked["errors"],
        "board_warnings": checked["warnings"],
        "npu_smi_path": exe,
        "error": None,
    }


def read_board(run: Runner, exe: str, npu_id: int) -> dict[str, str]:
    """``npu-smi info -t board -i <npu_id>`` parsed (:func:`parse_board`); empty if the query fails."""
    try:
        rc, out, _err = run([exe, "info", "-t", "board", "-i", str(npu_id)])
    except OSError:
        return {}
    return parse_board(out) if rc == 0 else {}
