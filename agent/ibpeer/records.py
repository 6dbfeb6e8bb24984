"""What the ``ibpeer`` sampler learns, as frozen records: each local port's cable and its far
end (:class:`PeerPort`), the leaf uplinks this node reads (:class:`Uplink`), the cables of
the spines at their far ends (:class:`SpineLink`), and the pass's snapshot
(:class:`IbPeerSnapshot`). ``None`` means not learnt (a step failed; the pass's
issues say which), never 0."""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.sysfs import ReadIssue
from agent.ibpeer.parse import NodeInfo, PortInfo
from agent.infiniband.records import PortCounter


@dataclass(frozen=True, slots=True)
class PeerId:
    """A cable's far end: the neighbour's node GUID and port number."""

    guid: str
    port: int


def best_common(a: PortInfo | None, b: PortInfo | None, attr: str) -> int | None:
    if a is None or b is None:
        return None
    common: frozenset[int] = getattr(a, attr) & getattr(b, attr)
    return max(common) if common else None


@dataclass(frozen=True, slots=True)
class PeerPort:
    """One local port and what was learnt about the other end of its cable.

    Identity (``peer``, ``peer_description``, ``peer_link``, ``peer_lid``) comes from the
    latest topology read; ``peer_counters`` and ``fields_dropped`` from this pass.
    ``changed_from`` is the previous neighbour when it changed within the hold time;
    ``changes_total`` counts changes since the agent started.
    """

    device: str
    port: int
    local: PortInfo | None
    peer: NodeInfo | None
    peer_description: str | None
    peer_link: PortInfo | None
    peer_lid: int | None
    peer_counters: tuple[PortCounter, ...]
    changed_from: PeerId | None = None
    changes_total: int = 0
    #: perfquery fields of no known counter left out this pass (over the caps), of the
    #: switch ports read through this local port: its far end and the uplinks it reads
    fields_dropped: int = 0
    #: the same, since the agent started
    fields_dropped_total: int = 0

    @property
    def peer_id(self) -> PeerId | None:
        return PeerId(self.peer.guid, self.peer.local_port) if self.peer is not None else None

    @property
    def width_degraded(self) -> bool | None:
        """Active width below the widest both ends support; None when unknown."""
        best = best_common(self.local, self.peer_link, "width_supported")
        if best is None or self.local is None or self.local.width_active is None:
            return None
        return self.local.width_active < best

    @property
    def speed_degraded(self) -> bool | None:
        """Active lane speed below the fastest both ends support; None when unknown."""
        best = best_common(self.local, self.peer_link, "speed_supported")
        if best is None or self.local is None or self.local.speed_active is None:
            return None
        return self.local.speed_active < best

    @property
    def on_switch(self) -> bool:
        """The far end is a switch whose LID is known: a leaf this node hangs off."""
        return self.peer is not None and self.peer.node_type == "switch" and bool(self.peer_lid)


@dataclass(frozen=True, slots=True)
class Uplink:
    """A cable from a leaf (the switch at the far end of a local port) to another switch,
    which this node reads: the leaf's port and the neighbour at its far end (a spine, in a
    two-tier fat tree), each end's counters from this pass.

    ``via`` is the local port (device, port) the queries leave by; ``peer_lid`` the far
    switch's LID (its port 0's), None until read.
    """

    switch_guid: str
    switch_description: str
    switch_lid: int
    switch_port: int
    peer_guid: str
    peer_port: int
    peer_description: str | None
    peer_lid: int | None
    via: tuple[str, int]
    counters: tuple[PortCounter, ...] = ()
    peer_counters: tuple[PortCounter, ...] = ()


@dataclass(frozen=True, slots=True)
class SpineLink:
    """A cable from a spine (the far end of an uplink this node reads) to another switch,
    from the spine's port table: the spine's port and the switch and port at its far end (a
    core switch, or another leaf under the spine)."""

    switch_guid: str
    switch_port: int
    peer_guid: str
    peer_port: int


@dataclass(frozen=True, slots=True)
class IbPeerSnapshot:
    ports: tuple[PeerPort, ...] = ()
    issues: tuple[ReadIssue, ...] = ()
    #: tool processes run in this pass and the wall time they took
    tool_calls: int = 0
    tool_seconds: float = 0.0
    uplinks: tuple[Uplink, ...] = ()
    #: whether this pass re-read the topology (neighbours, a leaf's table, uplinks' far ends)
    #: or only the counters
    topology_read: bool = False
    #: the spines' cables to other switches, from the tables of the spines this node reads
    #: (``spine_links`` on; empty otherwise)
    spine_links: tuple[SpineLink, ...] = ()
