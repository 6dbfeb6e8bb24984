"""Metric specs and rendering for the netdev sampler (agent/netdev/sampler.py).

Kernel counters come from ``IFLA_STATS64``; they never include RDMA traffic, which the
mlx5 ``*_vport_rdma_*`` and ``*_phy`` ethtool statistics do (exported through
``fabricscope_netdev_ethtool_statistic_total``). Every ethtool statistic is exported once:
either under a named metric below or under the generic family, never both.
"""

from __future__ import annotations

import re

from agent.netdev.stats import (
    OPERSTATES,
    EthtoolStats,
    LinkStats64,
    NetdevSample,
    NetdevSnapshot,
    PriorityStats,
)
from exporter.metrics.spec import Families, MetricSpec

_PRIORITY_FOLD = (
    "Below full, only priorities whose pause counters the driver exposes (mlx5 does for "
    "PFC-enabled priorities only) or with a non-zero counter."
)
#: error counters no rule, board or check reads: below full, exported once non-zero
_ZERO_FOLD = "Below full, only once non-zero (no rule or board reads a zero)."

#: generic ethtool statistics levels below full keep (``re.fullmatch``)
DEFAULT_DETAIL_STATISTICS: re.Pattern[str] = re.compile(
    r"rx_(?:crc_errors|symbol_err|pcs_symbol_err|corrected_bits|bits)_phy|tx_errors_phy"
    r"|link_down_events_phy|module_(?:unplug|bus_stuck|high_temp|bad_shorted)"
    r"|dev_out_of_buffer|(?:rx|tx)_vport_rdma_unicast_bytes"
)

INFO = MetricSpec(
    "fabricscope_netdev_info",
    "gauge",
    "A constant 1 per sampled network interface, labelled with its bound kernel driver "
    "(empty for virtual interfaces, or when sysfs shows another network namespace), its MTU "
    "in bytes and its negotiated speed in bytes per second (empty while unknown or down).",
    ("netdev", "driver", "mtu", "speed"),
)
OPERSTATE = MetricSpec(
    "fabricscope_netdev_operstate",
    "gauge",
    "1 for the interface's RFC 2863 operational state, 0 for each other state.",
    ("netdev", "operstate"),
    fold="Below full, only the current state (value 1), not a 0 for each other state.",
)
CARRIER = MetricSpec(
    "fabricscope_netdev_carrier",
    "gauge",
    "1 if the interface has carrier (link detected), else 0.",
    ("netdev",),
)
CARRIER_CHANGES = MetricSpec(
    "fabricscope_netdev_carrier_changes_total",
    "counter",
    "Carrier up and down transitions since the interface was created (a flap counts two).",
    ("netdev",),
    detail="default",
)
MTU = MetricSpec(
    "fabricscope_netdev_mtu_bytes",
    "gauge",
    "Interface MTU (below full: the mtu label of fabricscope_netdev_info).",
    ("netdev",),
    unit="bytes",
    detail="full",
)
SPEED = MetricSpec(
    "fabricscope_netdev_speed_bytes_per_second",
    "gauge",
    "Negotiated link speed (sysfs speed, converted from Mb/s); absent while unknown or down "
    "(below full: the speed label of fabricscope_netdev_info).",
    ("netdev",),
    unit="bytes_per_second",
    detail="full",
)
BYTES = MetricSpec(
    "fabricscope_netdev_bytes_total",
    "counter",
    "Bytes received or transmitted by the kernel network stack (RDMA traffic excluded).",
    ("netdev", "direction"),
    unit="bytes",
)
PACKETS = MetricSpec(
    "fabricscope_netdev_packets_total",
    "counter",
    "Packets received or transmitted by the kernel network stack (RDMA traffic excluded).",
    ("netdev", "direction"),
)
ERRORS = MetricSpec(
    "fabricscope_netdev_errors_total",
    "counter",
    "Packets with receive or transmit errors (rx_errors, tx_errors).",
    ("netdev", "direction"),
    fold=_ZERO_FOLD,
)
ERRORS_BY_REASON = MetricSpec(
    "fabricscope_netdev_errors_by_reason_total",
    "counter",
    "Receive and transmit errors by cause, as the kernel breaks them down: rx reasons "
    "length, over, crc, frame, fifo, missed; tx reasons aborted, carrier, fifo, heartbeat, "
    "window.",
    ("netdev", "direction", "reason"),
    detail="full",
)
DROPPED = MetricSpec(
    "fabricscope_netdev_dropped_packets_total",
    "counter",
    "Packets dropped by the interface or stack without an error (rx_dropped, tx_dropped).",
    ("netdev", "direction"),
)
MULTICAST = MetricSpec(
    "fabricscope_netdev_multicast_packets_total",
    "counter",
    "Multicast packets received.",
    ("netdev",),
    detail="full",
)
PFC_PAUSE_FRAMES = MetricSpec(
    "fabricscope_netdev_pfc_pause_frames_total",
    "counter",
    "Priority flow control pause frames received (rx: the network throttles this NIC) or "
    "sent (tx: this NIC cannot absorb traffic), per priority (queue) (mlx5 "
    "rx/tx_prio<p>_pause).",
    ("netdev", "direction", "queue"),
    fold=_PRIORITY_FOLD,
)
PFC_PAUSE_DURATION = MetricSpec(
    "fabricscope_netdev_pfc_pause_duration_seconds_total",
    "counter",
    "Time paused by priority flow control, per priority (queue) (mlx5 "
    "rx/tx_prio<p>_pause_duration, converted from microseconds).",
    ("netdev", "direction", "queue"),
    unit="seconds",
    fold=_PRIORITY_FOLD,
)
PAUSE_FRAMES = MetricSpec(
    "fabricscope_netdev_pause_frames_total",
    "counter",
    "Link-level (802.3x) pause frames received or sent on the physical port (mlx5 "
    "rx/tx_pause_ctrl_phy).",
    ("netdev", "direction"),
    detail="default",
)
PAUSE_STORM_WARNINGS = MetricSpec(
    "fabricscope_netdev_pause_storm_warning_events_total",
    "counter",
    "Times the NIC kept sending pause frames past the warning watermark (mlx5 "
    "tx_pause_storm_warning_events).",
    ("netdev",),
    detail="default",
    fold=_ZERO_FOLD,
)
PAUSE_STORM_ERRORS = MetricSpec(
    "fabricscope_netdev_pause_storm_error_events_total",
    "counter",
    "Times pause storm prevention stopped the NIC sending pause frames after a timeout; "
    "drops may follow (mlx5 tx_pause_storm_error_events).",
    ("netdev",),
)
PHY_DISCARDS = MetricSpec(
    "fabricscope_netdev_phy_discarded_packets_total",
    "counter",
    "Packets the physical port discarded: rx for lack of receive buffers (the adapter is "
    "congested), tx despite no error (link down, head-of-line drop, pause) (mlx5 "
    "rx/tx_discards_phy).",
    ("netdev", "direction"),
)
OUT_OF_BUFFER = MetricSpec(
    "fabricscope_netdev_out_of_buffer_drops_total",
    "counter",
    "Received packets dropped because a receive queue had no software buffer posted (mlx5 "
    "rx_out_of_buffer).",
    ("netdev",),
)
PRIORITY_DISCARDS = MetricSpec(
    "fabricscope_netdev_priority_discarded_packets_total",
    "counter",
    "Received packets the device discarded, per priority (queue) and reason: no_buffer "
    "(rx_prio<p>_discards), host_buffer (rx_prio<p>_buf_discard), host_congestion "
    "(rx_prio<p>_cong_discard).",
    ("netdev", "queue", "reason"),
    fold=_PRIORITY_FOLD[:-1] + "; of those, only counters once non-zero.",
)
ECN_MARKED = MetricSpec(
    "fabricscope_netdev_ecn_marked_packets_total",
    "counter",
    "Received packets the device ECN-marked for host congestion, per priority (queue) (mlx5 "
    "rx_prio<p>_marked).",
    ("netdev", "queue"),
    fold=_PRIORITY_FOLD[:-1] + "; of those, only counters once non-zero.",
)
PCIE_STALLED_READS = MetricSpec(
    "fabricscope_netdev_pcie_stalled_reads_ratio",
    "gauge",
    "Share of the last second the NIC had outbound PCIe reads waiting for credits (mlx5 "
    "outbound_pci_stalled_rd, converted from percent).",
    ("netdev",),
    unit="ratio",
    detail="default",
)
PCIE_STALLED_WRITES = MetricSpec(
    "fabricscope_netdev_pcie_stalled_writes_ratio",
    "gauge",
    "Share of the last second the NIC had outbound PCIe writes waiting for credits (mlx5 "
    "outbound_pci_stalled_wr, converted from percent).",
    ("netdev",),
    unit="ratio",
    detail="default",
)
ETHTOOL_COUNTER = MetricSpec(
    "fabricscope_netdev_ethtool_statistic_total",
    "counter",
    "Included ethtool statistics without a named metric, by the driver's name (units as the "
    "driver counts them: *_bits_phy in bits, *_duration in microseconds).",
    ("netdev", "statistic"),
    detail="default",
    fold="Below full, only the PHY error and BER inputs, link-down and transceiver events, "
    "device out-of-buffer drops and RoCE unicast bytes (DEFAULT_DETAIL_STATISTICS in "
    "exporter/metrics/netdev.py), each once non-zero; the rest of --netdev.ethtool-include "
    "at full.",
)
ETHTOOL_GAUGE = MetricSpec(
    "fabricscope_netdev_ethtool_statistic",
    "gauge",
    "Included ethtool statistics known to be instantaneous values rather than counters "
    "(peer_ifindex), by the driver's name.",
    ("netdev", "statistic"),
    detail="full",
)

SPECS: tuple[MetricSpec, ...] = (
    INFO,
    OPERSTATE,
    CARRIER,
    CARRIER_CHANGES,
    MTU,
    SPEED,
    BYTES,
    PACKETS,
    ERRORS,
    ERRORS_BY_REASON,
    DROPPED,
    MULTICAST,
    PFC_PAUSE_FRAMES,
    PFC_PAUSE_DURATION,
    PAUSE_FRAMES,
    PAUSE_STORM_WARNINGS,
    PAUSE_STORM_ERRORS,
    PHY_DISCARDS,
    OUT_OF_BUFFER,
    PRIORITY_DISCARDS,
    ECN_MARKED,
    PCIE_STALLED_READS,
    PCIE_STALLED_WRITES,
    ETHTOOL_COUNTER,
    ETHTOOL_GAUGE,
)


def render(snap: NetdevSnapshot, out: Families) -> None:
    for nd in snap.netdevs:
        _render_link(nd, out)
        if nd.stats is not None:
            _render_stats(nd.name, nd.stats, out)
        if nd.ethtool is not None:
            _render_ethtool(nd.name, nd.ethtool, out)


def _render_link(nd: NetdevSample, out: Families) -> None:
    n = nd.name
    mtu, speed = nd.mtu_bytes, nd.speed_bytes_per_second
    out.add(INFO, 1, n, nd.driver or "", _label(mtu), _label(speed))
    if nd.operstate is not None:
        for state in OPERSTATES:
            if state == nd.operstate or not out.folds:
                out.add(OPERSTATE, state == nd.operstate, n, state)
    out.add(CARRIER, nd.carrier, n)
    out.add(CARRIER_CHANGES, nd.carrier_changes, n)
    out.add(MTU, nd.mtu_bytes, n)
    out.add(SPEED, nd.speed_bytes_per_second, n)


def _label(value: int | None) -> str:
    return "" if value is None else str(value)


def _nonzero(value: int | float | None, out: Families) -> int | float | None:
    """``value``, or None (absent) below full when it is 0."""
    return None if out.folds and not value else value


def _render_stats(n: str, s: LinkStats64, out: Families) -> None:
    out.add(BYTES, s.rx_bytes, n, "rx")
    out.add(BYTES, s.tx_bytes, n, "tx")
    out.add(PACKETS, s.rx_packets, n, "rx")
    out.add(PACKETS, s.tx_packets, n, "tx")
    out.add(ERRORS, _nonzero(s.rx_errors, out), n, "rx")
    out.add(ERRORS, _nonzero(s.tx_errors, out), n, "tx")
    out.add(DROPPED, s.rx_dropped, n, "rx")
    out.add(DROPPED, s.tx_dropped, n, "tx")
    out.add(MULTICAST, s.multicast, n)
    for direction, reason, value in (
        ("rx", "length", s.rx_length_errors),
        ("rx", "over", s.rx_over_errors),
        ("rx", "crc", s.rx_crc_errors),
        ("rx", "frame", s.rx_frame_errors),
        ("rx", "fifo", s.rx_fifo_errors),
        ("rx", "missed", s.rx_missed_errors),
        ("tx", "aborted", s.tx_aborted_errors),
        ("tx", "carrier", s.tx_carrier_errors),
        ("tx", "fifo", s.tx_fifo_errors),
        ("tx", "heartbeat", s.tx_heartbeat_errors),
        ("tx", "window", s.tx_window_errors),
    ):
        out.add(ERRORS_BY_REASON, value, n, direction, reason)


def _priority_shown(p: PriorityStats) -> bool:
    """Whether levels below full export a priority: the driver exposes its pause counters
    (PFC is enabled there) or one of its counters is non-zero."""
    if p.rx_pause_frames is not None or p.tx_pause_frames is not None:
        return True
    return any(
        v
        for v in (
            p.rx_pause_duration_seconds,
            p.tx_pause_duration_seconds,
            p.rx_discarded_no_buffer,
            p.rx_discarded_host_buffer,
            p.rx_discarded_host_congestion,
            p.rx_ecn_marked,
        )
    )


def _render_ethtool(n: str, e: EthtoolStats, out: Families) -> None:
    folds = out.folds
    for p in e.priorities:
        if folds and not _priority_shown(p):
            continue
        q = str(p.priority)
        out.add(PFC_PAUSE_FRAMES, p.rx_pause_frames, n, "rx", q)
        out.add(PFC_PAUSE_FRAMES, p.tx_pause_frames, n, "tx", q)
        out.add(PFC_PAUSE_DURATION, p.rx_pause_duration_seconds, n, "rx", q)
        out.add(PFC_PAUSE_DURATION, p.tx_pause_duration_seconds, n, "tx", q)
        out.add(PRIORITY_DISCARDS, _nonzero(p.rx_discarded_no_buffer, out), n, q, "no_buffer")
        out.add(PRIORITY_DISCARDS, _nonzero(p.rx_discarded_host_buffer, out), n, q, "host_buffer")
        congestion = _nonzero(p.rx_discarded_host_congestion, out)
        out.add(PRIORITY_DISCARDS, congestion, n, q, "host_congestion")
        out.add(ECN_MARKED, _nonzero(p.rx_ecn_marked, out), n, q)
    out.add(PAUSE_FRAMES, e.rx_pause_frames, n, "rx")
    out.add(PAUSE_FRAMES, e.tx_pause_frames, n, "tx")
    out.add(PAUSE_STORM_WARNINGS, _nonzero(e.pause_storm_warning_events, out), n)
    out.add(PAUSE_STORM_ERRORS, e.pause_storm_error_events, n)
    out.add(PHY_DISCARDS, e.rx_discards_phy, n, "rx")
    out.add(PHY_DISCARDS, e.tx_discards_phy, n, "tx")
    out.add(OUT_OF_BUFFER, e.rx_out_of_buffer, n)
    out.add(PCIE_STALLED_READS, e.pcie_stalled_reads_ratio, n)
    out.add(PCIE_STALLED_WRITES, e.pcie_stalled_writes_ratio, n)
    for stat in e.counters:
        if not folds or (stat.value and DEFAULT_DETAIL_STATISTICS.fullmatch(stat.name)):
            out.add(ETHTOOL_COUNTER, stat.value, n, stat.name)
    for stat in e.gauges:
        out.add(ETHTOOL_GAUGE, stat.value, n, stat.name)
