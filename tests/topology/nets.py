"""ibsim net files of any tree of switches, and the tiers they define (the answer the map
must find).

A :class:`Tree` names each switch's uplinks (the switches above it) and each host's HCAs
(device -> the leaf it is cabled to). :func:`net_text` writes the ibsim net file: a switch's
ports are its hosts' HCAs first, then the switches below it, then its uplinks; an HCA is an
ibsim ``Hca`` node named ``<host>-<device>`` (what ``tests/ibsim_fabric.py``'s wrapper
attaches at). Switch node descriptions are their names, so the map's GUIDs are told apart
by the description the agents read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from tests.ibsim_fabric import OPTS


@dataclass(frozen=True)
class Tree:
    #: switch -> the switches its uplinks go to (empty for the top tier)
    uplinks: Mapping[str, tuple[str, ...]]
    #: host -> {device: leaf}
    hosts: Mapping[str, Mapping[str, str]]
    #: cables left out of the net file (an uplink down from the start): (lower, upper)
    missing: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    def links(self) -> list[tuple[str, str]]:
        return [
            (low, up)
            for low, ups in self.uplinks.items()
            for up in ups
            if (low, up) not in self.missing
        ]


def _layout(
    tree: Tree,
) -> tuple[dict[str, list[str]], dict[tuple[str, str], int], list[tuple[str, str]]]:
    """Each switch's peers in port order, (switch, peer) -> port, and the HCAs' leaves."""
    peers: dict[str, list[str]] = {s: [] for s in tree.uplinks}
    hca_ports: list[tuple[str, str]] = []
    for host, devs in sorted(tree.hosts.items()):
        for dev, leaf in sorted(devs.items()):
            peers[leaf].append(f"{host}-{dev}")
            hca_ports.append((f"{host}-{dev}", leaf))
    for low, up in tree.links():
        peers[up].append(low)
    for low, up in tree.links():
        peers[low].append(up)
    # order: hosts, then switches below, then uplinks (hosts and links were added so)
    number = {(s, p): k for s, ps in peers.items() for k, p in enumerate(ps, 1)}
    return peers, number, hca_ports


def port_of(tree: Tree, switch: str, peer: str) -> int:
    """The port of ``switch`` cabled to ``peer`` (a switch, or an HCA ``host-device``)."""
    return _layout(tree)[1][(switch, peer)]


def net_text(tree: Tree) -> str:
    peers, number, hca_ports = _layout(tree)
    lines: list[str] = []
    for s in tree.uplinks:
        n = max(1, len(peers[s]))  # no spare ports: a table read asks every port
        lines.append(f'Switch\t{n} "{s}"')
        for peer in peers[s]:
            far = 1 if peer not in tree.uplinks else number[(peer, s)]
            lines.append(f'[{number[(s, peer)]}]\t"{peer}"[{far}]\t{OPTS}')
        lines.append("")
    for hca, leaf in hca_ports:
        lines += [f'Hca\t1 "{hca}"', f'[1]\t"{leaf}"[{number[(leaf, hca)]}]\t{OPTS}', ""]
    return "\n".join(lines)


def expected_groups(tree: Tree, tier: int) -> set[frozenset[str]]:
    """The partition of hosts the net file defines at ``tier``: 0 the leaf (the set of
    leaves, for a host on several), 1 the switches above the leaves (hosts whose leaves
    share a block: leaves joined through common uplink switches), 2 the switches above those
    (hosts whose blocks are joined through common uplink switches of their spines)."""
    if tier == 0:
        key: dict[str, frozenset[str]] = {
            h: frozenset(devs.values()) for h, devs in tree.hosts.items()
        }
    else:
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            parent.setdefault(x, x)
            while parent[x] != x:
                x = parent[x]
            return x

        leaves = {leaf for devs in tree.hosts.values() for leaf in devs.values()}
        for leaf in leaves:
            find(leaf)
        spines = {up for low, up in tree.links() if low in leaves}
        for low, up in tree.links():
            if low in leaves or (tier == 2 and low in spines and up not in leaves | spines):
                a, b = find(low), find(up)
                if a != b:
                    parent[a] = b
        key = {h: frozenset(find(lf) for lf in devs.values()) for h, devs in tree.hosts.items()}
    groups: dict[frozenset[str], set[str]] = {}
    for h, k in key.items():
        groups.setdefault(k, set()).add(h)
    return {frozenset(g) for g in groups.values()}


def _expand(pattern: str) -> list[str]:
    """topograph's node ranges: ``I[21-22]`` -> I21, I22; ``[1101-1102]`` -> 1101, 1102."""
    m = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", pattern)
    if not m:
        return [pattern]
    prefix, a, b = m.group(1), int(m.group(2)), int(m.group(3))
    width = len(m.group(2))
    return [f"{prefix}{i:0{width}d}" for i in range(a, b + 1)]


def from_topograph_model(model: Mapping[str, object]) -> Tree:
    """A topograph test model (``switches`` with their child ``switches``, ``blocks`` with a
    ``switch`` and ``nodes``) as a tree of one HCA per node (``mlx5_0``). Node names are
    lowercased and, when they start with a digit, prefixed ``n`` (Kubernetes names and ibsim
    names alike)."""
    uplinks: dict[str, list[str]] = {}
    switches = model.get("switches") or {}
    assert isinstance(switches, dict)
    for parent, spec in switches.items():
        uplinks.setdefault(parent, [])
        for child in spec.get("switches", []):
            uplinks.setdefault(child, []).append(parent)
    hosts: dict[str, dict[str, str]] = {}
    blocks = model.get("blocks") or []
    assert isinstance(blocks, list)
    for block in blocks:
        leaf = block["switch"]
        uplinks.setdefault(leaf, [])
        for pattern in block["nodes"]:
            for name in _expand(pattern):
                host = name.lower()
                hosts["n" + host if host[0].isdigit() else host] = {"mlx5_0": leaf}
    return Tree({s: tuple(u) for s, u in uplinks.items()}, hosts)


def joined(*trees: Tree, top: str = "root") -> Tree:
    """One fabric of several trees (switch and host names disjoint), their top switches cabled
    to one more switch above them, so one subnet (one ibsim, one OpenSM) holds them all. The
    agents read at most two hops past their leaves (their spines' cables), so a switch above
    a tree's core changes none of the tiers they can see: each tree groups as it would alone
    (a two-tier tree gets the joining switch as its core, alone in it)."""
    uplinks: dict[str, tuple[str, ...]] = {top: ()}
    hosts: dict[str, Mapping[str, str]] = {}
    for tree in trees:
        assert not set(tree.uplinks) & set(uplinks) and not set(tree.hosts) & set(hosts)
        for s, ups in tree.uplinks.items():
            uplinks[s] = ups if ups else (top,)
        hosts.update(tree.hosts)
    return Tree(uplinks, hosts)


#: a topograph model's annotation naming a node's accelerator (NVLink) domain
MODEL_DOMAIN = "accelerator.topology.test/domain"


def model_domains(model: Mapping[str, object]) -> dict[str, str]:
    """Node (named as :func:`from_topograph_model` names it) -> the domain its block's
    :data:`MODEL_DOMAIN` annotation names (nodes of a block without one: none)."""
    out: dict[str, str] = {}
    blocks = model.get("blocks") or []
    assert isinstance(blocks, list)
    for block in blocks:
        domain = (block.get("annotations") or {}).get(MODEL_DOMAIN)
        if domain is not None:
            hosts = from_topograph_model({"blocks": [{**block, "switch": "x"}]}).hosts
            out.update(dict.fromkeys(hosts, domain))
    return out


def grouped(values: Mapping[str, str]) -> set[frozenset[str]]:
    """The partition of the keys by their values."""
    groups: dict[str, set[str]] = {}
    for key, value in values.items():
        groups.setdefault(value, set()).add(key)
    return {frozenset(g) for g in groups.values()}
