"""The map as schedulers read it (pure): node labels, a Kueue ``Topology``, Volcano
``HyperNode`` resources, a Slurm ``topology.conf`` (tree plugin, or block plugin with one
block per NVLink domain) and a graph JSON.

Label keys default to topograph's (``fabric.topograph.run/tier-0`` the leaf,
``fabric.topograph.run/tier-1`` the spine block, ``fabric.topograph.run/tier-2`` the core
group where the map has one, ``accelerator.topograph.run/domain`` the NVLink domain as
``<cluster UUID>.<clique ID>``, the value NVIDIA's GPU feature discovery gives
``nvidia.com/gpu.clique``), so a scheduler configured for topograph reads them unchanged; a
prefix of one's own replaces ``fabric.topograph.run/``, and the accelerator key is its own
setting (empty: no NVLink domain label).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.topology.model import LEAF, TIERS, FabricMap

TOPOGRAPH_PREFIX = "fabric.topograph.run/"
#: topograph's NVLink domain key (its ``KeyTopologyXclrDomain``)
TOPOGRAPH_ACCELERATOR = "accelerator.topograph.run/domain"
HOSTNAME = "kubernetes.io/hostname"
#: a label key's prefix: a DNS subdomain and a slash
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/")
#: a whole label key: a prefix and a name (at most 63: alphanumeric at both ends)
_KEY = re.compile(_PREFIX.pattern + r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
KUEUE_VERSIONS = ("v1beta1", "v1beta2")


@dataclass(frozen=True, slots=True)
class LabelKeys:
    """The node label keys of each tier, closest first."""

    prefix: str = TOPOGRAPH_PREFIX
    #: the NVLink domain's key ("": none)
    accelerator: str = TOPOGRAPH_ACCELERATOR

    def __post_init__(self) -> None:
        if len(self.prefix) > 240 or not _PREFIX.fullmatch(self.prefix):
            raise ValueError(
                f"label prefix {self.prefix!r} is not a DNS subdomain followed by '/' "
                "(e.g. fabric.example.com/)"
            )
        if self.accelerator and (
            len(self.accelerator) > 316 or not _KEY.fullmatch(self.accelerator)
        ):
            raise ValueError(
                f"accelerator label {self.accelerator!r} is not a label key with a prefix "
                "(e.g. accelerator.example.com/domain)"
            )

    def key(self, tier: int) -> str:
        return f"{self.prefix}tier-{tier}"

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key the map may set (and the controller manages): each tier's, the
        accelerator's."""
        return (*(self.key(t) for t in TIERS), *((self.accelerator,) if self.accelerator else ()))


def _labels(fmap: FabricMap, keys: LabelKeys, node: str, tiers: tuple[str, ...]) -> dict[str, str]:
    out = {keys.key(t): v for t, v in enumerate(tiers)}
    domain = fmap.domains.get(node)
    if keys.accelerator and domain:
        out[keys.accelerator] = domain
    return out


def node_labels(fmap: FabricMap, keys: LabelKeys) -> dict[str, dict[str, str]]:
    """Node -> {key: value} for every node the map places (its tiers, its NVLink domain),
    and every node with an NVLink domain the map does not place (the domain alone)."""
    out = {p.node: _labels(fmap, keys, p.node, p.tiers) for p in fmap.places}
    for node in fmap.domains:
        if node not in out:
            labels = _labels(fmap, keys, node, ())
            if labels:
                out[node] = labels
    return dict(sorted(out.items()))


def kueue_topology(
    keys: LabelKeys,
    name: str = "fabricscope",
    api_version: str = "v1beta2",
    *,
    depth: int = 2,
    domains: bool = False,
) -> dict[str, object]:
    """A Kueue ``Topology``: levels from the widest (the core group, or the spine block) to
    the node, the NVLink domain (``domains``) just above the node."""
    if api_version not in KUEUE_VERSIONS:
        raise ValueError(f"Kueue API version {api_version!r}: one of {', '.join(KUEUE_VERSIONS)}")
    levels = [{"nodeLabel": keys.key(t)} for t in reversed(TIERS[:depth])]
    if domains and keys.accelerator:
        levels.append({"nodeLabel": keys.accelerator})
    levels.append({"nodeLabel": HOSTNAME})
    return {
        "apiVersion": f"kueue.x-k8s.io/{api_version}",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": levels},
    }


#: each tier's name, as HyperNodes carry it (``tierName``) and prefix their names with
TIER_NAMES = ("leaf", "block", "core")


def hypernode_name(tier: int, value: str) -> str:
    """A HyperNode's name: ``leaf-<value>``, ``block-<value>`` or ``core-<value>`` (a DNS
    subdomain: values are lowercase)."""
    return f"{TIER_NAMES[tier]}-{value}"


def volcano_hypernodes(
    fmap: FabricMap, keys: LabelKeys | None = None, *, by_label: bool = False
) -> list[dict[str, object]]:
    """Volcano ``HyperNode`` resources: tier 1 (``tierName: leaf``) one per leaf group,
    tier 2 (``tierName: block``) one per spine block, its leaf groups' HyperNodes, and in a
    map with a core tier 3 (``tierName: core``) one per core group, its blocks'. Volcano
    counts tiers from 1 where the labels count from 0.

    A leaf group's nodes are listed by exact name, or with ``by_label`` selected by its
    tier-0 label (``labelMatch``), so that a node the controller relabels moves between
    existing HyperNodes without re-applying them."""
    keys = keys or LabelKeys()
    out: list[dict[str, object]] = []
    leaf_groups = fmap.groups(LEAF)
    for value, nodes in leaf_groups.items():
        if by_label:
            members: list[dict[str, object]] = [
                {
                    "type": "Node",
                    "selector": {"labelMatch": {"matchLabels": {keys.key(LEAF): value}}},
                }
            ]
        else:
            members = [_exact("Node", n) for n in nodes]
        out.append(_hypernode(hypernode_name(LEAF, value), LEAF, members))
    below = list(leaf_groups)
    for tier in fmap.tiers[1:]:
        children: dict[str, list[str]] = {}
        for value in below:
            children.setdefault(fmap.parent(tier - 1, value), []).append(
                hypernode_name(tier - 1, value)
            )
        for parent, kids in sorted(children.items()):
            members = [_exact("HyperNode", k) for k in sorted(kids)]
            out.append(_hypernode(hypernode_name(tier, parent), tier, members))
        below = sorted(children)
    return out


def _exact(kind: str, name: str) -> dict[str, object]:
    return {"type": kind, "selector": {"exactMatch": {"name": name}}}


def _hypernode(name: str, tier: int, members: list[dict[str, object]]) -> dict[str, object]:
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "fabricscope"}},
        "spec": {"tier": tier + 1, "tierName": TIER_NAMES[tier], "members": members},
    }


def slurm_tree(fmap: FabricMap) -> str:
    """``topology.conf`` for Slurm's tree plugin: one line per leaf group (its nodes), one
    per spine block (its leaf groups), and one per core group (its blocks) where the map has
    a core tier."""
    lines = ["# fabricscope topology: tree plugin (TopologyPlugin=topology/tree)"]
    leaf_groups = fmap.groups(LEAF)
    for value, nodes in leaf_groups.items():
        lines.append(f"SwitchName={value} Nodes={','.join(nodes)}")
    below = list(leaf_groups)
    for tier in fmap.tiers[1:]:
        children: dict[str, list[str]] = {}
        for value in below:
            children.setdefault(fmap.parent(tier - 1, value), []).append(value)
        for parent, kids in sorted(children.items()):
            lines.append(f"SwitchName={parent} Switches={','.join(sorted(kids))}")
        below = sorted(children)
    return "\n".join(lines) + "\n"


def slurm_block(fmap: FabricMap) -> str:
    """``topology.conf`` for Slurm's block plugin: one block per NVLink domain (its nodes),
    named ``nvl<N>`` in the order of the domains, each after a comment naming the domain.
    Nodes without a domain are in no block."""
    lines = ["# fabricscope topology: block plugin (TopologyPlugin=topology/block)"]
    for i, (domain, nodes) in enumerate(fmap.domain_groups().items(), 1):
        lines.append(f"# NVLink domain {domain}")
        lines.append(f"BlockName=nvl{i} Nodes={','.join(nodes)}")
    return "\n".join(lines) + "\n"


def graph(fmap: FabricMap, keys: LabelKeys) -> dict[str, object]:
    """Switches, nodes and the cables between them, with each node's tiers."""
    leaves = set(fmap.block_of)
    cores = {lk.peer for lk in fmap.core_links}
    labels = node_labels(fmap, keys)

    def role(guid: str) -> str:
        return "leaf" if guid in leaves else "core" if guid in cores else "spine"

    return {
        "switches": [
            {
                "guid": guid,
                "description": desc,
                "role": role(guid),
                **({"block": fmap.block_of[guid]} if guid in leaves else {}),
            }
            for guid, desc in fmap.switches.items()
        ],
        "nodes": [
            {
                "name": p.node,
                "leaves": list(p.leaves),
                "labels": labels.get(p.node, {}),
                **({"nvlink_domain": fmap.domains[p.node]} if p.node in fmap.domains else {}),
            }
            for p in fmap.places
        ],
        "links": [
            {"from": a.node, "device": a.device, "port": a.port, "to": a.leaf, "kind": "hca"}
            for a in fmap.attachments
        ]
        + [{"from": lk.switch, "to": lk.peer, "kind": "uplink"} for lk in fmap.links]
        + [{"from": lk.switch, "to": lk.peer, "kind": "core"} for lk in fmap.core_links],
    }
