"""The spines' port tables (``--ibpeer.spine-links``): one tier above the leaves, for a fabric
with a core tier.

The spine at the far end of an uplink this node reads has its own port table, read the way a
leaf's is, one hop further (``smpquery -D nodeinfo 0,P,k``, then ``portinfo 0,P,k j`` and
``nodeinfo 0,P,k,j`` for each of its ports: at most ``1 + 2 x ports`` small queries to that
one switch). Its cables to other switches go down to the pod's leaves and up to the core;
which is which the agents cannot tell (both are switches), the fabric map can (a leaf has
hosts under it).

A spine is read by the reader of each leaf's lowest-port uplink to it
(:func:`~agent.ibpeer.fabric.first_to_each`): one reader per (leaf, spine), so each spine's
table is read and exported once per leaf under it, not once per cable, and a spine stays
read while any one of its leaves has an agent on the reader. Tables are re-read every
``table_interval``, ``tables_per_pass`` at a time, not in a pass that read a leaf's table
(unless the sampler does not spread its reads: ``--once``). A node exports at most
:data:`SPINE_LINKS_MAX` spine cables.

May import ``agent.core`` and the rest of ``agent.ibpeer``; nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.core.sysfs import Issues
from agent.ibpeer.fabric import SwitchTable, first_to_each
from agent.ibpeer.query import Pass, read_switch_node, read_table
from agent.ibpeer.records import SpineLink, Uplink

log = logging.getLogger(__name__)

#: the most spine cables one node exports: a 64-port spine's whole table four times over
SPINE_LINKS_MAX = 256


def targets(
    uplinks: Sequence[Uplink], tables: Mapping[str, SwitchTable]
) -> dict[str, tuple[tuple[str, int], int]]:
    """Spine GUID -> (local port, leaf port) that reaches it, for the spines this node reads:
    those whose leaf's lowest-port uplink to them is one this node reads."""
    out: dict[str, tuple[tuple[str, int], int]] = {}
    for u in uplinks:
        table = tables.get(u.switch_guid)
        if table is not None and first_to_each(table).get(u.peer_guid) == u.switch_port:
            out.setdefault(u.peer_guid, (u.via, u.switch_port))
    return out


@dataclass(slots=True)
class SpineTables:
    """The tables of the spines this node reads, kept between passes."""

    tables: dict[str, SwitchTable] = field(default_factory=dict)

    def read_due(
        self,
        run: Pass,
        issues: Issues,
        uplinks: Sequence[Uplink],
        leaf_tables: Mapping[str, SwitchTable],
        now: float,
        *,
        skip: bool,
        interval: float,
        per_pass: int,
    ) -> bool:
        """Read the spine tables due (``skip``: none this pass); whether one was read."""
        want = targets(uplinks, leaf_tables)
        self.tables = {g: t for g, t in self.tables.items() if g in want}
        if skip:
            return False
        due = sorted(
            (g for g in want if g not in self.tables or now - self.tables[g].read_at >= interval),
            key=lambda g: (g in self.tables, g),
        )[: max(per_pass, 0)]
        for guid in due:
            via, leaf_port = want[guid]
            node = read_switch_node(run, issues, via, leaf_port)
            if node is None:
                continue
            if node.guid != guid:  # recabled since the leaf's table was read
                issues.add(
                    f"{via[0]}/{via[1]}: uplink {leaf_port}",
                    "parse",
                    f"far end is {node.guid}, the leaf's table said {guid}",
                )
                continue
            table = read_table(run, issues, via, node, now, beyond=leaf_port)
            if table is not None:
                self.tables[guid] = table
        return bool(due)

    def links(self) -> tuple[SpineLink, ...]:
        """Every read spine's cables to other switches, spine by spine, port order; at most
        :data:`SPINE_LINKS_MAX`."""
        out = [
            SpineLink(guid, link.port, link.peer_guid, link.peer_port)
            for guid, table in sorted(self.tables.items())
            for link in sorted(table.uplinks, key=lambda u: u.port)
        ]
        if len(out) > SPINE_LINKS_MAX:
            log.debug("ibpeer: %d spine cables, %d exported", len(out), SPINE_LINKS_MAX)
        return tuple(out[:SPINE_LINKS_MAX])
