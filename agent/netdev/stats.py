"""The netdev data model and its pure parsers: what one interface's link state, 64-bit
kernel counters and ethtool statistics become (frozen records), parsed from netlink
messages, sysfs text and ethtool name/value pairs. Reading them from the host is
:mod:`agent.netdev.sampler`'s job."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agent.core.sysfs import ReadIssue

#: RFC 2863 operational states, as ``ip link`` and ``/sys/class/net/*/operstate`` spell them.
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")

#: ethtool statistics exported by default (``re.fullmatch`` against the driver's name).
#:
#: Chosen from the mlx5 counter reference (kernel
#: ``Documentation/networking/device_drivers/ethernet/mellanox/mlx5/counters.rst``) for
#: what a RoCE / IPoIB fabric SRE acts on, while keeping cardinality bounded (at most 128
#: statistics per port; per-priority pause counters exist only for PFC-enabled
#: priorities). Left out on purpose: per-ring ``rx<i>_*``/``tx<i>_*``/``ch<i>_*`` (grow with
#: the channel count), checksum/offload/XDP/TLS acceleration counters, per-size histograms,
#: per-priority byte/packet counters. Pass a wider pattern to get more.
DEFAULT_ETHTOOL_INCLUDE: re.Pattern[str] = re.compile(
    r"""
      (?:rx|tx)_prio[0-9]+_pause(?:_duration)?          # PFC pause frames / time, per priority
    | rx_prio[0-9]+_pause_transition                     # PFC XOFF->XON transitions
    | rx_prio[0-9]+_(?:discards|buf_discard|cong_discard|marked)  # per-priority drops, ECN
    | (?:rx|tx)_pause_ctrl_phy                           # link-level (802.3x) pause frames
    | (?:rx|tx)_global_pause(?:_duration)? | rx_global_pause_transition
    | tx_pause_storm_(?:warning|error)_events            # PFC storm prevention
    | (?:rx|tx)_discards_phy | rx_out_of_buffer | dev_out_of_buffer | dev_internal_queue_oob
    | rx_(?:crc_errors|symbol_err|pcs_symbol_err|corrected_bits|bits)_phy   # BER inputs
    | rx_err_lane_[0-9]+_phy
    | rx_(?:in_range_len_errors|out_of_range_len|oversize_pkts|undersize_pkts|fragments
         |jabbers|unsupported_op)_phy
    | tx_errors_phy | link_down_events_phy | rx_buffer_passed_thres_phy
    | module_(?:unplug|bus_stuck|high_temp|bad_shorted)  # transceiver events (no temperature)
    | (?:rx|tx)_pci_signal_integrity
    | outbound_pci_(?:buffer_overflow|stalled_(?:rd|wr)(?:_events)?)
    | (?:rx|tx)_(?:bytes|packets)_phy                    # wire totals, RDMA traffic included
    | (?:rx|tx)_vport_rdma_(?:unicast|multicast)_(?:bytes|packets)  # RoCE traffic, which
    """,  # the kernel's own netdev counters never see: RDMA bypasses the kernel
    re.VERBOSE,
)

#: Included ethtool statistics that are instantaneous values, not counters. Everything else
#: a driver reports through ``ETHTOOL_GSTATS`` is a counter in practice. (mlx5's
#: ``outbound_pci_stalled_rd``/``_wr`` are gauges too, carried as named ratios below.)
ETHTOOL_GAUGES = frozenset({"peer_ifindex"})

_PRIO_STAT = re.compile(
    r"(rx|tx)_prio([0-9]+)_(pause|pause_duration|discards|buf_discard|cong_discard|marked)"
)


# -- samples -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LinkStats64:
    """``struct rtnl_link_stats64`` (``IFLA_STATS64``), as the kernel counts it.

    ``multicast`` counts received packets; the ``rx_*_errors`` / ``tx_*_errors`` fields break
    ``rx_errors`` / ``tx_errors`` down by cause. RDMA traffic is never in these counters.
    """

    rx_packets: int | None = None
    tx_packets: int | None = None
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rx_errors: int | None = None
    tx_errors: int | None = None
    rx_dropped: int | None = None
    tx_dropped: int | None = None
    multicast: int | None = None
    collisions: int | None = None
    rx_length_errors: int | None = None
    rx_over_errors: int | None = None
    rx_crc_errors: int | None = None
    rx_frame_errors: int | None = None
    rx_fifo_errors: int | None = None
    rx_missed_errors: int | None = None
    tx_aborted_errors: int | None = None
    tx_carrier_errors: int | None = None
    tx_fifo_errors: int | None = None
    tx_heartbeat_errors: int | None = None
    tx_window_errors: int | None = None
    rx_compressed: int | None = None
    tx_compressed: int | None = None


@dataclass(frozen=True, slots=True)
class PriorityStats:
    """mlx5 per-priority (IEEE 802.1p, 0-7) port counters of one netdev.

    Durations are converted from the driver's microseconds to seconds.
    """

    priority: int
    rx_pause_frames: int | None = None  # rx_prio<p>_pause
    tx_pause_frames: int | None = None  # tx_prio<p>_pause
    rx_pause_duration_seconds: float | None = None  # rx_prio<p>_pause_duration
    tx_pause_duration_seconds: float | None = None  # tx_prio<p>_pause_duration
    rx_discarded_no_buffer: int | None = None  # rx_prio<p>_discards
    rx_discarded_host_buffer: int | None = None  # rx_prio<p>_buf_discard
    rx_discarded_host_congestion: int | None = None  # rx_prio<p>_cong_discard
    rx_ecn_marked: int | None = None  # rx_prio<p>_marked


@dataclass(frozen=True, slots=True)
class EthtoolStat:
    """One included ethtool statistic without a named field, by the driver's name."""

    name: str
    value: int


@dataclass(frozen=True, slots=True)
class EthtoolStats:
    """The included ethtool statistics of one netdev.

    Well-known mlx5 statistics land in named fields (and nowhere else); every other included
    statistic is in ``counters``, or in ``gauges`` when it is listed in
    :data:`ETHTOOL_GAUGES`. If a driver reports a name twice, the first value is kept.
    """

    priorities: tuple[PriorityStats, ...] = ()
    rx_pause_frames: int | None = None  # rx_pause_ctrl_phy
    tx_pause_frames: int | None = None  # tx_pause_ctrl_phy
    pause_storm_warning_events: int | None = None  # tx_pause_storm_warning_events
    pause_storm_error_events: int | None = None  # tx_pause_storm_error_events
    rx_discards_phy: int | None = None
    tx_discards_phy: int | None = None
    rx_out_of_buffer: int | None = None
    #: share (0-1) of the last second with outbound PCIe reads / writes stalled for credits
    pcie_stalled_reads_ratio: float | None = None  # outbound_pci_stalled_rd (percent)
    pcie_stalled_writes_ratio: float | None = None  # outbound_pci_stalled_wr (percent)
    counters: tuple[EthtoolStat, ...] = ()
    gauges: tuple[EthtoolStat, ...] = ()


@dataclass(frozen=True, slots=True, order=True)
class RdmaPort:
    """An RDMA device port a netdev belongs to."""

    device: str
    port: int


@dataclass(frozen=True, slots=True)
class NetlinkLink:
    """What one ``RTM_NEWLINK`` message says about a link."""

    ifindex: int
    name: str
    operstate: str | None = None
    carrier: int | None = None  # 1 = carrier up, 0 = no carrier
    carrier_changes: int | None = None
    mtu_bytes: int | None = None
    stats: LinkStats64 | None = None


@dataclass(frozen=True, slots=True)
class NetdevSample:
    """One interface after one pass."""

    name: str
    ifindex: int
    operstate: str | None = None  # one of OPERSTATES
    carrier: int | None = None
    carrier_changes: int | None = None
    mtu_bytes: int | None = None
    speed_bytes_per_second: int | None = None
    driver: str | None = None
    stats: LinkStats64 | None = None
    ethtool: EthtoolStats | None = None  # None: not read (turned off, refused, failed)
    rdma: tuple[RdmaPort, ...] = ()


@dataclass(frozen=True, slots=True)
class NetdevSnapshot:
    netdevs: tuple[NetdevSample, ...] = ()
    #: RDMA-associated netdev names not present in the sampled network namespace
    missing: tuple[str, ...] = ()
    issues: tuple[ReadIssue, ...] = ()


# -- pure parsing --------------------------------------------------------------------------


def parse_speed(text: str) -> int | None:
    """``class/net/<if>/speed`` (Mb/s) -> bytes/s; ``None`` for the kernel's "unknown"
    (``-1``, ``0``, or ``-1`` printed unsigned)."""
    mbps = int(text.strip())
    if mbps <= 0 or mbps == 0xFFFFFFFF:
        return None
    return mbps * 1_000_000 // 8


def parse_operstate(value: str) -> str:
    """Netlink / sysfs operstate (``UP``, ``LOWERLAYERDOWN`` ...) -> ``OPERSTATES`` spelling."""
    state = value.strip().lower()
    if state not in OPERSTATES:
        raise ValueError(f"unknown operstate {value!r}")
    return state


def parse_ndev(text: str) -> str:
    """Contents of a ``gid_attrs/ndevs/<n>`` file -> the netdev name."""
    name = text.strip()
    if not name or "/" in name or len(name) > 15:
        raise ValueError(f"not a netdev name: {text!r}")
    return name


def to_stats64(fields: Mapping[str, int]) -> LinkStats64:
    """The decoded ``IFLA_STATS64`` attribute -> :class:`LinkStats64` (absent keys -> None)."""

    def get(key: str) -> int | None:
        value = fields.get(key)
        return int(value) if value is not None else None

    return LinkStats64(
        rx_packets=get("rx_packets"),
        tx_packets=get("tx_packets"),
        rx_bytes=get("rx_bytes"),
        tx_bytes=get("tx_bytes"),
        rx_errors=get("rx_errors"),
        tx_errors=get("tx_errors"),
        rx_dropped=get("rx_dropped"),
        tx_dropped=get("tx_dropped"),
        multicast=get("multicast"),
        collisions=get("collisions"),
        rx_length_errors=get("rx_length_errors"),
        rx_over_errors=get("rx_over_errors"),
        rx_crc_errors=get("rx_crc_errors"),
        rx_frame_errors=get("rx_frame_errors"),
        rx_fifo_errors=get("rx_fifo_errors"),
        rx_missed_errors=get("rx_missed_errors"),
        tx_aborted_errors=get("tx_aborted_errors"),
        tx_carrier_errors=get("tx_carrier_errors"),
        tx_fifo_errors=get("tx_fifo_errors"),
        tx_heartbeat_errors=get("tx_heartbeat_errors"),
        tx_window_errors=get("tx_window_errors"),
        rx_compressed=get("rx_compressed"),
        tx_compressed=get("tx_compressed"),
    )


def _priority_stats(priority: int, values: Mapping[str, int]) -> PriorityStats:
    def us_to_s(v: int | None) -> float | None:
        return v / 1_000_000 if v is not None else None

    return PriorityStats(
        priority=priority,
        rx_pause_frames=values.get("rx_pause"),
        tx_pause_frames=values.get("tx_pause"),
        rx_pause_duration_seconds=us_to_s(values.get("rx_pause_duration")),
        tx_pause_duration_seconds=us_to_s(values.get("tx_pause_duration")),
        rx_discarded_no_buffer=values.get("rx_discards"),
        rx_discarded_host_buffer=values.get("rx_buf_discard"),
        rx_discarded_host_congestion=values.get("rx_cong_discard"),
        rx_ecn_marked=values.get("rx_marked"),
    )


_NAMED_SCALARS = frozenset(
    {
        "rx_pause_ctrl_phy",
        "tx_pause_ctrl_phy",
        "tx_pause_storm_warning_events",
        "tx_pause_storm_error_events",
        "rx_discards_phy",
        "tx_discards_phy",
        "rx_out_of_buffer",
        "outbound_pci_stalled_rd",
        "outbound_pci_stalled_wr",
    }
)
_RX_ONLY_PRIO_KINDS = frozenset({"discards", "buf_discard", "cong_discard", "marked"})


def parse_ethtool_stats(pairs: Iterable[tuple[str, int]], include: re.Pattern[str]) -> EthtoolStats:
    """ethtool ``(name, value)`` pairs -> :class:`EthtoolStats`, keeping only the names that
    ``include`` fully matches."""
    scalars: dict[str, int] = {}
    prios: dict[int, dict[str, int]] = {}
    counters: dict[str, int] = {}
    gauges: dict[str, int] = {}
    seen: set[str] = set()
    for name, value in pairs:
        if name in seen or not include.fullmatch(name):
            continue
        seen.add(name)
        if name in _NAMED_SCALARS:
            scalars[name] = value
            continue
        m = _PRIO_STAT.fullmatch(name)
        if m is not None and not (m[1] == "tx" and m[3] in _RX_ONLY_PRIO_KINDS):
            prios.setdefault(int(m[2]), {})[f"{m[1]}_{m[3]}"] = value
        elif name in ETHTOOL_GAUGES:
            gauges[name] = value
        else:
            counters[name] = value

    def percent(key: str) -> float | None:
        v = scalars.get(key)
        return v / 100 if v is not None else None

    return EthtoolStats(
        priorities=tuple(_priority_stats(p, prios[p]) for p in sorted(prios)),
        rx_pause_frames=scalars.get("rx_pause_ctrl_phy"),
        tx_pause_frames=scalars.get("tx_pause_ctrl_phy"),
        pause_storm_warning_events=scalars.get("tx_pause_storm_warning_events"),
        pause_storm_error_events=scalars.get("tx_pause_storm_error_events"),
        rx_discards_phy=scalars.get("rx_discards_phy"),
        tx_discards_phy=scalars.get("tx_discards_phy"),
        rx_out_of_buffer=scalars.get("rx_out_of_buffer"),
        pcie_stalled_reads_ratio=percent("outbound_pci_stalled_rd"),
        pcie_stalled_writes_ratio=percent("outbound_pci_stalled_wr"),
        counters=tuple(EthtoolStat(n, v) for n, v in sorted(counters.items())),
        gauges=tuple(EthtoolStat(n, v) for n, v in sorted(gauges.items())),
    )


class LinkMessage(Protocol):
    """What the sampler reads of a link: :func:`agent.netdev.linkmsg.answers`' dict (or the
    scenario lab's, or pyroute2's ``ifinfmsg``, which answer the same two calls)."""

    def get(self, key: str) -> object: ...

    def __getitem__(self, key: str) -> object: ...


def _opt_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def to_link(msg: LinkMessage) -> NetlinkLink:
    """One netlink link message -> :class:`NetlinkLink`. Raises ValueError if malformed."""
    ifindex = msg["index"]
    name = msg.get("IFLA_IFNAME")
    if not isinstance(ifindex, int) or not isinstance(name, str):
        raise ValueError(f"link message without index/name: {ifindex!r} {name!r}")
    operstate = msg.get("IFLA_OPERSTATE")
    raw_stats = msg.get("IFLA_STATS64")  # pyroute2 decodes the nla as a dict subclass
    stats = None
    if isinstance(raw_stats, dict):
        stats = to_stats64({str(k): v for k, v in raw_stats.items() if isinstance(v, int)})
    elif raw_stats is not None:
        raise ValueError(f"undecodable IFLA_STATS64: {raw_stats!r}")
    return NetlinkLink(
        ifindex=ifindex,
        name=name,
        operstate=parse_operstate(operstate) if isinstance(operstate, str) else None,
        carrier=_opt_int(msg.get("IFLA_CARRIER")),
        carrier_changes=_opt_int(msg.get("IFLA_CARRIER_CHANGES")),
        mtu_bytes=_opt_int(msg.get("IFLA_MTU")),
        stats=stats,
    )
