# Copyright: (c) 2025, atlas.serving contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fan-out tree of a staging (docs/fleet-scale.md): which node receives a tree of files from where, and in
which round, so that the origin (the controller, or the site's mirror share) sends each file to a few nodes
only and every other node pulls from a peer that has verified it already.

Controller only (the atlas.serving filter ``fanout_plan``, ``atlasctl bundle push --fan-out`` and the
``make bench-stage`` benchmark use this one implementation).

The shape, from the inventory's branches (groups ``branch_<name>``; a host in none is a branch of its own):

- round 1: the origin sends to ``roots`` nodes, the first node of each of the first ``roots`` branches;
- every later round, each node that holds the tree (it received and verified it in an earlier round) serves
  at most ``fanout`` receivers at once: first the first node (the head) of each branch that holds nothing
  yet, pulling across branches, so the tree reaches every branch in few rounds; then, with what capacity
  is left, the other nodes of each branch that holds the tree, from a node of their own branch. A branch
  receives each file across branches once (its head); its other nodes pull inside the branch;
- each node's ``sources`` are its parent, then ``fallbacks`` other nodes that hold the tree before its
  round (its own branch first, then other branches' heads), each list rotated by the node's position so
  that fallbacks spread; a receiver whose source fails (down, or a copy that fails verification) pulls from
  the next one. ``receivers`` are the nodes that name a node among their sources: the only peers its
  server admits.

Deterministic: branches and hosts are taken in natural order of their names (``n2`` before ``n10``),
whatever order the inventory lists them in, so every planner of one inventory draws the same tree.
A node that was down is planned like the others and pulls on the next run, when its sources are verified.
"""

from __future__ import annotations

import re

ORIGIN = "origin"
DEFAULT_FANOUT = 2
DEFAULT_ROOTS = 1
DEFAULT_FALLBACKS = 2
BRANCH_PREFIX = "branch_"


class FanoutError(ValueError):
    """A bad input: the message names the variable and the fix."""


def natural_key(name):
    """``n2`` before ``n10``: digits compared as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", str(name)) if part]


def _count(value, name, least):
    if isinstance(value, bool) or not str(value).strip().isdigit() or int(value) < least:
        raise FanoutError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return int(value)


def branches_of(hosts, groups, prefix=BRANCH_PREFIX):
    """{host: its branch} from the inventory's ``groups`` (``<prefix><branch>``); a host in no branch group is
    its own branch (named after the host), a host in two is in the first of them (natural order)."""
    member = {}
    for group in sorted((g for g in groups or {} if str(g).startswith(prefix)), key=natural_key):
        for host in groups[group] or []:
            member.setdefault(host, group[len(prefix):])
    return {host: member.get(host, host) for host in hosts}


def _pick(holders, capacity, order):
    """The holder with the most capacity left, the earliest one on a tie; None when none has any."""
    best = None
    for holder in holders:
        if capacity.get(holder, 0) > 0 and (best is None or capacity[holder] > capacity[best]
                                            or (capacity[holder] == capacity[best] and order[holder] < order[best])):
            best = holder
    return best


def _rotated(items, by):
    return items[by % len(items):] + items[:by % len(items)] if items else []


def plan(hosts, branches=None, *, fanout=DEFAULT_FANOUT, roots=DEFAULT_ROOTS, fallbacks=DEFAULT_FALLBACKS):
    """The fan-out plan of ``hosts`` (``branches``: {host: branch}, :func:`branches_of`; default: one branch).

    Returns ``{rounds, roots, fanout, origin_sends, cross_branch, order: [[hosts of round 1], ...],
    transfers: [[[source, receiver], ...] per round], nodes: {host: {round, branch, source, sources,
    receivers}}}``; ``source`` of a root is :data:`ORIGIN`."""
    fanout = _count(fanout, "fanout (pulls served at once per node)", 1)
    roots = _count(roots, "roots (nodes the origin sends to)", 1)
    fallbacks = _count(fallbacks, "fallbacks (sources tried after the parent)", 0)
    hosts = sorted(dict.fromkeys(str(h) for h in hosts), key=natural_key)
    branches = {h: str((branches or {}).get(h, "")) for h in hosts}
    by_branch = {}
    for host in hosts:
        by_branch.setdefault(branches[host], []).append(host)
    names = sorted(by_branch, key=natural_key)
    order = {host: i for i, host in enumerate(h for b in names for h in by_branch[b])}
    nodes, rounds, transfers = {}, [], []
    holders = []  # in the order they received

    def take(host, source, number):
        nodes[host] = {"round": number, "branch": branches[host], "source": source}

    if hosts:
        depth = max(len(members) for members in by_branch.values())
        spread = [by_branch[b][row] for row in range(depth) for b in names if row < len(by_branch[b])]
        first = spread[:roots]  # the first node of each branch in turn, then the second ones
        first = sorted(dict.fromkeys(first), key=order.get)
        for host in first:
            take(host, ORIGIN, 1)
        rounds.append(first)
        transfers.append([[ORIGIN, h] for h in first])
        holders += first
    while len(nodes) < len(hosts):
        number = len(rounds) + 1
        capacity = {h: fanout for h in holders}
        now = []
        for branch in names:  # heads of branches that hold nothing yet: across branches
            if any(h in nodes for h in by_branch[branch]):
                continue
            source = _pick(holders, capacity, order)
            if source is None:
                break
            head = by_branch[branch][0]
            capacity[source] -= 1
            now.append([source, head])
        for branch in names:  # the rest of each branch that held the tree before this round: inside the branch
            own = [h for h in by_branch[branch] if h in capacity]
            for host in by_branch[branch]:
                if host in nodes or any(pair[1] == host for pair in now):
                    continue
                source = _pick(own, capacity, order)
                if source is None:
                    break
                capacity[source] -= 1
                now.append([source, host])
        if not now:  # cannot happen while a holder exists; a guard against an endless loop
            raise FanoutError("the fan-out plan made no progress")  # pragma: no cover
        for source, host in now:
            take(host, source, number)
        received = sorted((pair[1] for pair in now), key=order.get)
        rounds.append(received)
        transfers.append(sorted(now, key=lambda pair: order[pair[1]]))
        holders += received
    heads = {b: by_branch[b][0] for b in names}
    for host in hosts:
        entry = nodes[host]
        if entry["source"] == ORIGIN:
            entry["sources"] = []
            continue
        earlier = [h for h in holders if nodes[h]["round"] < entry["round"] and h != entry["source"]]
        position = order[host]
        same = _rotated([h for h in earlier if branches[h] == entry["branch"]], position)
        other = _rotated([h for h in earlier if branches[h] != entry["branch"] and heads[branches[h]] == h], position)
        entry["sources"] = [entry["source"], *(same + other)[:fallbacks]]
    for host in hosts:
        nodes[host]["receivers"] = sorted((h for h in hosts if host in nodes[h]["sources"]), key=order.get)
    cross = sum(1 for pairs in transfers for source, receiver in pairs
                if source != ORIGIN and branches[source] != branches[receiver])
    return {"rounds": len(rounds), "roots": rounds[0] if rounds else [], "fanout": fanout,
            "origin_sends": len(rounds[0]) if rounds else 0, "cross_branch": cross, "order": rounds,
            "transfers": transfers, "nodes": nodes}


def inventory_plan(hosts, groups, prefix=BRANCH_PREFIX, **options):
    """:func:`plan` of ``hosts`` with their branches from the inventory's ``groups``."""
    return plan(hosts, branches_of(hosts, groups, prefix), **options)


def estimate_seconds(fan, size_bytes, link_bytes_per_s):
    """Wall time of ``fan`` if every node's link moves ``link_bytes_per_s`` and a source's receivers of one
    round share its link: per round, the busiest source's pulls times the tree's size, over the link (no
    pipelining between rounds, verification not counted). The direct push's is ``len(nodes)`` times one
    transfer through the origin's link."""
    total = 0.0
    for pairs in fan["transfers"]:
        total += _busiest(pairs) * size_bytes / link_bytes_per_s
    return total


def _busiest(pairs):
    """The most receivers one source has among ``pairs`` ([source, receiver])."""
    sources = [pair[0] for pair in pairs]
    return max((sources.count(source) for source in sources), default=0)


def summary(fan, size_bytes, link_bytes_per_s=None):
    """The plan's figures: nodes, rounds, what the origin sends (bytes, and over the tree's size), the most
    pulls one source serves in a round, cross-branch transfers, and with a link rate the estimated wall time
    against a direct push to every node."""
    nodes = len(fan["nodes"])
    busiest = max((_busiest(pairs) for pairs in fan["transfers"][1:]), default=0)
    out = {"nodes": nodes, "rounds": fan["rounds"], "roots": len(fan["roots"]),
           "origin_bytes": fan["origin_sends"] * size_bytes,
           "origin_ratio": round(fan["origin_sends"] * 1.0, 3) if nodes else 0.0,
           "direct_origin_bytes": nodes * size_bytes, "max_pulls_per_source": busiest,
           "cross_branch": fan["cross_branch"]}
    if link_bytes_per_s:
        out["estimated_seconds"] = round(estimate_seconds(fan, size_bytes, link_bytes_per_s), 1)
        out["direct_seconds"] = round(nodes * size_bytes / link_bytes_per_s, 1)
    return out
