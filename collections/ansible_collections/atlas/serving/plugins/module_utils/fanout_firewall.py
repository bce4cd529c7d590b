# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fan-out staging (module_utils/fanout_stage.py): the node firewall's part. The node's nftables table (roles/firewall)
admits a staging server's planned receivers to its port through two sets, filled here with a timeout and flushed
when the staging stops; one definition of the sets and their rules (plugin_utils/firewall.py declares them).

Standard library only: this file is shipped to managed nodes by Ansible.
"""

from __future__ import annotations

import subprocess

from ansible_collections.atlas.serving.plugins.module_utils.fanout_tree import StageError

# The node firewall (roles/firewall, plugin_utils/firewall.py): table inet atlas, and two sets of the peers a
# node's staging server admits to its port, with a timeout per element.
NFT_TABLE = "inet atlas"
NFT_SETS = (("ip", "atlas_fanout4", "ipv4_addr"), ("ip6", "atlas_fanout6", "ipv6_addr"))
NFT_COMMENT = "fan-out staging: the node's planned receivers, while it stages"


def nft_declarations() -> list[str]:
    """The sets of table inet atlas that hold a staging server's admitted peers (roles/firewall's rules file)."""
    return [f"set {name} {{ type {kind}; flags timeout; }}" for _family, name, kind in NFT_SETS]


def nft_rules(port: int) -> list[str]:
    """The input chain's rules admitting those peers to the staging port."""
    return [f'{family} saddr @{name} tcp dport {int(port)} accept comment "{NFT_COMMENT}"'
            for family, name, _kind in NFT_SETS]


def _nft(nft: str, args: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([nft, *args], input=script, capture_output=True, text=True, check=False)
    except OSError as exc:
        return subprocess.CompletedProcess([nft, *args], 127, "", str(exc))


def firewall_open(peers, port: int, lifetime_s: int, nft: str = "nft") -> str:
    """Admit ``peers`` to ``port`` for ``lifetime_s`` through the sets of table inet atlas (added with their rules
    when the loaded rules predate them). A node without the table filters nothing: said, not changed."""
    if _nft(nft, ["list", "table", *NFT_TABLE.split()]).returncode != 0:
        return "no nftables table inet atlas on this node: its firewall does not filter the port"
    script = []
    if _nft(nft, ["list", "set", *NFT_TABLE.split(), NFT_SETS[0][1]]).returncode != 0:
        script += [f"add {line.replace('set ', f'set {NFT_TABLE} ', 1)}" for line in nft_declarations()]
        script += [f"add rule {NFT_TABLE} input {rule}" for rule in nft_rules(port)]
    by_family = {"ip": [], "ip6": []}
    for peer in peers:
        by_family["ip6" if ":" in peer else "ip"].append(peer)
    for family, name, _kind in NFT_SETS:
        script.append(f"flush set {NFT_TABLE} {name}")
        if by_family[family]:
            elements = ", ".join(f"{p} timeout {int(lifetime_s)}s" for p in by_family[family])
            script.append(f"add element {NFT_TABLE} {name} {{ {elements} }}")
    proc = _nft(nft, ["-f", "-"], "\n".join(script) + "\n")
    if proc.returncode != 0:
        raise StageError(f"nft could not admit the receivers to port {port}: {proc.stderr.strip()[:300]} "
                         "(apply the firewall stage: playbooks/serving.yml)")
    return f"admitted {len(peers)} receiver(s) to port {port} for {int(lifetime_s)} s (table inet atlas)"


def firewall_close(nft: str = "nft") -> str:
    if _nft(nft, ["list", "set", *NFT_TABLE.split(), NFT_SETS[0][1]]).returncode != 0:
        return "no staging sets in table inet atlas: nothing to close"
    script = "".join(f"flush set {NFT_TABLE} {name}\n" for _family, name, _kind in NFT_SETS)
    proc = _nft(nft, ["-f", "-"], script)
    if proc.returncode != 0:
        raise StageError(f"nft could not close the staging port: {proc.stderr.strip()[:300]}")
    return "receivers removed from table inet atlas"
