"""The ``ibpeer`` sampler: the other end of every local InfiniBand cable, the leaf switches
those cables land on, and the leaf uplinks this node reads; never a sweep of the fabric.

The runner calls it every ``--ibpeer.interval`` (1 minute by default). Two schedules share
the pass:

- **topology**, every ``topology_interval`` (5 minutes by default), and at once when a port
  appears, a neighbour could not be read or a counter query failed: each local port's
  neighbour (:func:`~agent.ibpeer.query.read_neighbour`: 4 or 5 processes per port) and the
  far end of each uplink this node reads (:func:`~agent.ibpeer.query.read_far_end`: 2
  each). A leaf's port table (:func:`~agent.ibpeer.query.read_table`: at most 2 processes
  per port of the leaf), which says which uplinks this node reads
  (:mod:`agent.ibpeer.fabric`), is read when the leaf is first seen and then every
  ``table_interval`` (an hour), ``tables_per_pass`` at a time (one) and not in a pass that
  re-read the neighbours (unless the pass before did too), so a node cabled to eight leaves
  spreads them over eight passes.
- **counters**, every pass: each watched switch's ports (the far ends of the local cables,
  the uplinks' two ends) in one ``perfquery -l`` call per switch (two with ``extended``)
  (:func:`~agent.ibpeer.query.read_counters`).

In the agent the sampler runs in a supervised child process (:mod:`agent.ibpeer.child`) that
is the subreaper of everything the tools start: after every tool call it kills and reaps
whatever the call left (a prefix that ran ``setsid`` or double-forked cannot slip out), and
when the agent stops, the child and any tool still running go with it. Its state (the
topology, the tables, the moved cables) lives in that child; a child that is replaced reads
the topology again. A step that fails (the tool exits non-zero, its output does not parse)
costs what depends on it and one :class:`~agent.core.sysfs.ReadIssue`; the rest carries on.
A tool that does not finish in ``tool_timeout`` (the MAD layer stopped answering) is killed
with its whole tree and fails the whole pass with reason ``timeout``: the runner counts it,
the scrape never waits. Without InfiniBand ports, without infiniband-diags on ``PATH`` or
without access to the umad device the sampler has no data (``NoData``), which is why it can
be on by default (the first two are checked in the agent, before any child is started).

Bounded series: the tools' output is untrusted (a wrapper in ``--ibpeer.command-prefix``, a
MAD answer from a switch's PMA). perfquery fields of no known counter at the far end of a
local cable are exported under their own names, at most
:data:`~agent.infiniband.perfquery.MAX_UNKNOWN_FIELDS` per port's answer and
:data:`NODE_UNKNOWN_FIELDS` per node and pass (first ports first); the rest are left out and
counted per local port (``fields_dropped``, ``fields_dropped_total``). An uplink end's keep
only the known counters (no series carries the others). Every other label value is a
bounded identifier (a GUID, a port number, a node type) or a node description, cleaned and
cut to 64 characters.

The sampler remembers each port's neighbour between topology reads: a different (GUID,
port) is a moved cable, counted and held as ``changed_from`` for
:data:`CHANGE_HOLD_SECONDS`.
"""

from __future__ import annotations

import errno
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.core.errors import NoData
from agent.core.findings import Finding
from agent.core.sysfs import Issues, SysfsReader, classify_os_error
from agent.core.tools import run_tool
from agent.ibpeer.fabric import SwitchTable, assigned_uplinks
from agent.ibpeer.parse import NodeInfo
from agent.ibpeer.query import (
    Pass,
    SwitchPortCounters,
    ToolRunner,
    read_counters,
    read_far_end,
    read_neighbour,
    read_table,
)
from agent.ibpeer.records import IbPeerSnapshot, PeerId, PeerPort, Uplink, best_common
from agent.ibpeer.spines import SpineTables
from agent.infiniband.parse import parse_counter, parse_state, parse_text
from agent.infiniband.perfquery import PERFQUERY_NAMES
from agent.infiniband.records import PHYS_STATE_LINK_UP, PortCounter
from agent.infiniband.sampler import CLASS_DIR

__all__ = [
    "IbPeerSampler",
    "IbPeerSnapshot",
    "PeerId",
    "PeerPort",
    "Uplink",
    "findings",
    "local_ib_ports",
    "missing_tools",
    "warn_missing",
]

log = logging.getLogger(__name__)

#: how long a neighbour change stays on the snapshot (and in ``fabricscope topo``)
CHANGE_HOLD_SECONDS = 3600.0
TOOLS = ("smpquery", "perfquery")
#: perfquery fields of no known counter exported per node and pass (over all the switch
#: ports read, the local ports' far ends first)
NODE_UNKNOWN_FIELDS = 256
_KNOWN_COUNTERS = frozenset(PERFQUERY_NAMES.values())


def local_ib_ports(sys: SysfsReader, issues: Issues) -> list[tuple[str, int]]:
    """(device, port) of every InfiniBand port whose physical link is up. Raises ``NoData``
    without RDMA devices or InfiniBand ports (RoCE ports have no subnet to ask)."""
    try:
        devices = sys.listdir(CLASS_DIR)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NoData(f"{CLASS_DIR} is absent: no RDMA devices") from exc
        issues.add(CLASS_DIR, classify_os_error(exc), exc.strerror or str(exc))
        return []
    out: list[tuple[str, int]] = []
    seen_ib = False
    for device in devices:
        ports_dir = f"{CLASS_DIR}/{device}/ports"
        try:
            entries = sys.listdir(ports_dir)
        except OSError as exc:
            issues.add(ports_dir, classify_os_error(exc), exc.strerror or str(exc))
            continue
        for entry in sorted((e for e in entries if e.isdigit()), key=int):
            p = f"{ports_dir}/{entry}"
            layer = issues.read(f"{p}/link_layer", parse_text)
            if layer != "InfiniBand":
                continue
            seen_ib = True
            phys = issues.read(f"{p}/phys_state", parse_state)
            if phys is not None and phys.number == PHYS_STATE_LINK_UP:
                out.append((device, int(entry)))
    if not seen_ib and not issues.items:
        raise NoData("no InfiniBand ports (RoCE and iWARP ports have no subnet to query)")
    return out


def missing_tools(prefix: Sequence[str]) -> list[str]:
    """The tools the sampler runs (and the prefix's program) that are not on ``PATH``."""
    return [t for t in (*prefix[:1], *TOOLS) if shutil.which(t) is None]


def warn_missing(missing: Sequence[str]) -> None:
    if missing:
        log.warning(
            "ibpeer: %s not on PATH: the far ends of this node's InfiniBand cables are not "
            "read (Debian/Ubuntu: infiniband-diags; RHEL: infiniband-diags from rdma-core)",
            ", ".join(missing),
        )


@dataclass(frozen=True, slots=True)
class _Leaf:
    """A switch at the far end of a local port: how to reach it and its LID."""

    node: NodeInfo
    description: str
    lid: int
    via: tuple[str, int]
    #: the leaf's ports this node's cables land on
    ports: frozenset[int]


@dataclass(frozen=True, slots=True)
class _Topology:
    ports: tuple[tuple[str, int], ...]
    peers: tuple[PeerPort, ...]
    read_at: float
    #: each port's link_downed counter at the read: a cable moved to another switch port
    #: went down first, so a change re-reads the topology at once
    downed: tuple[int | None, ...]


def _downed(sys: SysfsReader, ports: Sequence[tuple[str, int]]) -> tuple[int | None, ...]:
    """Each local port's ``counters/link_downed`` (None when unreadable: no issue, it only
    hurries a topology read)."""
    quiet = Issues(sys)
    return tuple(
        quiet.read_optional(f"{CLASS_DIR}/{d}/ports/{p}/counters/link_downed", parse_counter)
        for d, p in ports
    )


@dataclass(slots=True)
class IbPeerSampler:
    """Samples the far end of every local InfiniBand cable and the uplinks of the leaves they
    land on. See the module docstring; times in seconds of ``clock``."""

    sys: SysfsReader
    prefix: tuple[str, ...] = ()
    tool_timeout: float = 2.0
    pass_budget: float = 8.0
    env: Mapping[str, str] | None = None
    clock: Callable[[], float] = time.monotonic
    topology_interval: float = 300.0
    table_interval: float = 3600.0
    tables_per_pass: int = 1
    #: read no table in a pass that re-read the neighbours (off for ``--once``: one pass)
    spread: bool = True
    uplinks_max: int = 8
    #: read the port tables of the spines at the far ends of the uplinks this node reads
    #: (each leaf's lowest-port uplink to each spine), and export their cables to other
    #: switches: the core tier of a three-tier fabric
    spine_links: bool = False
    #: read PortCountersExtended too (64-bit data and packet counters; ``--collector.detail=
    #: full`` exports them): a second perfquery per switch
    extended: bool = False
    #: runs one tool (a replay of recorded answers in the series budget)
    tool: ToolRunner = run_tool
    #: kill and reap every descendant after each tool call (in a supervised child only: it
    #: owns no other child process)
    reap: bool = False
    _topo: _Topology | None = None
    _stale: bool = False
    _tables: dict[str, SwitchTable] = field(default_factory=dict)
    #: (leaf GUID, leaf port, far GUID, far port) -> the far switch's description and LID
    _far: dict[tuple[str, int, str, int], tuple[str | None, int | None]] = field(
        default_factory=dict
    )
    _uplinks: tuple[Uplink, ...] = ()
    _spines: SpineTables = field(default_factory=SpineTables)
    _missing: list[str] | None = None
    _deferred: bool = False
    _last: dict[tuple[str, int], PeerId] = field(default_factory=dict)
    _changed: dict[tuple[str, int], tuple[PeerId, float]] = field(default_factory=dict)
    _changes: dict[tuple[str, int], int] = field(default_factory=dict)
    _dropped: dict[tuple[str, int], int] = field(default_factory=dict)

    name = "ibpeer"

    def sample(self) -> IbPeerSnapshot:
        issues = Issues(self.sys)
        ports = local_ib_ports(self.sys, issues)
        self._need_tools()
        run = Pass(
            self.prefix,
            self.tool_timeout,
            time.monotonic() + self.pass_budget,
            self.env,
            self.tool,
            reap=self.reap,
        )
        now = self.clock()
        topo_read = False
        downed = _downed(self.sys, ports)
        if self._topology_due(ports, downed, now):
            # after a failed counter query nothing known is trusted (a LID may have moved)
            t = self._topo
            known = {(p.device, p.port): p for p in t.peers} if t and not self._stale else {}
            peers = tuple(
                self._remember(read_neighbour(run, issues, d, p, known.get((d, p))), now)
                for d, p in ports
            )
            self._topo = _Topology(tuple(ports), peers, now, downed)
            self._stale = False
            topo_read = True
        assert self._topo is not None
        peers = self._topo.peers
        leaves = _leaves(peers)
        self._tables = {g: t for g, t in self._tables.items() if g in leaves}
        # a pass that re-read the neighbours leaves the tables to the next (spread the cost),
        # but never two in a row: a topology re-read every pass must not starve them
        defer = topo_read and self.spread and not self._deferred
        self._deferred = defer
        tables_read = not defer and self._read_due_tables(run, issues, leaves, now)
        if topo_read or tables_read:
            self._uplinks = self._read_uplinks(run, issues, leaves)
        spines_read = self.spine_links and self._spines.read_due(
            run,
            issues,
            self._uplinks,
            self._tables,
            now,
            skip=defer or (tables_read and self.spread),
            interval=self.table_interval,
            per_pass=self.tables_per_pass,
        )
        got = self._read_counters(run, issues, peers, self._uplinks)
        cap = _UnknownCap(NODE_UNKNOWN_FIELDS)
        held = [
            replace(
                self._held(p, now),
                peer_counters=cap.take((p.device, p.port), _at(got, p.peer_lid, p.peer.local_port)),
            )
            if p.peer is not None
            else self._held(p, now)
            for p in peers
        ]
        uplinks_out = tuple(
            replace(
                u,
                counters=_known(_at(got, u.switch_lid, u.switch_port)),
                peer_counters=_known(_at(got, u.peer_lid, u.peer_port)),
            )
            for u in self._uplinks
        )
        ports_out = tuple(
            self._count_dropped(p, cap.dropped.get((p.device, p.port), 0)) for p in held
        )
        return IbPeerSnapshot(
            ports_out,
            issues.freeze(),
            run.calls,
            run.seconds,
            uplinks=uplinks_out,
            topology_read=topo_read or tables_read or spines_read,
            spine_links=self._spines.links() if self.spine_links else (),
        )

    def _need_tools(self) -> None:
        if self._missing is None:
            # a replay of recorded answers runs no tool
            self._missing = missing_tools(self.prefix) if self.tool is run_tool else []
            warn_missing(self._missing)
        if self._missing:
            raise NoData(f"{', '.join(self._missing)} not on PATH")

    def _topology_due(
        self, ports: Sequence[tuple[str, int]], downed: tuple[int | None, ...], now: float
    ) -> bool:
        t = self._topo
        return (
            t is None
            or self._stale
            or t.ports != tuple(ports)
            or t.downed != downed
            or now - t.read_at >= self.topology_interval
            or any(p.peer is None or p.peer_lid is None for p in t.peers)
        )

    def _read_due_tables(
        self, run: Pass, issues: Issues, leaves: Mapping[str, _Leaf], now: float
    ) -> bool:
        def age(guid: str) -> float:
            table = self._tables.get(guid)
            return float("inf") if table is None else now - table.read_at

        if self.uplinks_max <= 0:  # a table only says which uplinks to read
            return False
        due = sorted(
            (g for g in leaves if age(g) >= self.table_interval), key=lambda g: (-age(g), g)
        )
        for guid in due[: max(self.tables_per_pass, 0)]:
            leaf = leaves[guid]
            table = read_table(run, issues, leaf.via, leaf.node, now)
            if table is not None:
                self._tables[guid] = table
        return bool(due[: max(self.tables_per_pass, 0)])

    def _read_uplinks(
        self, run: Pass, issues: Issues, leaves: Mapping[str, _Leaf]
    ) -> tuple[Uplink, ...]:
        """The uplinks this node reads; a far end's description and LID are read when the
        uplink is new to it (or its LID was not learnt), and again after a counter query
        failed (``_stale`` clears them)."""
        out: list[Uplink] = []
        far: dict[tuple[str, int, str, int], tuple[str | None, int | None]] = {}
        for guid in sorted(leaves):
            leaf = leaves[guid]
            table = self._tables.get(guid)
            if table is None:
                continue
            own = frozenset(link.peer_guid for k in leaf.ports if (link := table.at(k)) is not None)
            for link in assigned_uplinks(table, own, self.uplinks_max - len(out)):
                key = (guid, link.port, link.peer_guid, link.peer_port)
                known = self._far.get(key)
                if known is None or known[1] is None:
                    known = read_far_end(run, issues, leaf.via, link)
                far[key] = known
                out.append(
                    Uplink(
                        switch_guid=guid,
                        switch_description=leaf.description,
                        switch_lid=leaf.lid,
                        switch_port=link.port,
                        peer_guid=link.peer_guid,
                        peer_port=link.peer_port,
                        peer_description=known[0],
                        peer_lid=known[1],
                        via=leaf.via,
                    )
                )
        self._far = far
        return tuple(out)

    def _read_counters(
        self, run: Pass, issues: Issues, peers: Sequence[PeerPort], uplinks: Sequence[Uplink]
    ) -> dict[int, dict[int, SwitchPortCounters]]:
        """Every watched switch port's counters, by LID and port: two calls per LID."""
        targets: dict[int, tuple[tuple[str, int], set[int]]] = {}

        def want(lid: int | None, via: tuple[str, int], port: int) -> None:
            if lid:
                targets.setdefault(lid, (via, set()))[1].add(port)

        for p in peers:
            if p.peer is not None:
                want(p.peer_lid, (p.device, p.port), p.peer.local_port)
        for u in uplinks:
            want(u.switch_lid, u.via, u.switch_port)
            want(u.peer_lid, u.via, u.peer_port)
        out: dict[int, dict[int, SwitchPortCounters]] = {}
        for lid, (via, ports) in sorted(targets.items()):
            got = read_counters(run, issues, via, lid, sorted(ports), extended=self.extended)
            if len(got) < len(ports):
                # a LID moved, a port vanished: re-read the topology and the far ends
                self._stale = True
                self._far = {}
            out[lid] = got
        return out

    def _remember(self, port: PeerPort, now: float) -> PeerPort:
        key = (port.device, port.port)
        current = port.peer_id
        previous = self._last.get(key)
        if current is not None:
            if previous is not None and previous != current:
                self._changed[key] = (previous, now)
                self._changes[key] = self._changes.get(key, 0) + 1
                log.warning(
                    "ibpeer: %s port %d now cabled to %s port %d (was %s port %d)",
                    port.device,
                    port.port,
                    current.guid,
                    current.port,
                    previous.guid,
                    previous.port,
                )
            self._last[key] = current
        return port

    def _count_dropped(self, port: PeerPort, dropped: int) -> PeerPort:
        key = (port.device, port.port)
        total = self._dropped.get(key, 0) + dropped
        self._dropped[key] = total
        if dropped:
            log.debug("ibpeer: %d perfquery fields read through %s/%d left out", dropped, *key)
        return replace(port, fields_dropped=dropped, fields_dropped_total=total)

    def _held(self, port: PeerPort, now: float) -> PeerPort:
        key = (port.device, port.port)
        held = self._changed.get(key)
        if held is not None and now - held[1] > CHANGE_HOLD_SECONDS:
            del self._changed[key]
            held = None
        return replace(
            port,
            changed_from=held[0] if held is not None else None,
            changes_total=self._changes.get(key, 0),
        )


def _leaves(peers: Sequence[PeerPort]) -> dict[str, _Leaf]:
    """The switches at the far ends of the local cables, by GUID (reached by the first local
    port cabled to each)."""
    out: dict[str, _Leaf] = {}
    for p in peers:
        if not p.on_switch or p.peer is None or p.peer_lid is None:
            continue
        known = out.get(p.peer.guid)
        ports = frozenset({p.peer.local_port}) | (known.ports if known else frozenset())
        out[p.peer.guid] = _Leaf(
            known.node if known else p.peer,
            known.description if known else p.peer_description or "",
            known.lid if known else p.peer_lid,
            known.via if known else (p.device, p.port),
            ports,
        )
    return out


_NONE = SwitchPortCounters(())


def _at(
    got: Mapping[int, Mapping[int, SwitchPortCounters]], lid: int | None, port: int
) -> SwitchPortCounters:
    if lid is None:
        return _NONE
    return got.get(lid, {}).get(port, _NONE)


def _known(got: SwitchPortCounters) -> tuple[PortCounter, ...]:
    """An uplink end's counters: no series carries a switch port's field of no known
    counter, so none is kept."""
    return tuple(c for c in got.counters if c.name in _KNOWN_COUNTERS)


@dataclass(slots=True)
class _UnknownCap:
    """A pass's perfquery fields of no known counter at the local cables' far ends, kept up
    to :data:`NODE_UNKNOWN_FIELDS` in the order taken; what is left out (here, or already by
    the per-answer cap) is counted by local port."""

    room: int
    dropped: dict[tuple[str, int], int] = field(default_factory=dict)

    def take(self, via: tuple[str, int], got: SwitchPortCounters) -> tuple[PortCounter, ...]:
        kept: list[PortCounter] = []
        dropped = got.dropped
        for c in got.counters:
            if c.name not in _KNOWN_COUNTERS:
                if self.room <= 0:
                    dropped += 1
                    continue
                self.room -= 1
            kept.append(c)
        if dropped:
            self.dropped[via] = self.dropped.get(via, 0) + dropped
        return tuple(kept)


# -- analysis --------------------------------------------------------------------------


def _lanes(widths: frozenset[int]) -> str:
    return "/".join(f"{w}X" for w in sorted(widths)) or "?"


def _gbps(speed: int) -> str:
    return f"{speed / 125_000_000:g} Gb/s"


def findings(snap: IbPeerSnapshot) -> list[Finding]:
    """Neighbour errors, links trained below what both ends support, moved cables."""
    out: list[Finding] = []
    for p in snap.ports:
        subject = f"{p.device}/{p.port}"
        peer = f"{p.peer.guid} port {p.peer.local_port}" if p.peer else "its neighbour"
        if p.peer_description:
            peer += f" ({p.peer_description})"
        errors = {
            c.name: c.raw
            for c in p.peer_counters
            if c.name in ("symbol_error", "port_rcv_errors", "link_error_recovery", "link_downed")
            and c.raw > 0
        }
        if errors:
            listed = ", ".join(f"{k} {v}" for k, v in sorted(errors.items()))
            out.append(
                Finding(
                    "ib_peer_errors",
                    subject,
                    f"the far end of {subject}, {peer}, counts {listed}: what it receives from "
                    "this node's transmitter or the cable is damaged.",
                )
            )
        if p.width_degraded and p.local is not None and p.peer_link is not None:
            best = best_common(p.local, p.peer_link, "width_supported")
            enabled = p.local.width_enabled & p.peer_link.width_enabled
            why = (
                f"; enabled {_lanes(enabled)} on both ends"
                if enabled and best is not None and max(enabled) < best
                else ""
            )
            out.append(
                Finding(
                    "ib_link_width_degraded",
                    subject,
                    f"{subject} trained at {p.local.width_active}X; both ends support "
                    f"{best}X ({peer}){why}.",
                )
            )
        if p.speed_degraded and p.local is not None and p.local.speed_active is not None:
            best = best_common(p.local, p.peer_link, "speed_supported")
            assert best is not None
            out.append(
                Finding(
                    "ib_link_speed_degraded",
                    subject,
                    f"{subject} trained at {_gbps(p.local.speed_active)} a lane; both ends support "
                    f"{_gbps(best)} ({peer}).",
                )
            )
        if p.changed_from is not None and p.peer is not None:
            out.append(
                Finding(
                    "ib_peer_changed",
                    subject,
                    f"{subject} is now cabled to {peer}; it was {p.changed_from.guid} port "
                    f"{p.changed_from.port}.",
                )
            )
    return sorted(out)
