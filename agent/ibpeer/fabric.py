"""The fabric one hop beyond the node: the switches its ports are cabled to (its leaves), each
leaf's own ports, and which of the leaf's uplinks this node reads.

A leaf's port table (:class:`SwitchTable`) says, for every port whose physical link is up,
what is at its far end: a channel adapter (a host's HCA) or another switch (an uplink,
towards a spine). It is read through the local port that reaches the leaf, one port at a
time (``smpquery -D portinfo 0,P k``, then ``smpquery -D nodeinfo 0,P,k`` for a port that is
up): ``2 x ports`` small queries to that one switch, never a walk beyond its neighbours.

Every host under a leaf sees the same uplinks. Reading all of them from every host would
cost each uplink one reader per host, in queries and in series, for the same numbers; so
each uplink has one reader (:func:`reader`): the leaf's CAs are ranked by a hash of (leaf
GUID, CA GUID) and the uplinks, in port order, are dealt to them in turn. Every host computes
the same answer from the same table, and the uplinks spread evenly: each CA reads the
ceiling or the floor of uplinks / CAs of its leaf (one, in a non-blocking fat tree). An
uplink whose reader runs no agent is read by nobody (said in the docs); a host reads at most
``limit`` uplinks (:func:`assigned_uplinks`), so its share stays bounded whatever the fabric.

One tier up, the spines' tables (:mod:`agent.ibpeer.spines`) are read by the reader of each
leaf's lowest-port uplink to each spine (:func:`first_to_each`).

Pure: the reading is in :mod:`agent.ibpeer.query`.
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


def _rank(switch_guid: str, host_guid: str) -> bytes:
    return hashlib.sha256(f"{switch_guid}/{host_guid}".encode()).digest()


def readers(table: SwitchTable) -> dict[int, str]:
    """Uplink port -> the CA GUID that reads it (see the module docstring); empty when no
    CA is cabled to the switch."""
    hosts = sorted(table.hosts, key=lambda h: (_rank(table.guid, h), h))
    if not hosts:
        return {}
    ups = sorted(u.port for u in table.uplinks)
    return {port: hosts[i % len(hosts)] for i, port in enumerate(ups)}


def reader(table: SwitchTable, port: int) -> str | None:
    """The CA GUID that reads uplink ``port`` of ``table``'s switch, or None."""
    return readers(table).get(port)


def assigned_uplinks(table: SwitchTable, own: frozenset[str], limit: int) -> tuple[SwitchLink, ...]:
    """The uplinks of ``table`` whose reader is one of ``own`` (this node's CA GUIDs on that
    switch), lowest port first, at most ``limit``."""
    if limit <= 0 or not own & table.hosts:
        return ()
    by = readers(table)
    mine = [u for u in table.uplinks if by.get(u.port) in own]
    return tuple(sorted(mine, key=lambda u: u.port)[:limit])


def first_to_each(table: SwitchTable) -> dict[str, int]:
    """Far switch GUID -> the lowest port of ``table``'s switch cabled to it."""
    out: dict[str, int] = {}
    for link in sorted(table.uplinks, key=lambda u: u.port):
        out.setdefault(link.peer_guid, link.port)
    return out
