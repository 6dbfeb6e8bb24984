"""The map as schedulers read it (pure): node labels, a Kueue ``Topology``, Volcano
``HyperNode`` resources, a Slurm ``topology.conf`` (tree plugin) and a graph JSON.

Label keys default to topograph's (``fabric.topograph.run/tier-0`` the leaf,
``fabric.topograph.run/tier-1`` the spine block), so a scheduler configured for topograph
reads them unchanged; a prefix of one's own replaces ``fabric.topograph.run/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.topology.model import BLOCK, LEAF, TIERS, FabricMap

TOPOGRAPH_PREFIX = "fabric.topograph.run/"
HOSTNAME = "kubernetes.io/hostname"
#: a label key's prefix: a DNS subdomain and a slash
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/")
KUEUE_VERSIONS = ("v1beta1", "v1beta2")


@dataclass(frozen=True, slots=True)
class LabelKeys:
    """The node label keys of each tier, closest first."""

    prefix: str = TOPOGRAPH_PREFIX

    def __post_init__(self) -> None:
        if len(self.prefix) > 240 or not _PREFIX.fullmatch(self.prefix):
            raise ValueError(
                f"label prefix {self.prefix!r} is not a DNS subdomain followed by '/' "
                "(e.g. fabric.example.com/)"
            )

    def key(self, tier: int) -> str:
        return f"{self.prefix}tier-{tier}"

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.key(t) for t in TIERS)


def node_labels(fmap: FabricMap, keys: LabelKeys) -> dict[str, dict[str, str]]:
    """Node -> {key: value} for every node the map places."""
    return {p.node: dict(zip(keys.keys, p.tiers, strict=True)) for p in fmap.places}


def kueue_topology(
    keys: LabelKeys, name: str = "fabricscope", api_version: str = "v1beta2"
) -> dict[str, object]:
    """A Kueue ``Topology``: levels from the widest (the spine block) to the node."""
    if api_version not in KUEUE_VERSIONS:
        raise ValueError(f"Kueue API version {api_version!r}: one of {', '.join(KUEUE_VERSIONS)}")
    levels = [{"nodeLabel": keys.key(t)} for t in reversed(TIERS)]
    levels.append({"nodeLabel": HOSTNAME})
    return {
        "apiVersion": f"kueue.x-k8s.io/{api_version}",
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": levels},
    }


#: each tier's name, as HyperNodes carry it (``tierName``) and prefix their names with
TIER_NAMES = ("leaf", "block")


def hypernode_name(tier: int, value: str) -> str:
    """A HyperNode's name: ``leaf-<value>`` or ``block-<value>`` (a DNS subdomain: values
    are lowercase)."""
    return f"{TIER_NAMES[tier]}-{value}"


def volcano_hypernodes(
    fmap: FabricMap, keys: LabelKeys | None = None, *, by_label: bool = False
) -> list[dict[str, object]]:
    """Volcano ``HyperNode`` resources: tier 1 (``tierName: leaf``) one per leaf group,
    tier 2 (``tierName: block``) one per spine block, its leaf groups' HyperNodes. Volcano
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
    children: dict[str, list[str]] = {}
    for value in leaf_groups:
        children.setdefault(fmap.parent(LEAF, value), []).append(hypernode_name(LEAF, value))
    for block, kids in sorted(children.items()):
        members = [_exact("HyperNode", k) for k in sorted(kids)]
        out.append(_hypernode(hypernode_name(BLOCK, block), BLOCK, members))
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
    per spine block (its leaf groups)."""
    lines = ["# fabricscope topology: tree plugin (TopologyPlugin=topology/tree)"]
    leaf_groups = fmap.groups(LEAF)
    children: dict[str, list[str]] = {}
    for value, nodes in leaf_groups.items():
        lines.append(f"SwitchName={value} Nodes={','.join(nodes)}")
        children.setdefault(fmap.parent(LEAF, value), []).append(value)
    for block, kids in sorted(children.items()):
        lines.append(f"SwitchName={block} Switches={','.join(sorted(kids))}")
    return "\n".join(lines) + "\n"


def graph(fmap: FabricMap, keys: LabelKeys) -> dict[str, object]:
    """Switches, nodes and the cables between them, with each node's tiers."""
    leaves = set(fmap.block_of)
    return {
        "switches": [
            {
                "guid": guid,
                "description": desc,
                "role": "leaf" if guid in leaves else "spine",
                **({"block": fmap.block_of[guid]} if guid in leaves else {}),
            }
            for guid, desc in fmap.switches.items()
        ],
        "nodes": [
            {
                "name": p.node,
                "leaves": list(p.leaves),
                "labels": dict(zip(keys.keys, p.tiers, strict=True)),
            }
            for p in fmap.places
        ],
        "links": [
            {"from": a.node, "device": a.device, "port": a.port, "to": a.leaf, "kind": "hca"}
            for a in fmap.attachments
        ]
        + [{"from": lk.switch, "to": lk.peer, "kind": "uplink"} for lk in fmap.links],
    }
