# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NPU network ports through ``hccn_tool`` (the one place that builds its command lines and parses them).

Every command and output format here has its source in docs/npu-network.md, section 2:

- get: ``hccn_tool -i N -ip -g`` (``ipaddr:A`` / ``netmask:M``), ``-netdetect -g`` (``netdetect address: A``),
  ``-gateway -g`` (``default gateway:A, Iface:ethN``), ``-link -g`` (``link status: UP``), ``-net_health -g``
  (``net health status: Success``), ``-tls -g`` (``dev_id:N, tls switch[0](0:disable, 1:enable), ...``);
- set: ``-ip -s address A netmask M``, ``-gateway -s gateway A``, ``-netdetect -s address A``,
  ``-tls -s enable 0|1`` (exit status 0 = done);
- ``-ping -g address A``: ``N packets transmitted, M received, P% packet loss``; ``0.00% packet loss`` = reachable;
- ``/etc/hccn.conf``: ``address_N``, ``netmask_N``, ``netdetect_N``, ``gateway_N``, ``send_arp_status_N`` lines.

A value that a get does not print (no line, or the command failed) reads as None: it differs from any wanted
value, so a configuration applies it and a verification names it.

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.atlas.serving.plugins.module_utils.checksums import atomic_write_text

# run_command(argv) -> (rc, stdout, stderr); AnsibleModule.run_command fits.
Runner = Callable[[list], tuple]

TOOL = "hccn_tool"
# The driver installs the tool here (Huawei's toolbox guide, docs/npu-network.md section 2).
TOOL_DIRS = ("/usr/local/Ascend/driver/tools",)
CONF_PATH = "/etc/hccn.conf"
LINK_UP = "UP"
HEALTH_OK = "Success"
CONF_FIELDS = ("address", "netmask", "netdetect", "gateway", "send_arp_status")
SEND_ARP_STATUS = "1"

GETS = {
    "ip": ["-ip", "-g"],
    "netdetect": ["-netdetect", "-g"],
    "gateway": ["-gateway", "-g"],
    "link": ["-link", "-g"],
    "net_health": ["-net_health", "-g"],
    "tls": ["-tls", "-g"],
}

_IPV4 = r"(\d{1,3}(?:\.\d{1,3}){3})"
_IPADDR = re.compile(r"^\s*ipaddr\s*:\s*" + _IPV4, re.MULTILINE)
_NETMASK = re.compile(r"^\s*netmask\s*:\s*" + _IPV4, re.MULTILINE)
_NETDETECT = re.compile(r"netdetect address\s*:\s*" + _IPV4)
_GATEWAY = re.compile(r"gateway\s*:\s*" + _IPV4)
_LINK = re.compile(r"link status\s*:\s*(\w+)")
_HEALTH = re.compile(r"net health status\s*:\s*(\w+)")
_TLS = re.compile(r"tls switch\[(\d)\]")
_LOSS = re.compile(r"(\d+) packets transmitted,\s*(\d+) received,\s*([\d.]+)% packet loss")


class HccnError(Exception):
    """A wanted configuration that cannot be applied (names the input and the fix)."""


# --------------------------------------------------------------------------- command lines


def get_argv(tool: str, device: int, what: str) -> list[str]:
    return [tool, "-i", str(device), *GETS[what]]


def set_argv(tool: str, device: int, what: str, value) -> list[str]:
    """The set command of ``what`` (ip: value = (address, netmask); gateway, netdetect: an address; tls: 0/1)."""
    head = [tool, "-i", str(device)]
    if what == "ip":
        address, netmask = value
        return [*head, "-ip", "-s", "address", address, "netmask", netmask]
    if what == "gateway":
        return [*head, "-gateway", "-s", "gateway", value]
    if what == "netdetect":
        return [*head, "-netdetect", "-s", "address", value]
    if what == "tls":
        return [*head, "-tls", "-s", "enable", str(int(value))]
    raise ValueError(f"no set command for {what!r}")


def ping_argv(tool: str, device: int, address: str) -> list[str]:
    return [tool, "-i", str(device), "-ping", "-g", "address", address]


# --------------------------------------------------------------------------- parsers


def _first(pattern: re.Pattern, text: str):
    match = pattern.search(text or "")
    return match.group(1) if match else None


def parse_ip(text: str) -> dict:
    """``ipaddr:10.20.0.10`` / ``netmask:255.255.255.0`` -> {"address", "netmask"} (None where absent)."""
    return {"address": _first(_IPADDR, text), "netmask": _first(_NETMASK, text)}


def parse_netdetect(text: str):
    return _first(_NETDETECT, text)


def parse_gateway(text: str):
    return _first(_GATEWAY, text)


def parse_link(text: str):
    return _first(_LINK, text)


def parse_net_health(text: str):
    return _first(_HEALTH, text)


def parse_tls(text: str):
    value = _first(_TLS, text)
    return int(value) if value is not None else None


def parse_ping(text: str) -> dict:
    """The loss line of ``-ping -g`` -> transmitted, received, loss_pct, loss_line (None where absent)."""
    for line in (text or "").splitlines():
        match = _LOSS.search(line)
        if match:
            return {"transmitted": int(match.group(1)), "received": int(match.group(2)),
                    "loss_pct": float(match.group(3)), "loss_line": line.strip()}
    return {"transmitted": None, "received": None, "loss_pct": None, "loss_line": None}


def ping_ok(rc: int, parsed: dict) -> bool:
    """Reachable: the tool succeeded and printed a loss line with no loss (``0.00% packet loss``)."""
    return rc == 0 and parsed["loss_pct"] == 0.0 and bool(parsed["received"])


# --------------------------------------------------------------------------- /etc/hccn.conf


def parse_conf(text: str) -> dict:
    """``key=value`` lines -> dict (comments and other lines ignored; the last of a repeated key wins)."""
    out = {}
    for line in (text or "").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or "=" not in stripped:
            continue
        key, _sep, value = stripped.partition("=")
        out[key.strip()] = value.strip()
    return out


def conf_entries(devices: list) -> list:
    """Wanted devices ({"id", "address", "netmask", "netdetect", "gateway"}) -> ordered (key, value) pairs."""
    pairs = []
    for dev in devices:
        n = dev["id"]
        pairs += [(f"address_{n}", dev["address"]), (f"netmask_{n}", dev["netmask"]),
                  (f"netdetect_{n}", dev["netdetect"]), (f"gateway_{n}", dev["gateway"]),
                  (f"send_arp_status_{n}", SEND_ARP_STATUS)]
    return pairs


def render_conf(devices: list, existing: str = "") -> str:
    """The file with the wanted devices' keys first, then every other line of ``existing`` as it was.

    Keys of NPUs that are not wanted here and lines the tool may write itself are kept, so a render of its
    own output is the same text (idempotent)."""
    pairs = conf_entries(devices)
    managed = {key for key, _value in pairs}
    lines = [f"{key}={value}" for key, value in pairs]
    for line in (existing or "").splitlines():
        key = line.strip().partition("=")[0].strip() if "=" in line else None
        if key in managed:
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


# --------------------------------------------------------------------------- wanted state


def wanted_devices(addresses: list, netmask: str, gateway: str, netdetect: str | None = None) -> list:
    """One entry per NPU (index = NPU id); netdetect defaults to the gateway (Huawei's advice)."""
    detect = netdetect or gateway
    return [{"id": n, "address": a, "netmask": netmask, "gateway": gateway, "netdetect": detect}
            for n, a in enumerate(addresses)]


def changes(wanted: list, current: dict, tls_enable=None, tool: str = TOOL) -> list:
    """What differs between the wanted devices and the read-back ``current`` ({id: device facts}), in the
    order to apply it per NPU (address first: the gateway must be in its subnet). Each change:
    {"device", "what", "from", "to", "argv"}."""
    out = []
    for dev in wanted:
        n = dev["id"]
        cur = current.get(n) or {}
        if (cur.get("address"), cur.get("netmask")) != (dev["address"], dev["netmask"]):
            out.append(_change(n, "ip", _pair(cur.get("address"), cur.get("netmask")),
                               _pair(dev["address"], dev["netmask"]),
                               set_argv(tool, n, "ip", (dev["address"], dev["netmask"]))))
        for what in ("gateway", "netdetect"):
            if cur.get(what) != dev[what]:
                out.append(_change(n, what, cur.get(what), dev[what], set_argv(tool, n, what, dev[what])))
        if tls_enable is not None and cur.get("tls") != int(tls_enable):
            out.append(_change(n, "tls", cur.get("tls"), int(tls_enable), set_argv(tool, n, "tls", tls_enable)))
    return out


def _pair(address, netmask) -> str | None:
    return None if address is None and netmask is None else f"{address}/{netmask}"


def _change(device, what, before, after, argv) -> dict:
    return {"device": device, "what": what, "from": before, "to": after, "argv": argv}


def describe(change: dict) -> str:
    before = "unset" if change["from"] is None else change["from"]
    return f"NPU {change['device']} {change['what']}: {before} -> {change['to']}"


def verify_problems(host: str, devices: list, wanted: list, tls_enable=None) -> list:
    """Each NPU: link UP, net health Success, address, netmask, gateway and netdetect as wanted, TLS switch as
    wanted; one line per problem naming the host and the NPU."""
    by_id = {d["id"]: d for d in devices}
    out = []
    for want in wanted:
        n = want["id"]
        dev = by_id.get(n)
        if dev is None:
            out.append(f"{host} NPU {n}: not read (no facts for it)")
            continue
        if dev.get("link") != LINK_UP:
            out.append(f"{host} NPU {n}: link {dev.get('link') or 'unknown'}, not {LINK_UP}")
        if dev.get("net_health") != HEALTH_OK:
            out.append(f"{host} NPU {n}: net health {dev.get('net_health') or 'unknown'}, not {HEALTH_OK}")
        for field in ("address", "netmask", "gateway", "netdetect"):
            if dev.get(field) != want[field]:
                out.append(f"{host} NPU {n}: {field} {dev.get(field) or 'unset'}, not {want[field]}")
        if tls_enable is not None and dev.get("tls") != int(tls_enable):
            out.append(f"{host} NPU {n}: tls switch {dev.get('tls')}, not {int(tls_enable)}")
    return out


# --------------------------------------------------------------------------- reading a node


def find_tool(explicit: str | None = None, path_env: str | None = None) -> str | None:
    """An explicit path if it is executable, else ``hccn_tool`` on PATH or in the driver's tools directory."""
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    search = os.pathsep.join([path_env if path_env is not None else os.environ.get("PATH", ""), *TOOL_DIRS])
    return shutil.which(TOOL, path=search)


def tool_missing(explicit: str | None = None) -> str:
    """Why a module that needs ``hccn_tool`` stops when :func:`find_tool` found none."""
    return (f"hccn_tool not found ({explicit or 'PATH and ' + ', '.join(TOOL_DIRS)}): "
            "it comes with the Ascend NPU driver; run the driver stage first")


def _safe_run(run: Runner, argv: list) -> tuple:
    try:
        return run(argv)
    except OSError as exc:
        return 127, "", str(exc)


def read_device(run: Runner, tool: str, device: int) -> dict:
    """Every get of one NPU -> its facts; a failed get leaves its fields None and is listed in ``errors``."""
    texts, errors = {}, []
    for what in GETS:
        argv = get_argv(tool, device, what)
        rc, out, err = _safe_run(run, argv)
        if rc != 0:
            detail = " ".join(((err or "") + " " + (out or "")).split())[:200] or "no output"
            errors.append(f"{' '.join(argv)} exited {rc}: {detail}")
            texts[what] = ""
        else:
            texts[what] = out or ""
    ip = parse_ip(texts["ip"])
    return {
        "id": device,
        "address": ip["address"],
        "netmask": ip["netmask"],
        "netdetect": parse_netdetect(texts["netdetect"]),
        "gateway": parse_gateway(texts["gateway"]),
        "link": parse_link(texts["link"]),
        "net_health": parse_net_health(texts["net_health"]),
        "tls": parse_tls(texts["tls"]),
        "errors": errors,
    }


def _parallel(func, items, workers: int) -> list:
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [func(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(func, items))


def gather(run: Runner, devices: list, tool_path: str | None = None, path_env: str | None = None,
           workers: int = 8) -> dict:
    """NPU network facts of ``devices`` (NPU ids). Never raises for a missing tool: present=false instead.
    NPUs are read in parallel (each NPU's gets one after another)."""
    tool = find_tool(tool_path, path_env)
    if tool is None:
        where = tool_path or f"PATH and {', '.join(TOOL_DIRS)}"
        return facts_of([], None, f"{TOOL} not found ({where}); it comes with the Ascend NPU driver")
    read = _parallel(lambda n: read_device(run, tool, n), devices, workers)
    return facts_of(read, tool, None)


def facts_of(devices: list, tool: str | None, error: str | None) -> dict:
    tls = sorted({d["tls"] for d in devices if d["tls"] is not None})
    return {
        "present": tool is not None and error is None,
        "hccn_tool": tool,
        "count": len(devices),
        "devices": devices,
        "links_up": bool(devices) and all(d["link"] == LINK_UP for d in devices),
        "health_ok": bool(devices) and all(d["net_health"] == HEALTH_OK for d in devices),
        "tls_switches": tls,
        "error": error,
    }


# --------------------------------------------------------------------------- all pairs


def ping_pairs(local_node: str, devices: list, targets: list) -> list:
    """Every local NPU (``devices``: ids) to every target ({"node", "device", "address"})."""
    return [{"node": local_node, "device": n, "peer_node": t["node"], "peer_device": t.get("device"),
             "peer_address": t["address"]} for n in devices for t in targets]


def ping_all(run: Runner, tool: str, pairs: list, workers: int = 8) -> list:
    """Each pair's ping -> the pair with ok, rc and the loss line. One ping at a time per local NPU; the
    NPUs in parallel (``workers`` = 1: all one after another)."""
    by_device = {}
    for pair in pairs:
        by_device.setdefault(pair["device"], []).append(pair)

    def one_device(device_pairs):
        done = []
        for pair in device_pairs:
            rc, out, err = _safe_run(run, ping_argv(tool, pair["device"], pair["peer_address"]))
            parsed = parse_ping(out)
            tail = " ".join(((err or "") + " " + (out or "")).split())[-200:]
            done.append(dict(pair, ok=ping_ok(rc, parsed), rc=rc, loss_line=parsed["loss_line"],
                             detail=None if parsed["loss_line"] else (tail or "no output")))
        return done

    results = []
    for chunk in _parallel(one_device, by_device.values(), workers):
        results += chunk
    return results


def describe_pair(pair: dict) -> str:
    peer = f"NPU {pair['peer_device']}" if pair.get("peer_device") is not None else "NPU"
    why = pair.get("loss_line") or f"exit {pair.get('rc')}: {pair.get('detail')}"
    return (f"{pair['node']} NPU {pair['device']} -> {pair['peer_node']} {peer} ({pair['peer_address']}): {why}")


# --------------------------------------------------------------------------- input checks


def ipv4(value) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(str(value))
    except (ipaddress.AddressValueError, ValueError):
        return None


def netmask_ok(value) -> bool:
    try:
        ipaddress.IPv4Network(f"0.0.0.0/{value}")
    except (ipaddress.NetmaskValueError, ipaddress.AddressValueError, ValueError):
        return False
    return ipv4(value) is not None


def subnet(address: str, netmask: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{address}/{netmask}", strict=False)


# --------------------------------------------------------------------------- configure


def conf_differs(wanted: list, text: str) -> bool:
    """Whether the file's wanted keys differ from ``wanted`` (compared as keys and values, not as text: the
    order of lines the tool itself writes does not count)."""
    have = parse_conf(text)
    return any(have.get(key) != value for key, value in conf_entries(wanted))


def configure(run: Runner, tool: str, wanted: list, tls_enable=None, conf_path: str = CONF_PATH,
              check_mode: bool = False, workers: int = 8) -> dict:
    """Read every wanted NPU back, apply what differs with the set commands (per NPU: address, gateway,
    netdetect, TLS), write ``conf_path`` when its keys differ, then read back again and raise HccnError
    when anything still differs. Check mode: read and report only."""
    current = {d["id"]: d for d in _parallel(lambda n: read_device(run, tool, n), [w["id"] for w in wanted],
                                             workers)}
    todo = changes(wanted, current, tls_enable, tool)
    before = read_text(conf_path)
    after = render_conf(wanted, before)
    conf_changed = conf_differs(wanted, before)
    result = {
        "changed": bool(todo) or conf_changed,
        "changes": [describe(c) for c in todo],
        "commands": [" ".join(c["argv"]) for c in todo],
        "conf_changed": conf_changed,
        "diff": {"before": before, "after": after if conf_changed else before,
                 "before_header": conf_path, "after_header": conf_path},
    }
    if check_mode or not result["changed"]:
        return result
    for change in todo:
        rc, out, err = _safe_run(run, change["argv"])
        if rc != 0:
            detail = " ".join(((err or "") + " " + (out or "")).split())[:300] or "no output"
            raise HccnError(f"{' '.join(change['argv'])} exited {rc}: {detail} ({describe(change)})")
    if conf_changed:
        atomic_write_text(conf_path, after)
    again = {d["id"]: d for d in _parallel(lambda n: read_device(run, tool, n), [w["id"] for w in wanted],
                                           workers)}
    left = changes(wanted, again, tls_enable, tool)
    if left:
        raise HccnError("after the set commands the NPUs still read otherwise: "
                        + "; ".join(describe(c) for c in left))
    return result
