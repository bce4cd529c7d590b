#!/usr/bin/python3
"""npu-smi simulator for lab nodes: the real tool's output formats, driven by /etc/atlas-lab/npu.json.

Installed on every lab node as /usr/local/bin/npu-smi. Python 3 standard library only.
Supported: ``npu-smi info``, ``info -l``, ``info -m``, ``info -t board|memory|common|health -i N [-c 0]``,
``-v``. With ``"driver_loaded": false`` every query fails like the real tool without its kernel driver.
``NPU_SMI_STATE`` overrides the state file path (tests).

The layouts of ``info``, ``info -l``, ``info -t health -i N`` (a card header, a block per chip, an MCU block),
``info -t health -i N -c 0`` and ``info -t board -i N`` are the 910B npu-smi's (24.1 widths; sources in
docs/ascend-platform.md, section "npu-smi"; tests/unit/collection/test_vendor_contract_npu_smi.py holds them to the
fixtures in tests/fixtures/vendor/npu_smi/). ``-t memory`` and ``-t common`` print ``Key : Value`` lines whose
keys are not checked against a source, and ``-t board -c 0`` prints the card view, not the real chip view.

The board's Compatibility line follows the vendor's rule (DCMI, docs/ascend-platform.md): NOK when the running
firmware is outside the running driver's ``compatible_version_fw=[lo,hi],...`` or the running driver outside
the running firmware's ``compatible_version_drv``. Those ranges are read from the installed
``driver/version.info`` and ``firmware/version.info`` (under ATLAS_LAB_ASCEND, else /usr/local/Ascend for the
node's own state, else ``Ascend/`` beside a test's state file) when the installed ``Version`` is the running
one; a record that names no range, or describes a version that does not run (a reboot pending), leaves OK.
A hi bound ending in ``.`` (``[23.0.rc3,23.0.rc3.]``) matches that version and its builds. The state's
``compatibility`` (of the whole node, or of one device) overrides the rule: ``NOK``, ``UNKNOWN`` (a broken
firmware installation) or ``NOT SUPPORT`` (the real tool run by another user than root: the double does not
look at its caller's uid).

Like the real tool it lists the live processes that use an NPU: every process holding the node's
/dev/davinciN open (``/proc/*/fd``, readable as root; the devices are atlas-lab-driver's), named by its
comm, besides the state's static ``processes``. What they hold is added to the NPU's HBM-Usage in every
output that shows it: the state's ``engine_hbm_mb`` of the NPU when set, else what brings the NPU to
ENGINE_FRACTION of its capacity (SGLang's static pool fills the NPU up to ``--mem-fraction-static``,
0.85 in the lab's profile, counting what others use: its model_runner's ``rest_memory``), split among
the NPU's holders. The devices are looked up in ATLAS_LAB_DEV_DIR, else /dev, else beside a test's own
state file (``dev/``, as atlas-lab-driver makes them); ``NPU_SMI_PROC`` overrides /proc (tests).
"""

from __future__ import annotations

import json
import os
import re
import sys

STATE_PATH = "/etc/atlas-lab/npu.json"
ENGINE_FRACTION = 0.85
_NPU_DEVICE = re.compile(r"^davinci(\d+)$")
WIDTHS = (27, 15, 52)
DRIVER_NOT_LOADED = "dcmi module initialize failed. ret is -8005"
EXIT_DRIVER_NOT_LOADED = 255  # assumption: -8005 reported as a failure status
EXIT_BAD_ARGS = 1
USAGE = """\
Usage: npu-smi info <watch|proc-mem|-h|-m|-l|-t type -i id [-c chip_id]>
       npu-smi info -t board|memory|common|health -i id [-c chip_id]
       npu-smi -v
"""
# The error code of an NPU whose health is not OK (an assumption: one of the real chip fault codes), shown by
# `info -t health -c 0` and exported by the npu-exporter simulator; its text is the double's own.
HEALTH_ERROR_CODE = "80E18005"
HEALTH_ERROR_INFORMATION = "simulated chip fault (atlas lab)"
ASCEND_DIR = "/usr/local/Ascend"
_RANGE = re.compile(r"\[([^\],]*),([^\]]*)\]")
_TOKEN = re.compile(r"^([a-z]*)(\d*)")
PCI_VENDOR_ID = "0x19E5"
PCI_DEVICE_ID = "0xD802"  # the 910B family


def state_path() -> str:
    return os.environ.get("NPU_SMI_STATE", STATE_PATH)


def load_state(path: str | None = None) -> dict:
    with open(path or state_path(), encoding="utf-8") as handle:
        return json.load(handle)


def dev_dir(path: str | None = None) -> str:
    """Where the node's NPU devices are: ATLAS_LAB_DEV_DIR, /dev for the node's own state, else ``dev/``
    beside a test's state file (as atlas-lab-driver decides)."""
    path = path or state_path()
    return os.environ.get("ATLAS_LAB_DEV_DIR") or ("/dev" if path == STATE_PATH else
                                                   os.path.join(os.path.dirname(path), "dev"))


def holders(devices: str, proc_root: str = "/proc") -> dict[int, list[dict]]:
    """{npu: [{pid, name}]}: the processes holding ``<devices>/davinciN`` open (other users' are readable
    as root only, like the real tool's view)."""
    found: dict[int, list[dict]] = {}
    prefix = devices.rstrip("/") + "/"
    for pid in sorted((p for p in os.listdir(proc_root) if p.isdigit()), key=int):
        npus = set()
        try:
            for fd in os.listdir(os.path.join(proc_root, pid, "fd")):
                target = os.readlink(os.path.join(proc_root, pid, "fd", fd))
                match = _NPU_DEVICE.match(target[len(prefix):]) if target.startswith(prefix) else None
                if match:
                    npus.add(int(match.group(1)))
            with open(os.path.join(proc_root, pid, "comm"), encoding="utf-8") as handle:
                name = handle.read().strip()
        except OSError:  # gone, or another user's
            continue
        for npu in npus:
            found.setdefault(npu, []).append({"pid": int(pid), "name": name})
    return found


def with_holders(state: dict, held: dict[int, list[dict]]) -> dict:
    """``state`` with each NPU's live holders in its process table and their memory in its HBM-Usage."""
    devices = []
    for dev in state["devices"]:
        procs = held.get(dev["id"], [])
        if not procs:
            devices.append(dev)
            continue
        total, used = dev["hbm_total_mb"], dev["hbm_used_mb"]
        engine = dev.get("engine_hbm_mb")
        engine = max(0, int(ENGINE_FRACTION * total) - used) if engine is None else engine
        count = len(procs)
        live = [dict(p, memory_mb=engine // count + (1 if i < engine % count else 0)) for i, p in enumerate(procs)]
        devices.append(dict(dev, hbm_used_mb=min(total, used + engine),
                            processes=list(dev.get("processes") or []) + live))
    return dict(state, devices=devices)


def rule(fill: str) -> str:
    return "+" + "+".join(fill * w for w in WIDTHS) + "+"


def row(*cells: str) -> str:
    return "|" + "|".join(cells) + "|"


def pair(used: int, total: int, width: int) -> str:
    """``used / total`` as npu-smi prints it: used left-aligned in 5 columns (58626/ 65536)."""
    return f"{used:<5}/ {total:<{width - 7}}"


def device_rows(dev: dict) -> list[str]:
    first = row(
        f" {dev['id']:<6}{dev['name']:<20}",
        f" {dev['health']:<14}",
        f" {dev['power_w']:<12.1f}{dev['temp_c']:<18}"
        + pair(dev.get("hugepages_used", 0), dev.get("hugepages_total", 0), 21),
    )
    second = row(
        f" {dev.get('chip', 0):<26}",
        f" {dev['bus_id']:<14}",
        f" {dev.get('aicore_pct', 0):<12}"
        + pair(dev.get("memory_used_mb", 0), dev.get("memory_total_mb", 0), 18)
        + pair(dev["hbm_used_mb"], dev["hbm_total_mb"], 21),
    )
    return [first, second]


def process_rows(dev: dict) -> list[str]:
    procs = dev.get("processes") or []
    if not procs:
        return ["| " + f"No running processes found in NPU {dev['id']}".ljust(sum(WIDTHS) + 1) + "|"]
    return [
        "|"
        + f" {dev['id']:<8}{dev.get('chip', 0):<18}|"
        + f" {proc['pid']:<14}|"
        + f" {proc['name'][:24]:<25}|"
        + f" {proc['memory_mb']:<24}"
        + "|"
        for proc in procs
    ]


def render_info(state: dict) -> str:
    version = state.get("npu_smi_version") or state["driver_version"]
    lines = [
        "+" + "-" * (sum(WIDTHS) + 2) + "+",
        f"| npu-smi {version:<24} Version: {version:<53}|",
        rule("-"),
        row(" NPU   Name                ", " Health        ", " Power(W)    Temp(C)           Hugepages-Usage(page)"),
        row(" Chip                      ", " Bus-Id        ", " AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        "),
        rule("="),
    ]
    for dev in state["devices"]:
        lines += device_rows(dev)
        lines.append(rule("="))
    lines += [
        rule("-"),
        "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |",
        rule("="),
    ]
    for dev in state["devices"]:
        lines += process_rows(dev)
        lines.append(rule("="))
    return "\n".join(lines) + "\n"


def kv(pairs: list[tuple[str, object]]) -> str:
    """``Key : Value`` lines as npu-smi prints them (``"\\t%-30s : %s\\n"``)."""
    return "".join(f"\t{key:<30} : {value}\n" for key, value in pairs)


# --- the board's Compatibility ------------------------------------------------------------------------------


def ascend_dir(path: str | None = None) -> str:
    """Where the installed HDK records are: ATLAS_LAB_ASCEND, /usr/local/Ascend for the node's own state, else
    ``Ascend/`` beside a test's state file."""
    path = path or state_path()
    return os.environ.get("ATLAS_LAB_ASCEND") or (ASCEND_DIR if path == STATE_PATH else
                                                  os.path.join(os.path.dirname(path), "Ascend"))


def version_record(kind: str) -> dict[str, str]:
    """``<ascend>/<kind>/version.info`` (driver or firmware) as Key=Value pairs; empty when absent."""
    try:
        with open(os.path.join(ascend_dir(), kind, "version.info"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, sep, v in (line.partition("=") for line in lines) if sep}


def version_key(version: str) -> tuple:
    """A sort key of an Ascend version: numbers in order, ``rcN`` before a release's plain numbers."""
    key = []
    for token in version.strip().lower().split("."):
        letters, digits = _TOKEN.match(token).groups()
        key.append((2 if not letters else 1 if letters == "rc" else 0, int(digits or 0)))
    return tuple(key)


def in_ranges(version: str, ranges: str) -> bool | None:
    """``version`` inside one of ``[lo,hi],[lo,hi]`` (None: no range given)."""
    pairs = _RANGE.findall(ranges or "")
    if not pairs:
        return None
    for lo, hi in pairs:
        lo, hi = lo.strip(), hi.strip()
        below = (version == hi[:-1] or version.startswith(hi)) if hi.endswith(".") else \
            version_key(version) <= version_key(hi)
        if version_key(lo) <= version_key(version) and below:
            return True
    return False


def running_record(kind: str, running: str) -> dict[str, str]:
    """The installed record of ``kind`` when it describes the running version, else empty."""
    record = version_record(kind)
    return record if running and running in (record.get("Version"), record.get("package_version")) else {}


def compatibility(state: dict, dev: dict) -> str:
    """The board's Compatibility: the state's override, else the vendor's rule over the running versions."""
    override = dev.get("compatibility") or state.get("compatibility")
    if override:
        return override
    driver, firmware = state.get("driver_version", ""), state.get("firmware_version", "")
    checks = (in_ranges(firmware, running_record("driver", driver).get("compatible_version_fw", "")),
              in_ranges(driver, running_record("firmware", firmware).get("compatible_version_drv", "")))
    return "NOK" if False in checks else "OK"


def render_board(state: dict, dev: dict) -> str:
    return kv([
        ("NPU ID", dev["id"]),
        ("Product Name", dev.get("product_name", "IT21PDDA01")),
        ("Model", "NA"),
        ("Manufacturer", "Huawei"),
        ("Serial Number", dev.get("serial_number", "NA")),
        ("Software Version", state["driver_version"]),
        ("Firmware Version", state["firmware_version"]),
        ("Compatibility", compatibility(state, dev)),
        ("Board ID", "0x02"),
        ("PCB ID", "A"),
        ("BOM ID", "1"),
        ("PCIe Bus Info", dev["bus_id"]),
        ("Slot ID", dev["id"]),
        ("Class ID", "NA"),
        ("PCI Vendor ID", PCI_VENDOR_ID),
        ("PCI Device ID", PCI_DEVICE_ID),
        ("Subsystem Vendor ID", "0x0200"),
        ("Subsystem Device ID", "0x0100"),
        ("Chip Count", 1),
    ])


def render_memory(state: dict, dev: dict) -> str:
    return kv([
        ("DDR Capacity(MB)", 0),
        ("DDR Clock Speed(MHz)", 0),
        ("HBM Capacity(MB)", dev["hbm_total_mb"]),
        ("HBM Clock Speed(MHz)", 1600),
        ("HBM Temperature(C)", dev["temp_c"]),
        ("HBM Manufacturer ID", "0x57"),
    ])


def render_common(state: dict, dev: dict) -> str:
    return kv([
        ("NPU ID", dev["id"]),
        ("Chip ID", dev.get("chip", 0)),
        ("Memory Usage Rate(%)", 0),
        ("HBM Usage Rate(%)", round(100 * dev["hbm_used_mb"] / max(dev["hbm_total_mb"], 1))),
        ("Aicore Usage Rate(%)", dev.get("aicore_pct", 0)),
        ("Aicore Freq(MHZ)", 1800),
        ("Temperature(C)", dev["temp_c"]),
        ("NPU Real-time Power(W)", dev["power_w"]),
    ])


def render_health(state: dict, dev: dict) -> str:
    """``info -t health -i N`` (no -c): the card header, the chip's Health and Chip ID, then the MCU's block
    (a device with ``"mcu": false`` has none)."""
    text = kv([("NPU ID", dev["id"]), ("Chip Count", 1)]) + "\n"
    text += kv([("Health", dev["health"]), ("Chip ID", dev.get("chip", 0))]) + "\n"
    if dev.get("mcu", True):
        text += kv([("Health", dev.get("mcu_health", "OK")), ("Chip Name", "MCU")]) + "\n"
    return text


def render_chip_health(state: dict, dev: dict) -> str:
    """``info -t health -i N -c 0``: Health Status, then the error codes and their texts (NA without one)."""
    failing = dev["health"] != "OK"
    return kv([("Health Status", dev["health"]),
               ("Error Code", HEALTH_ERROR_CODE if failing else "NA"),
               ("Error Information", HEALTH_ERROR_INFORMATION if failing else "NA")])


def render_list(state: dict) -> str:
    """``info -l``: Total Count, then each NPU's id and chip count, each block closed by a blank line."""
    text = kv([("Total Count", len(state["devices"]))]) + "\n"
    for dev in state["devices"]:
        text += kv([("NPU ID", dev["id"]), ("Chip Count", 1)]) + "\n"
    return text


def render_mapping(state: dict) -> str:
    cols = ("NPU ID", "Chip ID", "Chip Logic ID", "Chip Name")
    lines = ["\t" + "".join(f"{c:<31}" for c in cols)]
    for logic, dev in enumerate(state["devices"]):
        cells = (dev["id"], dev.get("chip", 0), logic, f"Ascend {dev['name']}")
        lines.append("\t" + "".join(f"{str(c):<31}" for c in cells))
        lines.append("\t" + "".join(f"{str(c):<31}" for c in (dev["id"], 1, "-", "Mcu")))
    return "\n".join(lines) + "\n"


TYPES = {"board": render_board, "memory": render_memory, "common": render_common, "health": render_health}


def parse_options(argv: list[str]) -> dict[str, str] | None:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in ("-t", "-i", "-c") and i + 1 < len(argv):
            opts[flag] = argv[i + 1]
            i += 2
        elif flag in ("-l", "-m", "-h"):
            opts[flag] = ""
            i += 1
        else:
            return None
    return opts


def run_info(argv: list[str], state: dict, out) -> int:
    opts = parse_options(argv)
    if opts is None or "-h" in opts:
        out.write(USAGE)
        return EXIT_BAD_ARGS if opts is None else 0
    if not state.get("driver_loaded", True):
        out.write(DRIVER_NOT_LOADED + "\n")
        return EXIT_DRIVER_NOT_LOADED
    state = with_holders(state, holders(dev_dir(), os.environ.get("NPU_SMI_PROC", "/proc")))
    if not opts:
        out.write(render_info(state))
        return 0
    if "-l" in opts:
        out.write(render_list(state))
        return 0
    if "-m" in opts:
        out.write(render_mapping(state))
        return 0
    kind = opts.get("-t")
    if kind not in TYPES or "-i" not in opts:
        out.write(USAGE)
        return EXIT_BAD_ARGS
    devices = {str(d["id"]): d for d in state["devices"]}
    if opts["-i"] not in devices or opts.get("-c", "0") != "0":
        # assumption: wording of the real tool for an absent card id
        out.write(f"The input parameter of -i is invalid, device id {opts['-i']} does not exist.\n")
        return EXIT_BAD_ARGS
    render = render_chip_health if kind == "health" and "-c" in opts else TYPES[kind]
    out.write(render(state, devices[opts["-i"]]))
    return 0


def main(argv: list[str] | None = None, out=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = out or sys.stdout
    if argv[:1] == ["-v"]:
        state = load_state()
        out.write(f"npu-smi version: {state.get('npu_smi_version') or state['driver_version']}\n")
        return 0
    if argv[:1] != ["info"]:
        out.write(USAGE)
        return EXIT_BAD_ARGS
    try:
        state = load_state()
    except (OSError, ValueError):
        out.write(DRIVER_NOT_LOADED + "\n")
        return EXIT_DRIVER_NOT_LOADED
    return run_info(argv[1:], state, out)


if __name__ == "__main__":
    sys.exit(main())
