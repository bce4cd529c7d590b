"""The simulated NPU driver layer of a lab node: npu.json state, version files, npu-smi install; the NPU
network ports (hccn.json, the hccn_tool double at the driver's tools path, the lab's NPU fabric); the
npu-exporter simulator (its unit, started at boot on npu-exporter's default port)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from atlasctl.errors import UsageError
from atlaslab.config import LabConfig, NodeSpec
from atlaslab.doubles import hccn_tool

STATE_REL = Path("etc/atlas-lab/npu.json")
NPU_SMI_REL = Path("usr/local/bin/npu-smi")
DRIVER_INFO_REL = Path("usr/local/Ascend/driver/version.info")
FIRMWARE_INFO_REL = Path("usr/local/Ascend/firmware/version.info")
INSTALL_INFO_REL = Path("etc/ascend_install.info")
# The HDK's DCMI library directory, which the official container run line mounts read-only (-v
# /usr/local/dcmi:/usr/local/dcmi; docs/containers.md): on a server the driver package puts its DCMI header and
# library there. The lab's stands for it (no NPU library can run here), so a container is given what a server's is.
DCMI_REL = Path("usr/local/dcmi/dcmi_interface_api.h")
DCMI_TEXT = "/* atlas lab: stands for the HDK's DCMI interface (libdcmi.so and this header on a server) */\n"
SIMULATOR = Path(__file__).resolve().parent / "doubles" / "npu_smi.py"
LAB_DRIVER = Path(__file__).resolve().parent / "doubles" / "lab_driver.py"
LAB_DRIVER_REL = Path("usr/local/sbin/atlas-lab-driver")
BOOT_UNIT_REL = Path("etc/systemd/system/atlas-lab-npu-boot.service")
BOOT_UNIT_LINK_REL = Path("etc/systemd/system/multi-user.target.wants/atlas-lab-npu-boot.service")
# At every boot the node runs the driver and firmware that are installed, as a server does
# after an HDK install and a reboot.
BOOT_UNIT = """\
[Unit]
Description=atlas lab: load the installed NPU driver and firmware (simulated)
DefaultDependencies=no
After=local-fs.target
Before=sysinit.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/atlas-lab-driver load
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""
# Huawei's npu-exporter is shipped in a site's offline bundle; the lab runs a simulator of its /metrics
# (doubles/npu_exporter.py) on its default port, as the unit the lab inventory names
# (monitoring_npu_exporter_unit): the monitoring role enables and starts it, and scrapes it.
NPU_EXPORTER = Path(__file__).resolve().parent / "doubles" / "npu_exporter.py"
NPU_EXPORTER_REL = Path("usr/local/sbin/atlas-lab-npu-exporter")
NPU_EXPORTER_PORT = 8082
NPU_EXPORTER_UNIT = "atlas-lab-npu-exporter.service"
NPU_EXPORTER_UNIT_REL = Path("etc/systemd/system") / NPU_EXPORTER_UNIT
NPU_EXPORTER_UNIT_LINK_REL = Path("etc/systemd/system/multi-user.target.wants") / NPU_EXPORTER_UNIT
NPU_EXPORTER_UNIT_TEXT = f"""\
[Unit]
Description=atlas lab: npu-exporter simulator (Huawei npu-exporter's /metrics from the simulated NPUs)
After=atlas-lab-npu-boot.service

[Service]
ExecStart=/{NPU_EXPORTER_REL} -port {NPU_EXPORTER_PORT} -ip 0.0.0.0
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""
BUS_IDS = ("C1", "C2", "81", "82", "01", "02", "41", "42", "C3", "C4", "83", "84", "03", "04", "43", "44")
HEALTH_VALUES = ("OK", "Warning", "Alarm", "Critical")
IDLE_HBM_USED_MB = 3318
# The NPU network: the real tool's path (Huawei: the driver installs hccn_tool in <driver>/tools,
# docs/npu-network.md section 2), its state, and where every node publishes its NPU addresses.
HCCN_TOOL = Path(__file__).resolve().parent / "doubles" / "hccn_tool.py"
HCCN_TOOL_REL = Path("usr/local/Ascend/driver/tools/hccn_tool")
HCCN_STATE_REL = Path(hccn_tool.STATE_PATH.lstrip("/"))
FABRIC_MOUNT = hccn_tool.FABRIC_DIR
LINK_VALUES = ("UP", "DOWN")
NET_HEALTH_VALUES = ("Fault", "Success")
# A new node's NPU ports: no address, link up, TLS switch on (the stage turns it off).
INITIAL_TLS = 1


def device_state(node: NodeSpec, dev_id: int) -> dict[str, Any]:
    jitter = zlib.crc32(f"{node.name}/{dev_id}".encode()) % 100
    return {
        "id": dev_id,
        "chip": 0,
        "name": node.npu.model,
        "health": "OK",
        "power_w": round(90.0 + jitter / 8, 1),
        "temp_c": 38 + jitter % 7,
        "bus_id": f"0000:{BUS_IDS[dev_id]}:00.0",
        "hbm_total_mb": node.npu.hbm_mb,
        "hbm_used_mb": IDLE_HBM_USED_MB - jitter % 8,
        "aicore_pct": 0,
        "hugepages_used": 0,
        "hugepages_total": 0,
        "memory_used_mb": 0,
        "memory_total_mb": 0,
        "product_name": "IT21PDDA01",
        "serial_number": f"1024{zlib.crc32(node.name.encode()) % 10**6:06d}{dev_id:02d}",
        "processes": [],
    }


def initial_state(cfg: LabConfig, node: NodeSpec) -> dict[str, Any]:
    return {
        "format": 1,
        "driver_loaded": True,
        "driver_version": cfg.driver_version,
        "firmware_version": cfg.firmware_version,
        "devices": [device_state(node, i) for i in range(node.npu.count)],
    }


def hccn_initial_state(node: NodeSpec) -> dict[str, Any]:
    devices = [{"id": i, "address": None, "netmask": None, "gateway": None, "netdetect": None, "link": "UP",
                "net_health": None, "tls": INITIAL_TLS} for i in range(node.npu.count)]
    return {"format": 1, "node": node.name, "devices": devices, "unreachable": []}


def driver_version_info(version: str) -> str:
    """A driver's version.info. Its ``compatible_version_fw`` range (the one real driver records carry,
    docs/ascend-platform.md) covers every firmware the lab starts on: the npu-smi double's Compatibility is OK."""
    return (
        f"Version={version}\nascendhal_version=7.35.19\naicpu_version=1.0\ntdt_version=1.0\nlog_version=1.0\n"
        f"prof_version=2.0\ndvppkernels_version=1.1\ntsfw_version=1.0\n"
        f"Innerversion=V100R001C19SPC002B214\ncompatible_version=[V100R001C15],[V100R001C17],[V100R001C18],"
        f"[V100R001C19]\ncompatible_version_fw=[7.0.0,8.9.9]\npackage_version={version}\n"
    )


def firmware_version_info(version: str, driver_version: str) -> str:
    return f"Version={version}\nfirmware_version=1.0\npackage_version={driver_version}\n"


ASCEND_INSTALL_INFO = (
    "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nFirmware_Install_Type=full\n"
    "Firmware_Install_Path_Param=/usr/local/Ascend\nDriver_Install_Type=full\n"
    "Driver_Install_Path_Param=/usr/local/Ascend\nDriver_Install_For_All=no\n"
)


# The account the driver's device nodes belong to (0660, group HwHiAiUser). Huawei's install guide creates it
# before the driver (the driver role: driver_user, driver_group); a new lab node starts with a driver
# installed, so it starts with the account: a system group and user, as the driver role makes them.
DRIVER_ACCOUNT = "HwHiAiUser"
SYSTEM_IDS = range(999, 99, -1)  # groupadd -r / useradd -r: the highest free id below 1000 (login.defs)


def _entries(path: Path) -> list[list[str]]:
    return [line.split(":") for line in path.read_text().splitlines() if line.strip()]


def add_driver_account(root: Path, name: str = DRIVER_ACCOUNT) -> None:
    """Add ``name`` as a system group and user (no login, locked) to the node's account files, unless there."""
    etc = root / "etc"
    group, passwd = etc / "group", etc / "passwd"
    if not group.is_file() or not passwd.is_file() or any(e[0] == name for e in _entries(group)):
        return
    taken = {int(e[2]) for e in _entries(group) + _entries(passwd) if len(e) > 2 and e[2].isdigit()}
    taken |= {int(e[3]) for e in _entries(passwd) if len(e) > 3 and e[3].isdigit()}
    xid = next(i for i in SYSTEM_IDS if i not in taken)
    lines = {"group": f"{name}:x:{xid}:", "gshadow": f"{name}:!::",
             "passwd": f"{name}:x:{xid}:{xid}::/nonexistent:/usr/sbin/nologin", "shadow": f"{name}:!:19000::::::"}
    for file, line in lines.items():
        path = etc / file
        if path.is_file():
            text = path.read_text()
            with open(path, "a") as handle:  # appended: the file keeps its mode and owner (shadow: 0640 root:shadow)
                handle.write(("" if text.endswith("\n") or not text else "\n") + line + "\n")


def _write(root: Path, rel: Path, text: str, mode: int = 0o644) -> None:
    target = root / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    target.chmod(mode)


def install(root: Path, cfg: LabConfig, node: NodeSpec) -> None:
    """Write the driver layer into a node's root filesystem (its overlay's merged dir).

    The tools are refreshed every time; the installed versions and the NPU state only on a
    new node (an HDK install on the node survives power cycles)."""
    _write(root, NPU_SMI_REL, SIMULATOR.read_text(), 0o755)
    _write(root, LAB_DRIVER_REL, LAB_DRIVER.read_text(), 0o755)
    _write(root, HCCN_TOOL_REL, HCCN_TOOL.read_text(), 0o755)
    _write(root, DCMI_REL, DCMI_TEXT)
    _write(root, NPU_EXPORTER_REL, NPU_EXPORTER.read_text(), 0o755)
    _write(root, BOOT_UNIT_REL, BOOT_UNIT)
    _write(root, NPU_EXPORTER_UNIT_REL, NPU_EXPORTER_UNIT_TEXT)
    if not (root / HCCN_STATE_REL).is_file():
        _write(root, HCCN_STATE_REL, json.dumps(hccn_initial_state(node), indent=2) + "\n")
    units = ((BOOT_UNIT_LINK_REL, BOOT_UNIT_REL), (NPU_EXPORTER_UNIT_LINK_REL, NPU_EXPORTER_UNIT_REL))
    for link_rel, unit_rel in units:
        link = root / link_rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(f"/{unit_rel}")
    if (root / STATE_REL).is_file():
        return
    add_driver_account(root)
    _write(root, DRIVER_INFO_REL, driver_version_info(cfg.driver_version))
    _write(root, FIRMWARE_INFO_REL, firmware_version_info(cfg.firmware_version, cfg.driver_version))
    _write(root, INSTALL_INFO_REL, ASCEND_INSTALL_INFO)
    _write(root, STATE_REL, json.dumps(initial_state(cfg, node), indent=2) + "\n")


def apply_changes(
    state: dict[str, Any],
    *,
    device: int | None = None,
    health: str | None = None,
    hbm_used_mb: int | None = None,
    driver: str | None = None,
) -> dict[str, Any]:
    """Return ``state`` with fault-test changes applied (device None: every device)."""
    if health is not None and health not in HEALTH_VALUES:
        raise UsageError(f"--health {health!r} is not a health value", fix=f"use one of {', '.join(HEALTH_VALUES)}")
    if driver is not None and driver not in ("loaded", "unloaded"):
        raise UsageError(f"--driver {driver!r} is not valid", fix="use loaded or unloaded")
    for dev in _selected(state, device):
        if health is not None:
            dev["health"] = health
        if hbm_used_mb is not None:
            if not 0 <= hbm_used_mb <= dev["hbm_total_mb"]:
                raise UsageError(
                    f"--hbm-used-mb {hbm_used_mb} is outside 0..{dev['hbm_total_mb']}", fix="pass a value in range"
                )
            dev["hbm_used_mb"] = hbm_used_mb
    if driver is not None:
        state["driver_loaded"] = driver == "loaded"
    return state


def _selected(state: dict[str, Any], device: int | None) -> list[dict[str, Any]]:
    """The devices a fault-test change applies to: ``device``, or every one (None)."""
    ids = [d["id"] for d in state["devices"]]
    if device is not None and device not in ids:
        raise UsageError(f"--device {device} does not exist on this node", fix=f"use one of {ids}")
    return [d for d in state["devices"] if device is None or d["id"] == device]


def _replace_json(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


def update_file(root: Path, **changes: Any) -> dict[str, Any]:
    path = root / STATE_REL
    state = apply_changes(json.loads(path.read_text()), **changes)
    _replace_json(path, state)
    return state


def apply_network_changes(
    state: dict[str, Any],
    *,
    device: int | None = None,
    link: str | None = None,
    net_health: str | None = None,
    unreachable: str | None = None,
    reachable: str | None = None,
) -> dict[str, Any]:
    """Return the NPU network ``state`` with fault-test changes (device None: every NPU). ``net_health``
    Fault holds the NPU's net health at Fault; Success lifts that (it is then derived again)."""
    if link is not None and link not in LINK_VALUES:
        raise UsageError(f"--link {link!r} is not valid", fix="use up or down")
    if net_health is not None and net_health not in NET_HEALTH_VALUES:
        raise UsageError(f"--net-health {net_health!r} is not valid", fix=f"use {' or '.join(NET_HEALTH_VALUES)}")
    for flag, address in (("--unreachable", unreachable), ("--reachable", reachable)):
        if address is not None and not hccn_tool._ipv4(address):
            raise UsageError(f"{flag} {address!r} is not an IPv4 address", fix="pass a peer NPU's address")
    for dev in _selected(state, device):
        if link is not None:
            dev["link"] = link
        if net_health is not None:
            dev["net_health"] = "Fault" if net_health == "Fault" else None
    blocked = state.setdefault("unreachable", [])
    if unreachable is not None and unreachable not in blocked:
        blocked.append(unreachable)
    if reachable is not None and reachable in blocked:
        blocked.remove(reachable)
    return state


def update_network_file(root: Path, fabric: Path | None = None, **changes: Any) -> dict[str, Any]:
    """Apply fault-test changes to a node's hccn.json and publish its NPU links to the lab's fabric."""
    path = root / HCCN_STATE_REL
    state = apply_network_changes(json.loads(path.read_text()), **changes)
    _replace_json(path, state)
    if fabric is not None:
        hccn_tool.publish(state, fabric)
    return state
