"""The fabric's tiers as a scheduler can use them, from the edges the agents see (pure).

What the agents see: each node's HCA ports and the leaf each lands on; each leaf's uplinks
and the switch at their far end (a spine, in a two-tier fat tree; a pod's spine, in a three-
tier one); and, where the agents read spines' port tables (``--ibpeer.spine-links``), each
spine's cables to other switches (to the core, in a three-tier tree). Nothing beyond: a core
switch's own cables are read by nobody.

So a node gets two tiers, or three where a core is seen, closest first:

- **tier 0, the leaf**: the switch its HCAs are cabled to. A node whose HCAs land on several
  leaves (a rail-optimised fabric: HCA ``r`` of every node under the leaf of rail ``r``) has
  no one leaf; its tier 0 is the *set* of its leaves, named ``rails-<hash>``: nodes with the
  same set reach each other through one leaf on every rail, which is what a job placed "under
  one leaf" wants. A node that lost one rail has a different set, so it leaves the group (it
  no longer shares that rail): a tier is what the scheduler can use, not a guess.
- **tier 1, the spine block**: the leaves joined through the switches their uplinks reach (a
  connected component of leaves and their uplinks' far ends). In a two-tier fat tree that is
  the whole fabric; in a three-tier one, a pod (the leaves under the same spines). It is
  named after the block's lowest spine GUID, or ``isolated-<leaf GUID>`` for a leaf whose
  every uplink is down (its nodes reach only each other). A node whose HCAs are in different
  blocks (separate rail planes) gets the set's name ``planes-<hash>``.
- **tier 2, the core group** (only when some spine's cable to a switch that is neither a leaf
  nor a spine is seen): the blocks joined through the switches above their spines (a
  connected component of blocks and those switches), named after its lowest core GUID, or
  ``isolated-<block>`` for a block none of whose spines is seen cabled to a core (its spines'
  tables unread, or every core uplink down). A node in several blocks whose core groups
  differ gets ``planes-<hash>`` of them.

A leaf whose uplinks are read by nobody (none of its hosts runs an agent) looks isolated: the
map then splits a block rather than join what it has not seen; the same holds one tier up.

Every tier-0 group lies in exactly one tier-1 group (a node's block set is a function of its
leaf set), as Kueue's and Slurm's nested levels need.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from exporter.topology.parse import Attachment, SwitchLink

#: tier numbers, closest first (topograph's numbering: 0 is the switch nearest the node)
LEAF, BLOCK, CORE = 0, 1, 2
#: every tier the map can give, closest first (a map has the first ``depth`` of them)
TIERS = (LEAF, BLOCK, CORE)


def set_name(kind: str, members: Iterable[str]) -> str:
    digest = hashlib.sha256(",".join(sorted(members)).encode()).hexdigest()[:12]
    return f"{kind}-{digest}"


@dataclass(frozen=True, slots=True)
class Place:
    """Where one node sits: the leaves its up HCA ports land on, and its tier values."""

    node: str
    leaves: tuple[str, ...]
    tiers: tuple[str, ...]

    @property
    def rails(self) -> bool:
        return len(self.leaves) > 1


@dataclass(frozen=True, slots=True)
class FabricMap:
    places: tuple[Place, ...]
    #: switch GUID -> node description (as the agents read it)
    switches: Mapping[str, str]
    #: leaf GUID -> the name of its spine block
    block_of: Mapping[str, str]
    attachments: tuple[Attachment, ...]
    links: tuple[SwitchLink, ...]
    #: the spines' cables to the switches above them (the core), as used
    core_links: tuple[SwitchLink, ...] = ()
    #: spine block name -> the name of its core group (empty: no core seen, two tiers)
    core_of: Mapping[str, str] = field(default_factory=dict)
    #: node -> its NVLink domain (``<cluster UUID>.<clique ID>``, as NVML gives it), for the
    #: nodes whose GPUs all report the same one
    domains: Mapping[str, str] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        """How many tiers the map gives: 3 where a core was seen, else 2."""
        return 3 if self.core_of else 2

    @property
    def tiers(self) -> tuple[int, ...]:
        return TIERS[: self.depth]

    def place(self, node: str) -> Place | None:
        for p in self.places:
            if p.node == node:
                return p
        return None

    def groups(self, tier: int) -> dict[str, tuple[str, ...]]:
        """Tier value -> its nodes (sorted)."""
        out: dict[str, list[str]] = {}
        for p in self.places:
            out.setdefault(p.tiers[tier], []).append(p.node)
        return {k: tuple(sorted(v)) for k, v in sorted(out.items())}

    def domain_groups(self) -> dict[str, tuple[str, ...]]:
        """NVLink domain -> its nodes (sorted)."""
        out: dict[str, list[str]] = {}
        for node, domain in self.domains.items():
            out.setdefault(domain, []).append(node)
        return {k: tuple(sorted(v)) for k, v in sorted(out.items())}

    def parent(self, tier: int, value: str) -> str:
        """The tier ``tier + 1`` value of the tier ``tier`` group ``value``."""
        for p in self.places:
            if p.tiers[tier] == value:
                return p.tiers[tier + 1]
        raise KeyError(value)


class _Union:
    def __init__(self) -> None:
        self.up: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.up.setdefault(x, x)
        while self.up[x] != x:
            self.up[x] = self.up[self.up[x]]
            x = self.up[x]
        return x

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.up[max(ra, rb)] = min(ra, rb)


def build(
    attachments: Iterable[Attachment],
    links: Iterable[SwitchLink],
    spine_links: Iterable[SwitchLink] = (),
    domains: Mapping[str, str] | None = None,
) -> FabricMap:
    atts = tuple(sorted(set(attachments)))
    leaves = {a.leaf for a in atts}
    switches: dict[str, str] = {a.leaf: a.leaf_description for a in atts}
    used = tuple(sorted(lk for lk in set(links) if lk.switch in leaves or lk.peer in leaves))
    union = _Union()
    for leaf in leaves:
        union.find(leaf)
    spines: set[str] = set()
    for lk in used:
        switches.setdefault(lk.switch, lk.switch_description)
        switches.setdefault(lk.peer, lk.peer_description)
        union.join(lk.switch, lk.peer)
        spines.update(s for s in (lk.switch, lk.peer) if s not in leaves)
    members: dict[str, list[str]] = {}
    for s in switches:
        members.setdefault(union.find(s), []).append(s)
    name_of_root: dict[str, str] = {}
    for root, ms in members.items():
        top = sorted(m for m in ms if m in spines)
        name_of_root[root] = top[0] if top else "isolated-" + min(ms)
    block_of = {leaf: name_of_root[union.find(leaf)] for leaf in sorted(leaves)}
    spine_block = {s: name_of_root[union.find(s)] for s in spines}
    core_links, core_of = _cores(spine_links, leaves, spine_block, set(block_of.values()), switches)
    by_node: dict[str, set[str]] = {}
    for a in atts:
        by_node.setdefault(a.node, set()).add(a.leaf)
    places = []
    for node, its in sorted(by_node.items()):
        ls = tuple(sorted(its))
        tier0 = ls[0] if len(ls) == 1 else set_name("rails", ls)
        blocks = sorted({block_of[leaf] for leaf in ls})
        tier1 = blocks[0] if len(blocks) == 1 else set_name("planes", blocks)
        tiers: tuple[str, ...] = (tier0, tier1)
        if core_of:
            groups = sorted({core_of[b] for b in blocks})
            tiers += (groups[0] if len(groups) == 1 else set_name("planes", groups),)
        places.append(Place(node, ls, tiers))
    return FabricMap(
        tuple(places),
        dict(sorted(switches.items())),
        block_of,
        atts,
        used,
        core_links,
        core_of,
        dict(sorted((domains or {}).items())),
    )


def _cores(
    spine_links: Iterable[SwitchLink],
    leaves: set[str],
    spine_block: Mapping[str, str],
    blocks: set[str],
    switches: dict[str, str],
) -> tuple[tuple[SwitchLink, ...], dict[str, str]]:
    """The spines' cables to switches that are neither leaves nor spines (the core), and each
    block's core group; ({}, ()) when no such cable is seen (a two-tier fabric, or spine
    tables not read)."""
    used = tuple(
        sorted(
            lk
            for lk in set(spine_links)
            if lk.switch in spine_block and lk.peer not in leaves and lk.peer not in spine_block
        )
    )
    if not used:
        return (), {}
    union = _Union()
    for b in blocks:
        union.find(b)
    cores: set[str] = set()
    for lk in used:
        switches.setdefault(lk.peer, lk.peer_description)
        cores.add(lk.peer)
        union.join(spine_block[lk.switch], lk.peer)
    groups: dict[str, list[str]] = {}
    for x in blocks | cores:
        groups.setdefault(union.find(x), []).append(x)
    name: dict[str, str] = {}
    for root, ms in groups.items():
        top = sorted(m for m in ms if m in cores)
        name[root] = top[0] if top else _isolated(min(ms))
    return used, {b: name[union.find(b)] for b in sorted(blocks)}


def _isolated(block: str) -> str:
    return block if block.startswith("isolated-") else "isolated-" + block
