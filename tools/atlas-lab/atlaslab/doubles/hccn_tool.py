#!/usr/bin/python3
"""hccn_tool double for lab nodes: the real tool's command syntax and output, state in /etc/atlas-lab/hccn.json.

Installed on every lab node at the real tool's path, /usr/local/Ascend/driver/tools/hccn_tool. Python 3 standard
library only. Commands (docs/npu-network.md, section 2, has the source of each and marks the assumptions):

    hccn_tool -i N -ip -g                            ipaddr:A / netmask:M
    hccn_tool -i N -ip -s address A netmask M
    hccn_tool -i N -netdetect -g                     netdetect address: A
    hccn_tool -i N -netdetect -s address A
    hccn_tool -i N -gateway -g                       default gateway:A, Iface:ethN
    hccn_tool -i N -gateway -s gateway A
    hccn_tool -i N -link -g                          link status: UP
    hccn_tool -i N -net_health -g                    net health status: Success | Fault | Init
    hccn_tool -i N -tls -g                           dev_id:N, tls switch[S](0:disable, 1:enable), ...
    hccn_tool -i N -tls -s enable 0|1                Cmd executed successfully!
    hccn_tool -i N -ping -g address A                device N PING A / recv seq=... / loss line

State survives calls (every set rewrites the state file). Net health is the state's ``net_health`` when a
fault test set one, else Fault with the link down, Init before an address and a netdetect address are set,
else Success.

Reachability (no packet is ever sent): every set publishes this node's NPU addresses and links to the lab's
NPU fabric directory (``/srv/atlas-npu-fabric/<node>.json``, one directory shared by every lab node); a ping
from NPU N to A succeeds when N's link is up and has an address, A is in N's subnet (or N has a gateway), A
is not in the state's ``unreachable`` list (a fault test), and some NPU with link up holds A in this node's
state or in the fabric. ``HCCN_TOOL_STATE`` and ``HCCN_TOOL_FABRIC`` override both paths (tests).
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import zlib
from pathlib import Path

STATE_PATH = "/etc/atlas-lab/hccn.json"
FABRIC_DIR = "/srv/atlas-npu-fabric"
EXIT_OK = 0
EXIT_FAILED = 1  # assumption: the real tool's non-zero status for a failed command (docs/npu-network.md)
HEALTH_VALUES = ("Success", "Fault", "Init")
USAGE = """\
Usage: hccn_tool -i <device_id> -ip -g | -ip -s address <ip> netmask <mask>
       hccn_tool -i <device_id> -netdetect -g | -netdetect -s address <ip>
       hccn_tool -i <device_id> -gateway -g | -gateway -s gateway <ip>
       hccn_tool -i <device_id> -link -g | -net_health -g | -tls -g | -tls -s enable <0|1>
       hccn_tool -i <device_id> -ping -g address <ip>
"""


def state_path() -> Path:
    return Path(os.environ.get("HCCN_TOOL_STATE", STATE_PATH))


def fabric_dir() -> Path:
    return Path(os.environ.get("HCCN_TOOL_FABRIC", FABRIC_DIR))


def load_state(path: Path | None = None) -> dict:
    with open(path or state_path(), encoding="utf-8") as handle:
        return json.load(handle)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def fabric_record(state: dict) -> dict:
    return {"node": state["node"],
            "devices": [{"id": d["id"], "address": d.get("address"), "netmask": d.get("netmask"),
                         "link": d.get("link", "UP")} for d in state["devices"]]}


def publish(state: dict, fabric: Path | None = None) -> None:
    """This node's NPU addresses and links into the lab's fabric directory (when it is there)."""
    fabric = fabric or fabric_dir()
    if fabric.is_dir():
        _write_json(fabric / f"{state['node']}.json", fabric_record(state))


def save_state(state: dict, path: Path | None = None) -> None:
    _write_json(path or state_path(), state)
    publish(state)


def net_health(dev: dict) -> str:
    if dev.get("net_health"):
        return dev["net_health"]
    if dev.get("link", "UP") != "UP":
        return "Fault"
    if not dev.get("address") or not dev.get("netdetect"):
        return "Init"
    return "Success"


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _netmask(text: str) -> bool:
    try:
        ipaddress.IPv4Network(f"0.0.0.0/{text}")
    except ValueError:
        return False
    return _ipv4(text)


def _holders(state: dict) -> list[dict]:
    """Every NPU the lab knows: this node's, then each other node's record in the fabric."""
    found = [dict(d, node=state["node"]) for d in state["devices"]]
    fabric = fabric_dir()
    if fabric.is_dir():
        for path in sorted(fabric.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if record.get("node") != state["node"]:
                found += [dict(d, node=record.get("node")) for d in record.get("devices", [])]
    return found


def reachable(state: dict, dev: dict, address: str) -> bool:
    if dev.get("link", "UP") != "UP" or not dev.get("address") or not dev.get("netmask"):
        return False
    if address in state.get("unreachable", []):
        return False
    own = ipaddress.IPv4Network(f"{dev['address']}/{dev['netmask']}", strict=False)
    if ipaddress.IPv4Address(address) not in own and not dev.get("gateway"):
        return False
    return any(h.get("address") == address and h.get("link", "UP") == "UP" for h in _holders(state))


def ping(state: dict, dev: dict, address: str, out) -> int:
    out.write(f"device {dev['id']} PING {address}\n")
    if not reachable(state, dev, address):
        out.write("3 packets transmitted, 0 received, 100.00% packet loss\n")
        return EXIT_FAILED
    jitter = zlib.crc32(f"{state['node']}/{dev['id']}/{address}".encode()) % 90
    for seq, base in enumerate((1.418, 0.034, 0.040)):
        out.write(f"recv seq={seq},time={base + jitter / 1000:.6f}ms\n")
    out.write("3 packets transmitted, 3 received, 0.00% packet loss\n")
    return EXIT_OK


def tls_line(dev: dict) -> str:
    return (f"dev_id:{dev['id']}, tls switch[{dev.get('tls', 0)}](0:disable, 1:enable), "
            "tls preconfigured[1](0:non-preset, 1:preset), tls alarm time threshold[60]days\n")


def get(dev: dict, what: str, out) -> int:
    if what == "-ip":
        if dev.get("address"):
            out.write(f"ipaddr:{dev['address']}\nnetmask:{dev['netmask']}\n")
    elif what == "-netdetect":
        if dev.get("netdetect"):
            out.write(f"netdetect address: {dev['netdetect']}\n")
    elif what == "-gateway":
        if dev.get("gateway"):
            out.write(f"default gateway:{dev['gateway']}, Iface:eth{dev['id']}\n")
    elif what == "-link":
        out.write(f"link status: {dev.get('link', 'UP')}\n")
    elif what == "-net_health":
        out.write(f"net health status: {net_health(dev)}\n")
    elif what == "-tls":
        out.write(tls_line(dev))
    else:
        return usage(out)
    return EXIT_OK


def set_value(state: dict, dev: dict, what: str, args: list[str], out) -> int:
    if what == "-ip" and len(args) == 4 and args[0] == "address" and args[2] == "netmask":
        if not (_ipv4(args[1]) and _netmask(args[3])):
            return usage(out)
        dev["address"], dev["netmask"] = args[1], args[3]
    elif what == "-netdetect" and len(args) == 2 and args[0] == "address" and _ipv4(args[1]):
        dev["netdetect"] = args[1]
    elif what == "-gateway" and len(args) == 2 and args[0] == "gateway" and _ipv4(args[1]):
        dev["gateway"] = args[1]
    elif what == "-tls" and len(args) == 2 and args[0] == "enable" and args[1] in ("0", "1"):
        dev["tls"] = int(args[1])
        out.write("Cmd executed successfully!\n")
    else:
        return usage(out)
    save_state(state)
    return EXIT_OK


def usage(out) -> int:
    out.write(USAGE)
    return EXIT_FAILED


def main(argv: list[str] | None = None, out=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = out or sys.stdout
    if len(argv) < 4 or argv[0] != "-i" or not argv[1].isdigit():
        return usage(out)
    try:
        state = load_state()
    except (OSError, ValueError) as exc:
        out.write(f"hccn_tool: cannot read the lab NPU state {state_path()}: {exc}\n")
        return EXIT_FAILED
    devices = {d["id"]: d for d in state["devices"]}
    device = int(argv[1])
    if device not in devices:
        # assumption: wording of the real tool for an absent device id
        out.write(f"device id {device} is invalid.\n")
        return EXIT_FAILED
    dev, what, mode, args = devices[device], argv[2], argv[3], argv[4:]
    if what == "-ping" and mode == "-g" and len(args) == 2 and args[0] == "address" and _ipv4(args[1]):
        return ping(state, dev, args[1], out)
    if mode == "-g" and not args:
        return get(dev, what, out)
    if mode == "-s":
        return set_value(state, dev, what, args, out)
    return usage(out)


if __name__ == "__main__":
    sys.exit(main())
