# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read Ascend NPU state from ``npu-smi`` (the one place that runs and parses it).

``npu-smi info`` prints a box table; column widths and spacing differ between driver
releases (a five-digit HBM value prints as ``58626/ 65536``), so rows are split on ``|``
and each cell is read by what it contains (a bus id, ``used / total`` pairs), never by
character offset. ``npu-smi info -t board -i N`` prints ``Key : Value`` lines.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable

# run_command(argv) -> (rc, stdout, stderr); AnsibleModule.run_command fits.
Runner = Callable[[list], tuple]

EXTRA_DIRS = ("/usr/local/bin", "/usr/local/sbin", "/usr/local/Ascend/driver/tools")
HEALTH_OK = "OK"
HEALTH_VALUES = ("OK", "Warning", "Alarm", "Critical")

_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_PAIR = re.compile(r"(\d+)\s*/\s*(\d+)")
_VERSION = re.compile(r"Version:\s*(\S+)")
_TOOL_VERSION = re.compile(r"npu-smi\s+(\d\S*)")
_NO_PROCESS = re.compile(r"No running processes found in NPU\s+(\d+)")


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
    for line in text.splitlines()[:5]:
        match = _VERSION.search(line) or _TOOL_VERSION.search(line)
        if match:
            return match.group(1)
    return None


def parse_info(text: str) -> dict:
    """``npu-smi info`` -> {"version", "devices": [...], "processes": [...]}; one device per chip row."""
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


def parse_board(text: str) -> dict[str, str]:
    """``npu-smi info -t board -i N`` -> {"NPU ID": "0", "Software Version": "24.1.rc1", ...}."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            result[key.strip()] = value.strip()
    return result


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
        "npu_smi_path": None,
        "error": error,
    }


def gather(run: Runner, npu_smi_path: str | None = None, path_env: str | None = None) -> dict:
    """NPU facts. Never raises for a missing tool or driver: present=false and the error text instead."""
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
    return {
        "present": True,
        "count": len(devices),
        "devices": devices,
        "processes": info["processes"],
        "version": info["version"],
        "health_ok": all(d["health"] == HEALTH_OK for d in devices),
        "hbm_total_mb": sum(d["hbm_total_mb"] or 0 for d in devices),
        "hbm_used_mb": sum(d["hbm_used_mb"] or 0 for d in devices),
        "board": _board(run, exe, devices[0]["id"]),
        "npu_smi_path": exe,
        "error": None,
    }


def _board(run: Runner, exe: str, npu_id: int) -> dict[str, str]:
    """Board facts of the first NPU (driver/firmware versions, PCI ids); empty if the query fails."""
    try:
        rc, out, _err = run([exe, "info", "-t", "board", "-i", str(npu_id)])
    except OSError:
        return {}
    return parse_board(out) if rc == 0 else {}
