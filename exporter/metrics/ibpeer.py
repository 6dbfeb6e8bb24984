"""Metric specs and rendering for the ``ibpeer`` sampler: both ends of each InfiniBand cable,
and the leaf uplinks this node reads.

The neighbour's PMA counters carry the local counters' names with ``port`` turned into
``peer_port`` (``fabricscope_infiniband_port_symbol_errors_total`` ->
``fabricscope_infiniband_peer_port_symbol_errors_total``), the same units (data in bytes)
and help, and join the local series on ``device``/``port``; ``peer_guid``/``peer_port``
name the far end, whose description and type live in ``fabricscope_infiniband_peer_info``.
Link width and speed come from both ends' PortInfo, one series per ``end``.

A leaf's uplinks are switch ports, not the node's: ``fabricscope_infiniband_switch_link_info``
says which switch port (``switch_guid``, ``switch_port``) is cabled to which (``peer_guid``,
``peer_port``), and ``fabricscope_infiniband_switch_port_*`` carry each end's counters,
labelled by the switch and port they were read at. Each uplink has one reader among the
hosts under its leaf (``agent/ibpeer/fabric.py``), so these series come from one node each.

Below ``full`` only what the shipped alerts, boards and ``explain`` read is exported: the
far ends' identities, every error and discard counter of either kind of switch port once
non-zero (a zero is left out, never an error), an uplink's wait and data at its leaf end
(its xmit_wait share), and the links trained below both ends' best (see each spec's
``detail``/``fold``).
"""

from __future__ import annotations

from agent.ibpeer.parse import PortInfo
from agent.ibpeer.sampler import IbPeerSnapshot, PeerPort, Uplink
from agent.infiniband.parse import PMA_WIDTHS
from agent.infiniband.perfquery import EXT_DATA, EXT_IETF, PERFQUERY_NAMES
from agent.infiniband.records import PortCounter
from exporter.metrics.infiniband_counters import pma_specs
from exporter.metrics.spec import Detail, Families, MetricSpec

_DP = ("device", "port")
_DPE = ("device", "port", "end")
_PEER = ("device", "port", "peer_guid", "peer_port")
_SWITCH = ("switch_guid", "switch_port")
_LOCAL_PREFIX = "fabricscope_infiniband_port_"
_PEER_PREFIX = "fabricscope_infiniband_peer_port_"
_SWITCH_PREFIX = "fabricscope_infiniband_switch_port_"

#: a switch port's counters of load, not of errors: data, packets and the wait
_LOAD = (
    frozenset(
        {
            "port_xmit_wait",
            "port_xmit_data",
            "port_rcv_data",
            "port_xmit_packets",
            "port_rcv_packets",
        }
    )
    | EXT_IETF
)
#: the neighbour's counters at the minimal level: what the alerts, boards and explain read;
#: every other error and discard counter is there from the default level; each only once it
#: is non-zero (a healthy cable's switch end counts none of them)
_PEER_MINIMAL = frozenset({"symbol_error", "port_rcv_errors", "port_xmit_discards"})
#: an uplink's leaf end below full detail: its wait and data (the xmit_wait share) always
_SWITCH_LOAD = frozenset({"port_xmit_wait", "port_xmit_data"})
_SWITCH_MINIMAL = _PEER_MINIMAL | _SWITCH_LOAD
#: an uplink end's counters at all: its errors and discards, its wait and data (the packet
#: counters of a switch port are not read into series)
_SWITCH_COUNTERS = _SWITCH_LOAD | {"port_rcv_data"}
_ERRORS_FOLD = "Below full, only once non-zero (explain reads an absent one as 0)."
_LOAD_FOLD = "Below full, only at an uplink's leaf end (the far end's at full)."

PEER_INFO = MetricSpec(
    "fabricscope_infiniband_peer_info",
    "gauge",
    "The other end of a local InfiniBand port's cable, from a directed-route NodeInfo and "
    "NodeDescription one hop out of it; always 1. peer_port is the neighbour's port number, "
    "peer_description its node description (printable ASCII, at most 64 characters), lid "
    "the LID its counters were read at.",
    ("device", "port", "peer_guid", "peer_port", "node_type", "lid", "peer_description"),
)
PEER_CHANGES = MetricSpec(
    "fabricscope_infiniband_peer_changes_total",
    "counter",
    "Times the other end of a local port (neighbour GUID and port) changed between two "
    "topology reads since the agent started: a moved cable or a replaced neighbour.",
    _DP,
    detail="default",
    fold="Below full, only ports whose neighbour changed (the alert reads the info series).",
)
ACTIVE_WIDTH = MetricSpec(
    "fabricscope_infiniband_link_active_width",
    "gauge",
    "Lanes the link trained at (PortInfo LinkWidthActive: 1, 2, 4, 8 or 12), as each end "
    "reports it (end: local or peer).",
    _DPE,
    detail="full",
)
ENABLED_WIDTH = MetricSpec(
    "fabricscope_infiniband_link_enabled_width_max",
    "gauge",
    "Widest width enabled on each end (PortInfo LinkWidthEnabled), in lanes.",
    _DPE,
    detail="full",
)
SUPPORTED_WIDTH = MetricSpec(
    "fabricscope_infiniband_link_supported_width_max",
    "gauge",
    "Widest width each end supports (PortInfo LinkWidthSupported), in lanes.",
    _DPE,
    detail="full",
)
ACTIVE_SPEED = MetricSpec(
    "fabricscope_infiniband_link_active_lane_speed_bytes_per_second",
    "gauge",
    "Per-lane signalling rate the link trained at (PortInfo LinkSpeedExtActive when set, "
    "else LinkSpeedActive; Gb/s converted to bytes per second), as each end reports it.",
    _DPE,
    "bytes_per_second",
    detail="full",
)
ENABLED_SPEED = MetricSpec(
    "fabricscope_infiniband_link_enabled_max_lane_speed_bytes_per_second",
    "gauge",
    "Fastest per-lane speed enabled on each end (LinkSpeedEnabled and LinkSpeedExtEnabled).",
    _DPE,
    "bytes_per_second",
    detail="full",
)
SUPPORTED_SPEED = MetricSpec(
    "fabricscope_infiniband_link_supported_max_lane_speed_bytes_per_second",
    "gauge",
    "Fastest per-lane speed each end supports (LinkSpeedSupported and LinkSpeedExtSupported).",
    _DPE,
    "bytes_per_second",
    detail="full",
)
_DEGRADED_FOLD = "Below full, only links trained below both ends' best (value 1)."
WIDTH_DEGRADED = MetricSpec(
    "fabricscope_infiniband_link_width_degraded",
    "gauge",
    "1 when the link trained narrower than the widest width both ends support, else 0 "
    "(absent when either end's PortInfo is unknown).",
    _DP,
    fold=_DEGRADED_FOLD,
)
SPEED_DEGRADED = MetricSpec(
    "fabricscope_infiniband_link_speed_degraded",
    "gauge",
    "1 when the link trained at a lower lane speed than the fastest both ends support, else "
    "0 (absent when either end's PortInfo is unknown).",
    _DP,
    fold=_DEGRADED_FOLD,
)
PEER_SATURATED = MetricSpec(
    _PEER_PREFIX + "pma_saturated",
    "gauge",
    "1 when a PMA counter of the neighbour port narrower than 64 bits sits at its maximum, "
    "where the hardware stops it (perfquery -R on that port resets it).",
    (*_PEER, "counter"),
    detail="default",
    fold="Below full, only the saturated counters (value 1).",
)
PEER_GENERIC = MetricSpec(
    _PEER_PREFIX + "generic_total",
    "counter",
    "A neighbour port counter with no dedicated fabricscope_infiniband_peer_port_* metric, "
    "named as perfquery prints it, lower-cased: at most 16 per perfquery answer and 256 per "
    "node (fabricscope_infiniband_peer_fields_dropped_total counts the rest).",
    (*_PEER, "counter"),
    detail="full",
)
FIELDS_DROPPED = MetricSpec(
    "fabricscope_infiniband_peer_fields_dropped_total",
    "counter",
    "Fields of no known counter left out of the neighbour's perfquery answers because they "
    "passed the cap of 16 per answer or 256 per node (the tool's output is untrusted: each "
    "field would be a series), summed over passes since the agent started.",
    _DP,
    detail="default",
    fold="Below full, only ports that left a field out (the rest count 0).",
)
SWITCH_LINK_INFO = MetricSpec(
    "fabricscope_infiniband_switch_link_info",
    "gauge",
    "A cable from a leaf switch (the far end of one of the node's cables) to another switch "
    "(a spine in a two-tier fat tree), read by this node: the leaf's port and the port it "
    "lands on; always 1. Each uplink of a leaf is read by one of the hosts under it.",
    (
        "switch_guid",
        "switch_port",
        "switch_description",
        "peer_guid",
        "peer_port",
        "peer_description",
    ),
)

SPINE_LINK_INFO = MetricSpec(
    "fabricscope_infiniband_spine_link_info",
    "gauge",
    "A cable from a spine (the far end of a leaf uplink this node reads) to another switch "
    "(a core switch, or a leaf under the spine), from the spine's port table: the spine's "
    "port and the switch and port it lands on; always 1. Only with --ibpeer.spine-links; "
    "each spine is read by one host under each of its leaves.",
    ("switch_guid", "switch_port", "peer_guid", "peer_port"),
)

#: kernel counter file name -> the perfquery field that carries it
_FIELDS = {name: field for field, name in PERFQUERY_NAMES.items()}


def _switch_help(whose: str, local: MetricSpec, counter: str) -> str:
    """The local counter's description (its help before the local source note) with a
    switch port's source: the PMA fields perfquery reads at the switch's LID."""
    what = local.help.split(" (", 1)[0]
    field = _FIELDS.get(counter, counter)
    if counter in EXT_IETF:
        source = f"{field}, 64 bits, PortCountersExtended only"
    else:
        width = 32 if counter in EXT_DATA else PMA_WIDTHS.get(counter, 32)
        source = (
            f"{field}: {width} bits in PortCounters, 64 in PortCountersExtended where the "
            "switch's PMA advertises it"
        )
    unit = ", converted to bytes" if local.unit == "bytes" else ""
    what = what[0].lower() + what[1:]
    return f"{whose} {what} ({source}{unit})."


def _detail(name: str, minimal: frozenset[str]) -> tuple[Detail, str]:
    """A switch port counter's level and fold: ``minimal`` ones from that level, every other
    error and discard counter from the default level, both only once non-zero; the load
    counters at full."""
    if name in minimal:
        return "minimal", _ERRORS_FOLD
    if name in _LOAD:
        return "full", ""
    return "default", _ERRORS_FOLD


def _peer_spec(name: str, local: MetricSpec) -> MetricSpec:
    detail, fold = _detail(name, _PEER_MINIMAL)
    return MetricSpec(
        _PEER_PREFIX + local.name.removeprefix(_LOCAL_PREFIX),
        local.type,
        _switch_help("The neighbour port's (the other end of the cable)", local, name),
        _PEER,
        local.unit,
        detail=detail,
        fold=fold,
    )


def _switch_spec(name: str, local: MetricSpec) -> MetricSpec:
    detail, fold = _detail(name, _SWITCH_MINIMAL)
    return MetricSpec(
        _SWITCH_PREFIX + local.name.removeprefix(_LOCAL_PREFIX),
        local.type,
        _switch_help("A leaf uplink end's (a switch port this node reads)", local, name),
        _SWITCH,
        local.unit,
        detail=detail,
        fold=_LOAD_FOLD if name in _SWITCH_LOAD else fold,
    )


_LOCAL = pma_specs()
#: kernel counter file name -> the neighbour's metric, built from the local catalog so the
#: two cannot drift apart
_BY_COUNTER: dict[str, MetricSpec] = {
    name: _peer_spec(name, local) for name, local in _LOCAL.items()
}
#: the same for an uplink end's counters
_SWITCH_BY_COUNTER: dict[str, MetricSpec] = {
    name: _switch_spec(name, local)
    for name, local in _LOCAL.items()
    if name in _SWITCH_COUNTERS or name not in _LOAD
}


def _unique(specs: list[MetricSpec]) -> tuple[MetricSpec, ...]:
    return tuple(sorted({s.name: s for s in specs}.values(), key=lambda s: s.name))


SPECS: tuple[MetricSpec, ...] = (
    PEER_INFO,
    PEER_CHANGES,
    ACTIVE_WIDTH,
    ENABLED_WIDTH,
    SUPPORTED_WIDTH,
    ACTIVE_SPEED,
    ENABLED_SPEED,
    SUPPORTED_SPEED,
    WIDTH_DEGRADED,
    SPEED_DEGRADED,
    PEER_SATURATED,
    PEER_GENERIC,
    FIELDS_DROPPED,
    SWITCH_LINK_INFO,
    SPINE_LINK_INFO,
    *_unique(list(_BY_COUNTER.values())),
    *_unique(list(_SWITCH_BY_COUNTER.values())),
)


def _max(values: frozenset[int]) -> int | None:
    return max(values) if values else None


def _link(out: Families, info: PortInfo | None, *labels: str) -> None:
    if info is None:
        return
    out.add(ACTIVE_WIDTH, info.width_active, *labels)
    out.add(ENABLED_WIDTH, _max(info.width_enabled), *labels)
    out.add(SUPPORTED_WIDTH, _max(info.width_supported), *labels)
    out.add(ACTIVE_SPEED, info.speed_active, *labels)
    out.add(ENABLED_SPEED, _max(info.speed_enabled), *labels)
    out.add(SUPPORTED_SPEED, _max(info.speed_supported), *labels)


def _flag(out: Families, spec: MetricSpec, value: bool | None, *labels: str) -> None:
    if value is None or (out.folds and not value):
        return
    out.add(spec, value, *labels)


def _counters(out: Families, counters: tuple[PortCounter, ...], *labels: str) -> None:
    for c in counters:
        spec = _BY_COUNTER.get(c.name)
        if spec is not None:
            if c.raw or not out.folds:
                out.add(spec, c.value, *labels)
        else:
            out.add(PEER_GENERIC, c.value, *labels, c.name)
        if c.width is not None and c.width < 64:
            _flag(out, PEER_SATURATED, c.saturated, *labels, c.name)


def render_port(p: PeerPort, out: Families) -> None:
    dp = (p.device, str(p.port))
    if p.changes_total or not out.folds:
        out.add(PEER_CHANGES, p.changes_total, *dp)
    if p.fields_dropped_total or not out.folds:
        out.add(FIELDS_DROPPED, p.fields_dropped_total, *dp)
    _link(out, p.local, *dp, "local")
    _link(out, p.peer_link, *dp, "peer")
    _flag(out, WIDTH_DEGRADED, p.width_degraded, *dp)
    _flag(out, SPEED_DEGRADED, p.speed_degraded, *dp)
    if p.peer is None:
        return
    peer = (*dp, p.peer.guid, str(p.peer.local_port))
    out.add(
        PEER_INFO,
        1,
        *peer,
        p.peer.node_type,
        "" if p.peer_lid is None else str(p.peer_lid),
        p.peer_description or "",
    )
    _counters(out, p.peer_counters, *peer)


def render_uplink(u: Uplink, out: Families) -> None:
    out.add(
        SWITCH_LINK_INFO,
        1,
        u.switch_guid,
        str(u.switch_port),
        u.switch_description,
        u.peer_guid,
        str(u.peer_port),
        u.peer_description or "",
    )
    for guid, port, counters, leaf_end in (
        (u.switch_guid, u.switch_port, u.counters, True),
        (u.peer_guid, u.peer_port, u.peer_counters, False),
    ):
        for c in counters:
            spec = _SWITCH_BY_COUNTER.get(c.name)
            if spec is None:
                continue
            if out.folds:
                load = c.name in _SWITCH_LOAD
                if (load and not leaf_end) or (not load and not c.raw):
                    continue
            out.add(spec, c.value, guid, str(port))


def render(snap: IbPeerSnapshot, out: Families) -> None:
    for p in snap.ports:
        render_port(p, out)
    for u in snap.uplinks:
        render_uplink(u, out)
    for s in snap.spine_links:
        out.add(
            SPINE_LINK_INFO, 1, s.switch_guid, str(s.switch_port), s.peer_guid, str(s.peer_port)
        )
