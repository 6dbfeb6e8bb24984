"""Metric specs and rendering for the ``ibpeer`` sampler: both ends of each InfiniBand cable.

The neighbour's PMA counters carry the local counters' names with ``port`` turned into
``peer_port`` (``fabricscope_infiniband_port_symbol_errors_total`` ->
``fabricscope_infiniband_peer_port_symbol_errors_total``), the same units (data in bytes)
and help, and join the local series on ``device``/``port``; ``peer_guid``/``peer_port``
name the far end, whose description and type live in ``fabricscope_infiniband_peer_info``.
Link width and speed come from both ends' PortInfo, one series per ``end``.
"""

from __future__ import annotations

from agent.ibpeer.parse import PortInfo
from agent.ibpeer.sampler import IbPeerSnapshot, PeerPort
from agent.infiniband.perfquery import EXT_DATA, EXT_IETF, PERFQUERY_NAMES
from agent.infiniband.records import PortCounter
from agent.infiniband.sampler import PMA_WIDTHS
from exporter.metrics import infiniband
from exporter.metrics.spec import Families, MetricSpec

_DP = ("device", "port")
_DPE = ("device", "port", "end")
_PEER = ("device", "port", "peer_guid", "peer_port")
_LOCAL_PREFIX = "fabricscope_infiniband_port_"
_PEER_PREFIX = "fabricscope_infiniband_peer_port_"

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
    "passes since the agent started: a moved cable or a replaced neighbour.",
    _DP,
)
ACTIVE_WIDTH = MetricSpec(
    "fabricscope_infiniband_link_active_width",
    "gauge",
    "Lanes the link trained at (PortInfo LinkWidthActive: 1, 2, 4, 8 or 12), as each end "
    "reports it (end: local or peer).",
    _DPE,
)
ENABLED_WIDTH = MetricSpec(
    "fabricscope_infiniband_link_enabled_width_max",
    "gauge",
    "Widest width enabled on each end (PortInfo LinkWidthEnabled), in lanes.",
    _DPE,
)
SUPPORTED_WIDTH = MetricSpec(
    "fabricscope_infiniband_link_supported_width_max",
    "gauge",
    "Widest width each end supports (PortInfo LinkWidthSupported), in lanes.",
    _DPE,
)
ACTIVE_SPEED = MetricSpec(
    "fabricscope_infiniband_link_active_lane_speed_bytes_per_second",
    "gauge",
    "Per-lane signalling rate the link trained at (PortInfo LinkSpeedExtActive when set, "
    "else LinkSpeedActive; Gb/s converted to bytes per second), as each end reports it.",
    _DPE,
    "bytes_per_second",
)
ENABLED_SPEED = MetricSpec(
    "fabricscope_infiniband_link_enabled_max_lane_speed_bytes_per_second",
    "gauge",
    "Fastest per-lane speed enabled on each end (LinkSpeedEnabled and LinkSpeedExtEnabled).",
    _DPE,
    "bytes_per_second",
)
SUPPORTED_SPEED = MetricSpec(
    "fabricscope_infiniband_link_supported_max_lane_speed_bytes_per_second",
    "gauge",
    "Fastest per-lane speed each end supports (LinkSpeedSupported and LinkSpeedExtSupported).",
    _DPE,
    "bytes_per_second",
)
WIDTH_DEGRADED = MetricSpec(
    "fabricscope_infiniband_link_width_degraded",
    "gauge",
    "1 when the link trained narrower than the widest width both ends support, else 0 "
    "(absent when either end's PortInfo is unknown).",
    _DP,
)
SPEED_DEGRADED = MetricSpec(
    "fabricscope_infiniband_link_speed_degraded",
    "gauge",
    "1 when the link trained at a lower lane speed than the fastest both ends support, else "
    "0 (absent when either end's PortInfo is unknown).",
    _DP,
)
PEER_SATURATED = MetricSpec(
    _PEER_PREFIX + "pma_saturated",
    "gauge",
    "1 when a PMA counter of the neighbour port narrower than 64 bits sits at its maximum, "
    "where the hardware stops it (perfquery -R on that port resets it).",
    (*_PEER, "counter"),
)
PEER_GENERIC = MetricSpec(
    _PEER_PREFIX + "generic_total",
    "counter",
    "A neighbour port counter with no dedicated fabricscope_infiniband_peer_port_* metric, "
    "named as perfquery prints it, lower-cased: at most 16 per perfquery answer and 256 per "
    "node (fabricscope_infiniband_peer_fields_dropped_total counts the rest).",
    (*_PEER, "counter"),
)
FIELDS_DROPPED = MetricSpec(
    "fabricscope_infiniband_peer_fields_dropped_total",
    "counter",
    "Fields of no known counter left out of the neighbour's perfquery answers because they "
    "passed the cap of 16 per answer or 256 per node (the tool's output is untrusted: each "
    "field would be a series), summed over passes since the agent started.",
    _DP,
)


#: kernel counter file name -> the perfquery field that carries it
_FIELDS = {name: field for field, name in PERFQUERY_NAMES.items()}


def _peer_help(local: MetricSpec, counter: str) -> str:
    """The local counter's description (its help before the local source note) with the
    neighbour's source: the PMA fields perfquery reads at the neighbour's LID."""
    what = local.help.split(" (", 1)[0]
    field = _FIELDS.get(counter, counter)
    if counter in EXT_IETF:
        source = f"{field}, 64 bits, PortCountersExtended only"
    else:
        width = 32 if counter in EXT_DATA else PMA_WIDTHS.get(counter, 32)
        source = (
            f"{field}: {width} bits in PortCounters, 64 in PortCountersExtended where the "
            "neighbour's PMA advertises it"
        )
    unit = ", converted to bytes" if local.unit == "bytes" else ""
    what = what[0].lower() + what[1:]
    return f"The neighbour port's (the other end of the cable) {what} ({source}{unit})."


def _peer_spec(local: MetricSpec, counter: str) -> MetricSpec:
    return MetricSpec(
        _PEER_PREFIX + local.name.removeprefix(_LOCAL_PREFIX),
        local.type,
        _peer_help(local, counter),
        _PEER,
        local.unit,
    )


#: kernel counter file name -> the neighbour's metric, built from the local catalog so the
#: two cannot drift apart
_BY_COUNTER: dict[str, MetricSpec] = {
    name: _peer_spec(local, name) for name, local in infiniband.pma_specs().items()
}
_PEER_COUNTER_SPECS = tuple(
    sorted({s.name: s for s in _BY_COUNTER.values()}.values(), key=lambda s: s.name)
)

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
    *_PEER_COUNTER_SPECS,
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


def _counters(out: Families, counters: tuple[PortCounter, ...], *labels: str) -> None:
    for c in counters:
        spec = _BY_COUNTER.get(c.name)
        if spec is not None:
            out.add(spec, c.value, *labels)
        else:
            out.add(PEER_GENERIC, c.value, *labels, c.name)
        if c.width is not None and c.width < 64:
            out.add(PEER_SATURATED, c.saturated, *labels, c.name)


def render_port(p: PeerPort, out: Families) -> None:
    dp = (p.device, str(p.port))
    out.add(PEER_CHANGES, p.changes_total, *dp)
    out.add(FIELDS_DROPPED, p.fields_dropped_total, *dp)
    _link(out, p.local, *dp, "local")
    _link(out, p.peer_link, *dp, "peer")
    out.add(WIDTH_DEGRADED, p.width_degraded, *dp)
    out.add(SPEED_DEGRADED, p.speed_degraded, *dp)
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


def render(snap: IbPeerSnapshot, out: Families) -> None:
    for p in snap.ports:
        render_port(p, out)
