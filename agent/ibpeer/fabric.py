"""The fabric one hop beyond the node: the switches its ports are cabled to (its leaves), each
leaf's own ports, and which of the leaf's uplinks this node reads.

A leaf's port table (:class:`SwitchTable`) says, for every port whose physical link is up,
what is at its far end: a channel adapter (a host's HCA) or another switch (an uplink,
towards a spine). It is read through the local port that reaches the leaf, one port at a
time (``smpquery -D portinfo 0,P k``, then ``smpquery -D nodeinfo 0,P,k`` for a port that is
up): ``2 x ports`` small queries to that one switch, never a walk beyond its neighbours.

Every host under a leaf sees the same uplinks. Reading all of them from every host would
cost each uplink one reader per host, in queries and in series, for the same numbers; so
each uplink has one reader, chosen by rendezvous hashing among the CA GUIDs the leaf's table
lists (:func:`reader`): every host computes the same answer from the same table, the uplinks
spread evenly over the hosts, and a host added or removed moves only its own share. An
uplink whose reader runs no agent is read by nobody (said in the docs); a host reads at most
``limit`` uplinks (:func:`assigned_uplinks`), so its share stays bounded whatever the fabric.

Pure: the reading is in :mod:`agent.ibpeer.topology`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SwitchLink:
    """One port of a switch whose physical link is up, and what is at its far end: the
    neighbour's node GUID, type (``CA``, ``switch``, ``router``, ``unknown``) and the port
    number the cable lands on there."""

    port: int
    peer_guid: str
    peer_type: str
    peer_port: int


@dataclass(frozen=True, slots=True)
class SwitchTable:
    """A switch's ports with a neighbour, as read at ``read_at`` (the sampler's clock)."""

    guid: str
    num_ports: int
    links: tuple[SwitchLink, ...]
    read_at: float

    @property
    def uplinks(self) -> tuple[SwitchLink, ...]:
        """Ports cabled to another switch."""
        return tuple(link for link in self.links if link.peer_type == "switch")

    @property
    def hosts(self) -> frozenset[str]:
        """Node GUIDs of the channel adapters cabled to the switch."""
        return frozenset(link.peer_guid for link in self.links if link.peer_type == "CA")

    def at(self, port: int) -> SwitchLink | None:
        for link in self.links:
            if link.port == port:
                return link
        return None


def _score(switch_guid: str, port: int, host_guid: str) -> int:
    digest = hashlib.sha256(f"{switch_guid}/{port}/{host_guid}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def reader(table: SwitchTable, port: int) -> str | None:
    """The CA GUID that reads uplink ``port`` of ``table``'s switch: the highest rendezvous
    score among the switch's CAs (ties, which need a SHA-256 collision, go to the lower
    GUID); None when no CA is cabled to it."""
    hosts = sorted(table.hosts)
    if not hosts:
        return None
    return max(hosts, key=lambda h: (_score(table.guid, port, h), h))


def assigned_uplinks(table: SwitchTable, own: frozenset[str], limit: int) -> tuple[SwitchLink, ...]:
    """The uplinks of ``table`` whose reader is one of ``own`` (this node's CA GUIDs on that
    switch), lowest port first, at most ``limit``."""
    if limit <= 0 or not own & table.hosts:
        return ()
    mine = [u for u in table.uplinks if reader(table, u.port) in own]
    return tuple(sorted(mine, key=lambda u: u.port)[:limit])
