"""The netdev sampler: link state, kernel interface counters and driver (ethtool) statistics
of the network interfaces that carry RDMA traffic, plus any the user names.

Which interfaces
    Every netdev associated with an RDMA device in sysfs -- the contents of
    ``class/infiniband/*/ports/*/gid_attrs/ndevs/*`` (RoCE: the netdevs behind the GID table,
    VLAN and bond devices included) and the entries of ``class/infiniband/*/device/net/``
    (the PCI function's own netdevs: RoCE PFs, IPoIB ``ib0``) -- plus every interface whose
    name *fully* matches ``include``. Names are read through the :class:`SysfsReader`, so
    fixture trees and snapshots stand in for the host. An RDMA-associated name that the
    netlink namespace does not hold (an SR-IOV VF moved into a pod, a fixture describing
    another host) is listed in :attr:`NetdevSnapshot.missing`; it is not an error.

Sources, per interface
    * netlink (``RTM_GETLINK``): operstate, carrier, carrier changes, MTU and the 64-bit
      kernel counters (``IFLA_STATS64``). With ``include`` unset the sampler asks for each
      name; with it set it dumps every link once (≈85 ms for 300 links here) and filters.
    * sysfs ``class/net/<if>/speed`` (Mb/s, converted to bytes/s) and the bound driver.
      Read only when ``class/net/<if>/ifindex`` equals the netlink ifindex: a sysfs mounted
      in another network namespace shows other devices under the same names.
    * ethtool ``ETHTOOL_GSTATS`` through ``pyroute2.ethtool.ioctl.IoctlEthtool``, filtered by
      ``ethtool_include`` (:data:`DEFAULT_ETHTOOL_INCLUDE`; ``None`` turns ethtool off).

Network namespaces
    ``netns=None`` (production: the agent runs with hostNetwork) reads the agent's own
    namespace. With a name, netlink goes through ``IPRoute(netns=name, flags=0)`` (pyroute2
    creates that socket in a child process; ``flags=0`` never creates a namespace). An
    ethtool ioctl acts on the namespace of the *socket* it is issued on, so the sampler
    creates that one socket in a short-lived thread that first calls ``setns(2)``
    (``pyroute2.netns.setns``; Python 3.11 has no ``os.setns``). ``setns`` moves only the
    calling thread, which then ends; the agent's other threads never change namespace.
    ``pushns``/``popns`` are not used: they keep a process-global stack and move the thread
    that calls them.

Errors
    An interface that vanishes mid-pass (ethtool answers ``ENODEV``) is left out of the
    snapshot with a ``vanished`` issue; ethtool refusing (``EOPNOTSUPP``: ``lo`` and other
    drivers without statistics, ``EPERM``) or a netlink error on one name costs that
    interface's ethtool or link series and records an issue, path
    ``netlink/ethtool/<ifname>`` or ``netlink/link/<ifname>``. A namespace that cannot be
    opened at all raises (the runner records it).
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from pyroute2 import IPRoute
from pyroute2 import netns as pyroute2_netns
from pyroute2.ethtool.ioctl import EthtoolError, IoctlEthtool, NoSuchDevice, NotSupportedError
from pyroute2.netlink.exceptions import NetlinkError

from agent.errors import NoData
from agent.sysfs import Issues, ReadIssue, SysfsReader, classify_os_error

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

#: errnos with which an empty or netdev-less GID table entry answers a read of its ndevs file
_EMPTY_GID_ERRNOS = frozenset({errno.EINVAL, errno.ENODATA, errno.ENODEV})


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
    """The part of a pyroute2 ``ifinfmsg`` the sampler uses (pyroute2 is untyped)."""

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


# -- reading -------------------------------------------------------------------------------


def read_rdma_netdevs(sys: SysfsReader, issues: Issues) -> dict[str, set[RdmaPort]]:
    """Netdev names associated with RDMA devices, each with the RDMA ports it is known to
    belong to (none when only ``device/net`` names it and its port cannot be told)."""
    out: dict[str, set[RdmaPort]] = {}
    try:
        devices = sys.listdir("class/infiniband")
    except FileNotFoundError:
        return out
    except OSError as exc:
        issues.add("class/infiniband", classify_os_error(exc), exc.strerror or str(exc))
        return out
    for dev in devices:
        base = f"class/infiniband/{dev}"
        ports: list[int] = []
        try:
            ports = sorted(int(p) for p in sys.listdir(f"{base}/ports") if p.isdigit())
        except OSError as exc:
            issues.add(f"{base}/ports", classify_os_error(exc), exc.strerror or str(exc))
        for number in ports:
            for name in _read_port_ndevs(sys, issues, f"{base}/ports/{number}"):
                out.setdefault(name, set()).add(RdmaPort(dev, number))
        try:
            names = sys.listdir(f"{base}/device/net")
        except FileNotFoundError:  # no netdev on this function (e.g. IPoIB not loaded)
            names = []
        except OSError as exc:
            issues.add(f"{base}/device/net", classify_os_error(exc), exc.strerror or str(exc))
            names = []
        for name in names:
            found = out.setdefault(name, set())
            port = _device_net_port(sys, issues, f"{base}/device/net/{name}", ports)
            if port is not None:
                found.add(RdmaPort(dev, port))
    return out


def _device_net_port(sys: SysfsReader, issues: Issues, net: str, ports: list[int]) -> int | None:
    """The RDMA port of a PCI function's netdev: ``dev_port`` + 1 (0-based in sysfs), else
    the only port of a single-port device."""
    dev_port = issues.read_optional(f"{net}/dev_port", int)
    if dev_port is not None and dev_port + 1 in ports:
        return dev_port + 1
    return ports[0] if len(ports) == 1 else None


def _read_port_ndevs(sys: SysfsReader, issues: Issues, port_dir: str) -> set[str]:
    names: set[str] = set()
    link_layer = issues.read_optional(f"{port_dir}/link_layer", str.strip)
    if link_layer == "InfiniBand":  # IB GIDs have no netdev: skip reading up to 128 files
        return names
    ndevs = f"{port_dir}/gid_attrs/ndevs"
    try:
        entries = sys.listdir(ndevs)
    except FileNotFoundError:  # kernels before 4.9 have no gid_attrs
        return names
    except OSError as exc:
        issues.add(ndevs, classify_os_error(exc), exc.strerror or str(exc))
        return names
    for entry in entries:
        rel = f"{ndevs}/{entry}"
        try:
            text = sys.read_text(rel)
        except OSError as exc:
            if exc.errno in _EMPTY_GID_ERRNOS:  # empty entry, or one without a netdev
                continue
            issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            continue
        try:
            names.add(parse_ndev(text))
        except ValueError as exc:
            issues.add(rel, "parse", str(exc))
    return names


class _Rtnl(Protocol):
    def get_links(self) -> Iterable[LinkMessage]: ...

    def link(self, command: str, *, ifname: str) -> Iterable[LinkMessage]: ...

    def close(self) -> None: ...


def _open_rtnl(netns: str | None) -> _Rtnl:
    rtnl: _Rtnl = IPRoute() if netns is None else IPRoute(netns=netns, flags=0)
    return rtnl


def read_links(
    netns: str | None,
    names: Sequence[str] | None,
    issues: Issues,
    open_rtnl: Callable[[str | None], _Rtnl] = _open_rtnl,
) -> tuple[list[NetlinkLink], list[str]]:
    """Links of the namespace: every link when ``names`` is None, else those names.

    Returns the links and the requested names the namespace does not have. Raises when the
    namespace cannot be opened or a dump fails (nothing could be sampled then).
    """
    rtnl = open_rtnl(netns)
    links: list[NetlinkLink] = []
    missing: list[str] = []
    try:
        if names is None:
            for msg in rtnl.get_links():
                _append_link(links, msg, issues, "netlink/link")
            return links, missing
        for name in names:
            try:
                msgs = list(rtnl.link("get", ifname=name))
            except NetlinkError as exc:
                if exc.code == errno.ENODEV:
                    missing.append(name)
                else:
                    reason = classify_os_error(OSError(exc.code, str(exc)))
                    issues.add(f"netlink/link/{name}", reason, str(exc))
                continue
            for msg in msgs:
                _append_link(links, msg, issues, f"netlink/link/{name}")
        return links, missing
    finally:
        rtnl.close()


def _append_link(out: list[NetlinkLink], msg: LinkMessage, issues: Issues, path: str) -> None:
    try:
        out.append(to_link(msg))
    except ValueError as exc:
        issues.add(path, "parse", str(exc))


class _EthtoolIoctl(Protocol):
    """The part of ``pyroute2.ethtool.ioctl.IoctlEthtool`` the sampler uses."""

    def change_ifname(self, ifname: str) -> None: ...

    def get_statistics(self) -> list[tuple[str, int]]: ...

    def close(self) -> None: ...


def open_ethtool(netns: str | None) -> _EthtoolIoctl:
    """An ethtool ioctl socket in ``netns`` (``None``: the caller's namespace).

    For a named namespace the socket is created by a fresh thread that has moved itself
    into it with ``setns(2)`` and then ends; the calling thread never changes namespace.
    """
    if netns is None:
        tool: _EthtoolIoctl = IoctlEthtool()
        return tool
    made: list[_EthtoolIoctl] = []
    failed: list[BaseException] = []

    def enter_and_open() -> None:
        try:
            pyroute2_netns.setns(netns, flags=0)  # flags=0: never create the namespace
            made.append(IoctlEthtool())
        except BaseException as exc:  # handed to the calling thread below
            failed.append(exc)

    worker = threading.Thread(target=enter_and_open, name="netdev-setns", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return made[0]


def read_ethtool_statistics(tool: _EthtoolIoctl, ifname: str) -> list[tuple[str, int]]:
    """All ``ETHTOOL_GSTATS`` statistics of ``ifname`` as ``(name, value)`` pairs."""
    tool.change_ifname(ifname)
    return [(str(name), int(value)) for name, value in tool.get_statistics()]


def _read_sysfs_facts(
    sys: SysfsReader, issues: Issues, name: str, ifindex: int
) -> tuple[int | None, str | None]:
    """``(speed in bytes/s, driver)`` from ``class/net/<name>``, when that is the same device
    as the netlink link (same ifindex); ``(None, None)`` otherwise."""
    base = f"class/net/{name}"
    try:
        text = sys.read_text(f"{base}/ifindex")
    except FileNotFoundError:  # not in this sysfs view (another namespace), or just gone
        return None, None
    except OSError as exc:
        issues.add(f"{base}/ifindex", classify_os_error(exc), exc.strerror or str(exc))
        return None, None
    try:
        sys_ifindex = int(text.strip())
    except ValueError as exc:
        issues.add(f"{base}/ifindex", "parse", str(exc))
        return None, None
    if sys_ifindex != ifindex:  # same name, another namespace's device
        return None, None
    speed = None
    try:
        speed = parse_speed(sys.read_text(f"{base}/speed"))
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: link down or speed unknown to the driver
            issues.add(f"{base}/speed", classify_os_error(exc), exc.strerror or str(exc))
    except ValueError as exc:
        issues.add(f"{base}/speed", "parse", str(exc))
    driver = None
    try:
        driver = os.path.basename(sys.readlink(f"{base}/device/driver"))
    except FileNotFoundError:  # virtual devices (veth, bond, vlan) have no bound driver
        pass
    except OSError as exc:
        issues.add(f"{base}/device/driver", classify_os_error(exc), exc.strerror or str(exc))
    return speed, driver


def _sample_ethtool(
    tool: _EthtoolIoctl, name: str, include: re.Pattern[str], issues: Issues
) -> tuple[EthtoolStats | None, bool]:
    """``(statistics, vanished)`` of one interface. Statistics are ``None`` (and an issue is
    recorded) when they cannot be read; ``vanished`` says the interface no longer exists."""
    path = f"netlink/ethtool/{name}"
    try:
        pairs = read_ethtool_statistics(tool, name)
    except NoSuchDevice:
        issues.add(path, "vanished", "no such device")
        return None, True
    except NotSupportedError:
        issues.add(path, "unsupported", "the driver reports no ethtool statistics")
        return None, False
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            issues.add(path, "vanished", exc.strerror or str(exc))
            return None, True
        issues.add(path, classify_os_error(exc), exc.strerror or str(exc))
        return None, False
    except EthtoolError as exc:
        issues.add(path, "io", repr(exc))
        return None, False
    except AssertionError:  # pyroute2 asserts that the name and value counts agree
        issues.add(path, "io", "the statistics count changed between two ethtool calls")
        return None, False
    return parse_ethtool_stats(pairs, include), False


# -- the sampler ---------------------------------------------------------------------------


class NetdevSampler:
    """Samples RDMA-associated netdevs plus those whose name fully matches ``include``.

    ``ethtool_include`` selects ethtool statistics (``None``: no ethtool reads); ``netns``
    names a namespace under ``/var/run/netns`` (or a path to one) to sample instead of the
    agent's own. ``sys`` must show that same namespace for speed and driver to be read.
    ``open_rtnl`` / ``open_ethtool`` open the two kernel interfaces (defaults: pyroute2's
    netlink socket and ethtool ioctl); the scenario lab answers them for nodes it plays.
    """

    name = "netdev"

    def __init__(
        self,
        sys: SysfsReader,
        include: re.Pattern[str] | None = None,
        ethtool_include: re.Pattern[str] | None = DEFAULT_ETHTOOL_INCLUDE,
        netns: str | None = None,
        *,
        open_rtnl: Callable[[str | None], _Rtnl] = _open_rtnl,
        open_ethtool: Callable[[str | None], _EthtoolIoctl] = open_ethtool,
    ) -> None:
        self.sys = sys
        self.include = include
        self.ethtool_include = ethtool_include
        self.netns = netns
        self._open_rtnl = open_rtnl
        self._open_ethtool = open_ethtool

    def sample(self) -> NetdevSnapshot:
        issues = Issues(self.sys)
        rdma = read_rdma_netdevs(self.sys, issues)
        if not rdma and self.include is None:
            raise NoData("no netdev is associated with an RDMA device and no include is set")
        wanted = None if self.include is not None else sorted(rdma)
        links, missing = read_links(self.netns, wanted, issues, self._open_rtnl)
        if self.include is not None:
            include = self.include
            present = {link.name for link in links}
            missing = sorted(n for n in rdma if n not in present)
            links = [lk for lk in links if lk.name in rdma or include.fullmatch(lk.name)]
        if not links:
            raise NoData(f"none of the selected netdevs exists here (missing: {missing})")

        tool = None
        if self.ethtool_include is not None:
            try:
                tool = self._open_ethtool(self.netns)
            except OSError as exc:
                issues.add("netlink/ethtool", classify_os_error(exc), exc.strerror or str(exc))
        samples = []
        try:
            for link in sorted(links, key=lambda lk: lk.name):
                speed, driver = _read_sysfs_facts(self.sys, issues, link.name, link.ifindex)
                ethtool = None
                if tool is not None and self.ethtool_include is not None:
                    ethtool, vanished = _sample_ethtool(
                        tool, link.name, self.ethtool_include, issues
                    )
                    if vanished:  # gone mid-pass: leave it out rather than half-report it
                        continue
                samples.append(
                    NetdevSample(
                        name=link.name,
                        ifindex=link.ifindex,
                        operstate=link.operstate,
                        carrier=link.carrier,
                        carrier_changes=link.carrier_changes,
                        mtu_bytes=link.mtu_bytes,
                        speed_bytes_per_second=speed,
                        driver=driver,
                        stats=link.stats,
                        ethtool=ethtool,
                        rdma=tuple(sorted(rdma.get(link.name, ()))),
                    )
                )
        finally:
            if tool is not None:
                tool.close()
        return NetdevSnapshot(
            netdevs=tuple(samples), missing=tuple(missing), issues=issues.freeze()
        )
