"""The lab network: safety first (blackhole route, forward-drop nftables table), then bridge, netns, veths.

Every name created here is the lab's own (bridge from lab.yml, netns ``atlas-*``, host veths ``atlv*``),
so stale-state cleanup can match by name without touching anything else on the host.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from atlasctl.errors import EnvironmentProblem
from atlaslab.config import LabConfig, NodeSpec
from atlaslab.proc import run

log = logging.getLogger(__name__)

BLACKHOLE_METRIC = 4242
NFT_FAMILY = "inet"
NFT_TABLE = "atlas_lab"
NETNS_PREFIX = "atlas-"
VETH_PREFIX = "atlv"
NETNS_DIR = Path("/run/netns")
SAFETY_FIX = (
    "run as root on a host with iproute2 and nftables (kernel nf_tables); "
    "the lab refuses to start without its blackhole route and forward-drop rules"
)


def nft_ruleset(bridge: str, subnet: str, controller_ip: str = "", behind_jump: tuple[str, ...] = ()) -> str:
    """The lab's own nftables table: nothing is forwarded between the lab bridge and any other interface; SSH from
    the controller address to a node behind a jump host is refused (only the jump host reaches it)."""
    jump = (f"""
    chain output {{
        type filter hook output priority -10; policy accept;
        ip saddr {controller_ip} ip daddr {{ {", ".join(behind_jump)} }} tcp dport 22 counter reject with tcp reset
    }}""" if controller_ip and behind_jump else "")
    return f"""\
table {NFT_FAMILY} {NFT_TABLE}
delete table {NFT_FAMILY} {NFT_TABLE}
table {NFT_FAMILY} {NFT_TABLE} {{
    chain forward {{
        type filter hook forward priority -10; policy accept;
        iifname "{bridge}" oifname "{bridge}" accept
        iifname "{VETH_PREFIX}*" oifname "{VETH_PREFIX}*" accept
        iifname "{bridge}" counter drop
        oifname "{bridge}" counter drop
        iifname "{VETH_PREFIX}*" counter drop
        oifname "{VETH_PREFIX}*" counter drop
    }}
    chain input {{
        type filter hook input priority -10; policy accept;
        iifname "{bridge}" ip daddr != {subnet} counter drop
        iifname "{bridge}" meta nfproto ipv6 counter drop
    }}{jump}
}}
"""


def blackhole_present(subnet: str) -> bool:
    out = run(["ip", "-4", "route", "show", "type", "blackhole", subnet], check=False).stdout
    return f"metric {BLACKHOLE_METRIC}" in out


def nft_present() -> bool:
    return run(["nft", "list", "table", NFT_FAMILY, NFT_TABLE], check=False).returncode == 0


def ensure_safety(cfg: LabConfig) -> None:
    """Install the blackhole route and the forward-drop table, or refuse with the fix."""
    run(
        ["ip", "route", "replace", "blackhole", cfg.subnet, "metric", str(BLACKHOLE_METRIC)],
        fix=SAFETY_FIX,
    )
    run(["nft", "-f", "-"], input_text=nft_ruleset(cfg.bridge, cfg.subnet, cfg.controller_ip,
                                                   tuple(n.ip for n in cfg.behind_jump)), fix=SAFETY_FIX)
    if not (blackhole_present(cfg.subnet) and nft_present()):
        raise EnvironmentProblem(
            f"lab network safety could not be verified (blackhole {cfg.subnet} metric {BLACKHOLE_METRIC}, "
            f"nft table {NFT_FAMILY} {NFT_TABLE})",
            fix=SAFETY_FIX,
        )


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def ensure_bridge(cfg: LabConfig) -> None:
    if not link_exists(cfg.bridge):
        run(["ip", "link", "add", cfg.bridge, "type", "bridge"])
    run(["ip", "addr", "replace", f"{cfg.controller_ip}/{cfg.prefixlen}", "dev", cfg.bridge])
    run(["ip", "addr", "replace", f"{cfg.harness_ip}/{cfg.prefixlen}", "dev", cfg.bridge])
    run(["ip", "link", "set", cfg.bridge, "up"])


def netns_list() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    names = [entry["name"] for entry in json.loads(out)] if out else []
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def lab_links() -> list[str]:
    out = run(["ip", "-j", "link", "show"], check=False).stdout.strip()
    names = [entry["ifname"] for entry in json.loads(out)] if out else []
    return [n for n in names if n.startswith(VETH_PREFIX)]


def ensure_node_net(cfg: LabConfig, node: NodeSpec) -> None:
    ns = node.netns
    if ns not in netns_list():
        run(["ip", "netns", "add", ns])
    if not link_exists(node.veth_host):
        run(["ip", "link", "add", node.veth_host, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run(["ip", "link", "set", node.veth_host, "master", cfg.bridge, "up"])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", ns, "addr", "replace", f"{node.ip}/{cfg.prefixlen}", "dev", "eth0"])
    run(["ip", "-n", ns, "link", "set", "eth0", "up"])


def netns_path(node: NodeSpec) -> Path:
    return NETNS_DIR / node.netns


def remove_all(bridge: str) -> list[str]:
    """Delete every lab netns, host veth and the bridge; return what was removed."""
    removed: list[str] = []
    for ns in netns_list():
        run(["ip", "netns", "delete", ns], check=False)
        removed.append(f"netns {ns}")
    for link in lab_links():
        run(["ip", "link", "delete", link], check=False)
        removed.append(f"link {link}")
    if link_exists(bridge):
        run(["ip", "link", "delete", bridge, "type", "bridge"], check=False)
        removed.append(f"bridge {bridge}")
    return removed
