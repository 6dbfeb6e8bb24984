"""Prometheus samples -> the fabric's edges, pure and bounded.

Two series carry the map (both from the agents' ``ibpeer`` sampler, ``instance`` = the node's
name as the chart relabels it):

- ``fabricscope_infiniband_peer_info{node_type="switch"}``: a local port (``device``,
  ``port``) of a node and the switch its cable lands on (``peer_guid``, ``peer_description``):
  the node's leaf, one per HCA port;
- ``fabricscope_infiniband_switch_link_info``: a leaf's port (``switch_guid``) cabled to
  another switch (``peer_guid``): the leaf's uplinks, each read by one host under the leaf;
- ``fabricscope_infiniband_spine_link_info`` (agents with ``--ibpeer.spine-links``): a
  spine's port cabled to another switch: the core above it, or a leaf below it;
- ``fabricscope_gpu_fabric_info``: a GPU's multi-node NVLink domain (``cluster_uuid``,
  ``clique_id``), the node's when all its GPUs that report one report the same.

An answer is untrusted: a GUID that is not ``0x`` and 16 hex digits, an empty or oversized
node name, a sample whose value is not 1 is left out and counted (:class:`Rejects`), never
raised; more than ``max_edges`` edges of either kind is an error (a map that large is a
mistake in the query, not a fabric).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: a node GUID as the agents print it
GUID = re.compile(r"0x[0-9a-f]{16}")
#: a Kubernetes node name (RFC 1123 subdomain), the instance label's value
NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
#: the most edges of either kind one map takes (a 10,000-node fabric with 8 rails is 80,000)
MAX_EDGES = 200_000

PEER_QUERY = 'fabricscope_infiniband_peer_info{node_type="switch"}'
UPLINK_QUERY = "fabricscope_infiniband_switch_link_info"
#: the spines' cables (to the core), where the agents read spines' tables
SPINE_QUERY = "fabricscope_infiniband_spine_link_info"
#: each GPU's multi-node NVLink domain, where its registration completed
DOMAIN_QUERY = "fabricscope_gpu_fabric_info"
#: a cluster UUID as the agents print it
CLUSTER_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: a port the node's agent says is down does not count (the peer identity is the last
#: one read, which outlives a link that went down between two topology reads)
PORT_UP_QUERY = "fabricscope_infiniband_port_up"


class MapError(ValueError):
    """The answer cannot make a map (one line saying why)."""


@dataclass(frozen=True, slots=True, order=True)
class Attachment:
    """One HCA port of ``node`` and the leaf switch its cable lands on."""

    node: str
    device: str
    port: str
    leaf: str
    leaf_description: str = ""


@dataclass(frozen=True, slots=True, order=True)
class SwitchLink:
    """A leaf's cable to another switch (an uplink), as read by a host under the leaf."""

    switch: str
    peer: str
    switch_description: str = ""
    peer_description: str = ""


@dataclass(slots=True)
class Rejects:
    """Samples left out of the map, by reason."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _guid(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.lower()
    return v if GUID.fullmatch(v) else None


def _text(value: str | None) -> str:
    return (value or "")[:64]


def attachments(
    samples: Iterable[tuple[Mapping[str, str], float]],
    up: Iterable[tuple[Mapping[str, str], float]] | None,
    rejects: Rejects,
    *,
    node_label: str = "instance",
    max_edges: int = MAX_EDGES,
) -> list[Attachment]:
    """Node -> leaf edges from ``peer_info`` samples, leaving out the ports ``up`` (the
    ``port_up`` samples) says are down (a port it does not mention is not known to be down)."""
    down_ports = {
        (s.get(node_label, ""), s.get("device", ""), s.get("port", ""))
        for s, v in (up or ())
        if v == 0
    }
    out: set[Attachment] = set()
    for labels, value in samples:
        node = labels.get(node_label, "")
        leaf = _guid(labels.get("peer_guid"))
        if not NODE_NAME.fullmatch(node):
            rejects.add("node_name")
            continue
        if leaf is None:
            rejects.add("guid")
            continue
        if value != 1 or labels.get("node_type", "switch") != "switch":
            rejects.add("value")
            continue
        device, port = labels.get("device", ""), labels.get("port", "")
        if (node, device, port) in down_ports:
            rejects.add("port_down")
            continue
        out.add(
            Attachment(node, device[:64], port[:8], leaf, _text(labels.get("peer_description")))
        )
        if len(out) > max_edges:
            raise MapError(f"more than {max_edges} node-to-leaf edges: narrow the query")
    return sorted(out)


def switch_links(
    samples: Iterable[tuple[Mapping[str, str], float]],
    rejects: Rejects,
    *,
    max_edges: int = MAX_EDGES,
) -> list[SwitchLink]:
    """Leaf -> switch edges from ``switch_link_info`` samples (both directions' duplicates,
    several readers, one edge)."""
    out: dict[tuple[str, str], SwitchLink] = {}
    for labels, value in samples:
        a, b = _guid(labels.get("switch_guid")), _guid(labels.get("peer_guid"))
        if a is None or b is None or a == b:
            rejects.add("guid")
            continue
        if value != 1:
            rejects.add("value")
            continue
        key = (a, b)
        if key not in out:
            out[key] = SwitchLink(
                a, b, _text(labels.get("switch_description")), _text(labels.get("peer_description"))
            )
        if len(out) > max_edges:
            raise MapError(f"more than {max_edges} switch-to-switch edges: narrow the query")
    return sorted(out.values())


def domains(
    samples: Iterable[tuple[Mapping[str, str], float]],
    rejects: Rejects,
    *,
    node_label: str = "instance",
    max_edges: int = MAX_EDGES,
) -> dict[str, str]:
    """Node -> its NVLink domain (``<cluster UUID>.<clique ID>``) from ``gpu_fabric_info``
    samples. A node whose GPUs report different domains (a tray split across NVLink
    partitions) gets none, counted as ``domain_conflict``: a domain label must be true of
    every GPU a job gets there."""
    found: dict[str, set[str]] = {}
    count = 0
    for labels, value in samples:
        node = labels.get(node_label, "")
        uuid = labels.get("cluster_uuid", "").lower()
        clique = labels.get("clique_id", "")
        if not NODE_NAME.fullmatch(node):
            rejects.add("node_name")
            continue
        if (
            not CLUSTER_UUID.fullmatch(uuid)
            or not clique.isdigit()
            or len(clique) > 10
            or int(clique) >= 1 << 32
        ):
            rejects.add("domain")
            continue
        if value != 1:
            rejects.add("value")
            continue
        found.setdefault(node, set()).add(f"{uuid}.{int(clique)}")
        count += 1
        if count > max_edges:
            raise MapError(f"more than {max_edges} GPU domain samples: narrow the query")
    out: dict[str, str] = {}
    for node, ds in sorted(found.items()):
        if len(ds) == 1:
            out[node] = ds.pop()
        else:
            rejects.add("domain_conflict")
    return out
