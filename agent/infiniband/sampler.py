"""InfiniBand / RoCE sampler: every port of every RDMA device under ``/sys/class/infiniband``.

Reads mlx5, mlx4, irdma/i40iw, bnxt_re, hfi1, EFA and bonded devices alike: device identity
(firmware, board, HCA type, node GUID/type, PCI address, NUMA node), per-port state, rate,
link layer, LIDs and netdev, and every file in ``ports/N/counters``, ``ports/N/hw_counters``
and the legacy ``ports/N/counters_ext``. Nothing is dropped because a list did not know its
name: each counter file becomes a :class:`PortCounter`, and the exporter decides its metric.

Units are converted here: ``rate`` (Gb/s) to bytes/second, the PMA data counters (4-byte
words on InfiniBand, 8-byte flits on Omni-Path hfi1) to bytes, ``hw_counters/lifespan`` (ms)
to seconds. PMA counters saturate at the maximum of their width instead of wrapping; each
counter carries the width the kernel gives it so a stuck counter can be flagged.

One unreadable or malformed file (EACCES, EIO, a file vanishing mid-scan, garbage,
``N/A (no PMA)``) costs that value only and is recorded as a :class:`~agent.core.sysfs.ReadIssue`.
"""

from __future__ import annotations

import dataclasses
import errno
import posixpath
import re
import time
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from typing import Protocol, TypeVar

from agent.config import ExpectedRate
from agent.core.errors import NoData
from agent.core.findings import Finding
from agent.core.sysfs import Issues, SysfsReader, UnsupportedValue, classify_os_error
from agent.infiniband.capacity import PeakRates, annotate
from agent.infiniband.records import (
    PORT_STATE_ACTIVE,
    SOURCE_CLEARED,
    IbDevice,
    IbPort,
    InfinibandSnapshot,
    LinkRate,
    PortCounter,
    PortState,
)

T = TypeVar("T")

CLASS_DIR = "class/infiniband"

#: counter directories of a port, in the order they are read (``source`` values)
COUNTER_SOURCES = ("counters", "counters_ext", "hw_counters")

#: IB port states as the kernel prints them (``state_show`` in drivers/infiniband/core/sysfs.c)
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
#: IB physical port states (``phys_state_show``)
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}

#: link widths ``ib_width_enum_to_int`` prints (drivers/infiniband/core/verbs.c)
LINK_WIDTHS = (1, 2, 4, 8, 12)
#: lane speeds ``rate_show`` names (drivers/infiniband/core/sysfs.c), in Gb/s per lane as the
#: kernel computes the rate (FDR: 14, not 14.0625). RoCE ports report their Ethernet speed in
#: these terms too: mlx5 maps 25GbE to ``1X EDR``, 100GbE to ``4X EDR``, 400GbE to ``8X HDR``
#: or ``4X NDR``.
LANE_SPEEDS_GBPS: dict[str, Decimal] = {
    "SDR": Decimal("2.5"),
    "DDR": Decimal(5),
    "QDR": Decimal(10),
    "FDR10": Decimal(10),
    "FDR": Decimal(14),
    "EDR": Decimal(25),
    "HDR": Decimal(50),
    "NDR": Decimal(100),
    "XDR": Decimal(200),
}

#: Widths in bits of the PMA PortCounters fields, from the kernel's
#: ``PORT_PMA_ATTR(name, counter, width, offset)`` table in drivers/infiniband/core/sysfs.c.
#: The kernel reads these over a PerfMgmt MAD; the hardware stops them at their maximum
#: (they saturate, they do not wrap) until someone resets them.
PMA_WIDTHS: dict[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
}
#: Data and packet counters: 32 bits in the basic table, 64 bits (``PORT_PMA_ATTR_EXT``) when
#: the device's PMA ClassPortInfo advertises extended width (``pma_attrs_ext`` and
#: ``pma_attrs_noietf``).
PMA_DATA_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")
#: Present only in the extended table (``pma_attrs_ext``), always 64 bits. Their presence in
#: ``counters/`` proves the data counters beside them are 64-bit too.
PMA_EXT_ONLY_COUNTERS = (
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
)
#: The legacy ``counters_ext/`` directory (mlx4 before Linux 4.5): all 64-bit.
COUNTERS_EXT_64 = (
    "port_xmit_data_64",
    "port_rcv_data_64",
    "port_xmit_packets_64",
    "port_rcv_packets_64",
    "port_unicast_xmit_packets",
    "port_unicast_rcv_packets",
    "port_multicast_xmit_packets",
    "port_multicast_rcv_packets",
)
#: Counters that count data in link units (IB: 4-byte words; OPA: 8-byte flits), by source.
DATA_COUNTERS = {
    ("counters", "port_xmit_data"),
    ("counters", "port_rcv_data"),
    ("counters_ext", "port_xmit_data_64"),
    ("counters_ext", "port_rcv_data_64"),
}
#: IBTA PortXmitData/PortRcvData count octets divided by 4.
IB_DATA_UNIT_BYTES = 4
#: hfi1 (Omni-Path) fills them from its flit counters (hfi1 mad.c pma_get_opa_port_dctrs reads
#: C_DC_XMIT_FLITS / C_DC_RCV_FLITS); Intel's opa-ff documents "PortXmitData and PortRcvData
#: are in units of flits (8 bytes)". procfs/node_exporter multiply by 4 here too, halving it.
OPA_DATA_UNIT_BYTES = 8
OPA_DRIVERS = ("hfi1",)

_U64_MAX = (1 << 64) - 1
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+Gb/sec\b")
#: the ``(4X NDR)`` that follows: lanes, then the lane speed's name (absent on kernels that
#: printed SDR as nothing: ``10 Gb/sec (4X)``)
_RATE_DETAIL = re.compile(r"\((\d{1,2})X(?:\s+([A-Z][A-Z0-9]{1,7}))?\)")
_COUNTER = re.compile(r"^\s*(\d+)\s*$")
#: errnos with which reading ``gid_attrs/ndevs/0`` says "this GID has no netdev" (an
#: InfiniBand port): expected, not a problem
_NO_NDEV_ERRNOS = (errno.EINVAL, errno.ENODATA)


class NoPmaError(UnsupportedValue):
    """A PMA counter file says the device has no PMA (``N/A (no PMA)``, Linux < 4.20)."""


# -- pure parsers ----------------------------------------------------------------------


def parse_text(text: str) -> str:
    """A one-line attribute (``fw_ver``, ``board_id``, ``link_layer`` ...), stripped."""
    return text.strip()


def parse_state(text: str) -> PortState:
    """``"4: ACTIVE"`` -> ``PortState(4, "ACTIVE")`` (also ``phys_state``, ``node_type``)."""
    m = _STATE.match(text)
    if m is None:
        raise ValueError(f"expected 'NUMBER: NAME', got {text.strip()[:40]!r}")
    return PortState(int(m.group(1)), m.group(2))


def parse_node_type(text: str) -> str:
    """``"1: CA"`` -> ``"CA"``."""
    return parse_state(text).name


def parse_rate(text: str) -> int:
    """``"400 Gb/sec (4X NDR)"`` -> 50_000_000_000 bytes/second (1 Gb/s = 125,000,000 B/s)."""
    return parse_link_rate(text).bytes_per_second


def lane_speed_bytes_per_second(speed: str | None) -> int | None:
    """``"NDR"`` -> 12_500_000_000 (100 Gb/s per lane); None for no or an unknown name."""
    gbps = LANE_SPEEDS_GBPS.get(speed) if speed is not None else None
    return int(gbps * 125_000_000) if gbps is not None else None


def parse_link_rate(text: str) -> LinkRate:
    """``"400 Gb/sec (4X NDR)"`` -> ``LinkRate(50_000_000_000, 4, "NDR")``.

    The kernel prints ``"%d%s Gb/sec (%dX%s)"`` (``rate_show``): the rate, then the lanes and
    the lane speed's name. A width the kernel does not define, a name it does not print, or
    no parenthesis at all leave ``width``/``speed`` ``None``; the rate alone decides whether
    the text parses. Kernels before 4.x printed SDR as nothing (``"10 Gb/sec (4X)"``): a
    nameless speed whose lanes run at 2.5 Gb/s is SDR.
    """
    m = _RATE.match(text)
    if m is None:
        raise ValueError(f"expected 'N Gb/sec (...)', got {text.strip()[:40]!r}")
    gbps = Decimal(m.group(1))  # the regex admits only plain decimals
    rate = LinkRate(int(gbps * 125_000_000))
    detail = _RATE_DETAIL.search(text, m.end(), m.end() + 24)
    if detail is None:
        return rate
    width = int(detail.group(1))
    if width not in LINK_WIDTHS:
        return rate
    speed = detail.group(2)
    if speed is None and gbps == width * LANE_SPEEDS_GBPS["SDR"]:
        speed = "SDR"
    if speed is not None and speed not in LANE_SPEEDS_GBPS:
        speed = None
    return LinkRate(rate.bytes_per_second, width, speed)


def parse_counter(text: str) -> int:
    """A counter file: a non-negative decimal that fits in 64 bits.

    ``N/A (no PMA)`` (what Linux < 4.20 prints when the device has no PMA) raises
    :class:`NoPmaError`; anything else that is not a u64 raises ``ValueError``.
    """
    stripped = text.strip()
    if stripped.startswith("N/A"):
        raise NoPmaError(stripped[:40])
    m = _COUNTER.match(text)
    if m is None:
        raise ValueError(f"not a non-negative integer: {stripped[:40]!r}")
    value = int(m.group(1))
    if value > _U64_MAX:
        raise ValueError(f"{stripped[:40]} does not fit in 64 bits")
    return value


def parse_lid(text: str) -> int:
    """``"0x1a"`` -> 26 (``lid`` and ``sm_lid`` are printed in hex)."""
    stripped = text.strip()
    if not stripped.lower().startswith("0x"):
        raise ValueError(f"expected a hex LID like 0x1a, got {stripped[:40]!r}")
    try:
        return int(stripped, 16)
    except ValueError as exc:
        raise ValueError(f"bad hex LID {stripped[:40]!r}") from exc


def parse_int(text: str) -> int:
    """A signed decimal (``numa_node`` is -1 when the platform reports none)."""
    try:
        return int(text.strip())
    except ValueError as exc:
        raise ValueError(f"not an integer: {text.strip()[:40]!r}") from exc


def parse_hex_int(text: str) -> int:
    """``"0x1"`` -> 1 (a netdev's legacy ``dev_id``)."""
    try:
        return int(text.strip(), 16)
    except ValueError as exc:
        raise ValueError(f"not a hex integer: {text.strip()[:40]!r}") from exc


def parse_lifespan_seconds(text: str) -> float:
    """``hw_counters/lifespan`` is in milliseconds: ``"10"`` -> 0.01 seconds."""
    return parse_counter(text) / 1000


def pma_width(source: str, name: str, extended: bool) -> int | None:
    """The kernel-defined width of a counter in bits, or ``None`` when it defines none.

    ``extended``: whether the port's ``counters/`` data and packet counters are the 64-bit
    extended ones (see :func:`has_extended_pma`).
    """
    if source == "counters":
        if name in PMA_WIDTHS:
            return PMA_WIDTHS[name]
        if name in PMA_DATA_COUNTERS:
            return 64 if extended else 32
        if name in PMA_EXT_ONLY_COUNTERS:
            return 64
        return None
    if source == "counters_ext" and name in COUNTERS_EXT_64:
        return 64
    return None


def has_extended_pma(counters: dict[str, int]) -> bool:
    """Whether a port's ``counters/`` (name -> raw value) uses the 64-bit extended table.

    True when a file that exists only in the extended table is there, or when a data or
    packet counter holds more than 32 bits can. Otherwise the port is treated as 32-bit: a
    64-bit counter sitting at exactly 2**32-1 at a sampling instant is not a real concern.
    """
    if any(name in counters for name in PMA_EXT_ONLY_COUNTERS):
        return True
    return any(counters.get(name, 0) > 0xFFFFFFFF for name in PMA_DATA_COUNTERS)


def data_unit_bytes(driver: str | None, device: str) -> int:
    """Bytes per unit of the PMA data counters: 8 (flits) on Omni-Path hfi1, else 4 (words).

    Uses the bound driver when the device links to one, else the device name's driver prefix
    (``hfi1_0``).
    """
    kind = driver if driver is not None else re.sub(r"_\d+$", "", device)
    return OPA_DATA_UNIT_BYTES if kind in OPA_DRIVERS else IB_DATA_UNIT_BYTES


def build_counters(raw: Iterable[tuple[str, str, int]], data_unit: int) -> tuple[PortCounter, ...]:
    """Turn ``(source, name, raw value)`` triples of one port into counters with their width
    and unit scale, in stable (source, name) order."""
    items = sorted(raw)
    pma = {name: value for source, name, value in items if source == "counters"}
    extended = has_extended_pma(pma)
    return tuple(
        PortCounter(
            source=source,
            name=name,
            raw=value,
            scale=data_unit if (source, name) in DATA_COUNTERS else 1,
            width=pma_width(source, name, extended),
        )
        for source, name, value in items
    )


def pci_location_from_path(resolved: str) -> tuple[str, str] | None:
    """``devices/pci0000:05/.../0000:09:00.0/infiniband/i40iw0`` -> ``("0000:09:00.0", dir)``.

    For a device directory reached through its ``class/infiniband`` symlink; ``None`` when
    the path is not below a PCI function (a plain directory, a virtual device).
    """
    parts = resolved.split("/")
    if len(parts) >= 3 and parts[-2] == "infiniband" and _PCI_ADDRESS.match(parts[-3]):
        return parts[-3], "/".join(parts[:-2])
    return None


def is_pci_address(name: str) -> bool:
    return _PCI_ADDRESS.match(name) is not None


# -- reading ---------------------------------------------------------------------------


def _link_name(issues: Issues, rel: str) -> str | None:
    """Basename of the symlink ``rel``'s target; ``None`` when ``rel`` is no symlink."""
    try:
        target = issues.reader.readlink(rel)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL, errno.ENOTDIR):
            return None  # no such link: a plain directory or a device without a parent
        issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
        return None
    return posixpath.basename(target.rstrip("/")) or None


def _listdir(issues: Issues, rel: str) -> list[str] | None:
    try:
        return issues.reader.listdir(rel)
    except OSError as exc:
        issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
        return None


def read_infiniband(sys: SysfsReader) -> InfinibandSnapshot:
    """Read every RDMA device below ``class/infiniband``. Raises ``NoData`` when there is
    none; any other problem is recorded in the snapshot's ``issues``."""
    issues = Issues(sys)
    try:
        names = sys.listdir(CLASS_DIR)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise NoData(f"{CLASS_DIR} is absent: no RDMA devices") from exc
        issues.add(CLASS_DIR, classify_os_error(exc), exc.strerror or str(exc))
        return InfinibandSnapshot(devices=(), issues=issues.freeze())
    if not names:
        raise NoData(f"{CLASS_DIR} is empty: no RDMA devices")
    devices = [d for d in (read_device(sys, issues, name) for name in names) if d is not None]
    return InfinibandSnapshot(devices=tuple(devices), issues=issues.freeze())


def read_device(sys: SysfsReader, issues: Issues, name: str) -> IbDevice | None:
    """One device; ``None`` (and one ``vanished`` issue) if it disappeared during the scan."""
    base = f"{CLASS_DIR}/{name}"
    mark = len(issues.items)

    pci_bus_id, pci_dir = _read_pci_location(sys, issues, base)
    driver = _link_name(issues, f"{base}/device/driver")
    data_unit = data_unit_bytes(driver, name)
    device = IbDevice(
        name=name,
        fw_ver=issues.read_optional(f"{base}/fw_ver", parse_text),
        board_id=issues.read_optional(f"{base}/board_id", parse_text),
        hca_type=issues.read_optional(f"{base}/hca_type", parse_text),
        node_guid=issues.read_optional(f"{base}/node_guid", parse_text),
        node_type=issues.read_optional(f"{base}/node_type", parse_node_type),
        pci_bus_id=pci_bus_id,
        numa_node=(issues.read_optional(f"{pci_dir}/numa_node", parse_int) if pci_dir else None),
        driver=driver,
        ports=_read_ports(sys, issues, name, data_unit),
    )
    if not sys.exists(base):
        # The device went away mid-scan (driver unload, VF removal): what was read is partial
        # and the hardware is gone. One issue for the device instead of one per file.
        del issues.items[mark:]
        issues.add(base, "vanished", "device disappeared during the scan")
        return None
    return device


def _read_pci_location(sys: SysfsReader, issues: Issues, base: str) -> tuple[str | None, str]:
    """(PCI address, directory holding the PCI function's attributes) of a device."""
    parent = _link_name(issues, f"{base}/device")
    if parent is not None:
        if not is_pci_address(parent):
            # the link's text need not end in the address (``device -> ../..`` is as valid as
            # the kernel's ``../../../0000:1a:00.0``): resolve it
            try:
                parent = posixpath.basename(sys.realpath(f"{base}/device"))
            except OSError as exc:
                issues.add(f"{base}/device", classify_os_error(exc), exc.strerror or str(exc))
                return None, f"{base}/device"
        return (parent if is_pci_address(parent) else None), f"{base}/device"
    try:
        resolved = sys.realpath(base)
    except OSError as exc:
        issues.add(base, classify_os_error(exc), exc.strerror or str(exc))
        return None, ""
    found = pci_location_from_path(resolved)
    if found is None:
        return None, ""
    return found


def _read_ports(
    sys: SysfsReader, issues: Issues, device: str, data_unit: int
) -> tuple[IbPort, ...]:
    ports_dir = f"{CLASS_DIR}/{device}/ports"
    entries = _listdir(issues, ports_dir)
    if entries is None:
        return ()
    numbered: list[tuple[int, str]] = []
    for entry in entries:
        if not entry.isdigit():
            issues.add(f"{ports_dir}/{entry}", "parse", "port directory name is not a number")
            continue
        numbered.append((int(entry), entry))
    numbered.sort()
    return tuple(
        read_port(
            sys,
            issues,
            device,
            number=number,
            entry=entry,
            port_count=len(numbered),
            data_unit=data_unit,
        )
        for number, entry in numbered
    )


def read_port(
    sys: SysfsReader,
    issues: Issues,
    device: str,
    *,
    number: int,
    entry: str,
    port_count: int,
    data_unit: int,
) -> IbPort:
    """Port ``number`` (directory ``entry``) of ``device``; ``port_count`` is how many ports
    the device has, ``data_unit`` the bytes per unit of its PMA data counters."""
    p = f"{CLASS_DIR}/{device}/ports/{entry}"
    raw: list[tuple[str, str, int]] = []
    lifespan: float | None = None
    for source in COUNTER_SOURCES:
        directory = f"{p}/{source}"
        try:
            files = sys.listdir_files(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue  # irdma has no counters/, only mlx4 on old kernels has counters_ext/
        except OSError as exc:
            issues.add(directory, classify_os_error(exc), exc.strerror or str(exc))
            continue
        for fname in files:
            rel = f"{directory}/{fname}"
            if source == "hw_counters" and fname == "lifespan":
                lifespan = issues.read(rel, parse_lifespan_seconds)
                continue
            value = issues.read(rel, parse_counter)
            if value is not None:
                raw.append((source, fname, value))
    state = issues.read(f"{p}/state", parse_state)
    phys_state = issues.read(f"{p}/phys_state", parse_state)
    rate = issues.read(f"{p}/rate", parse_link_rate)
    return IbPort(
        device=device,
        port=number,
        state=state,
        phys_state=phys_state,
        rate_bytes_per_second=rate.bytes_per_second if rate is not None else None,
        width=rate.width if rate is not None else None,
        speed=rate.speed if rate is not None else None,
        link_layer=issues.read(f"{p}/link_layer", parse_text),
        lid=issues.read_optional(f"{p}/lid", parse_lid),
        sm_lid=issues.read_optional(f"{p}/sm_lid", parse_lid),
        netdevs=_read_netdevs(sys, issues, device, p=p, number=number, port_count=port_count),
        counters=build_counters(raw, data_unit),
        hw_counters_lifespan_seconds=lifespan,
    )


def _read_netdevs(
    sys: SysfsReader, issues: Issues, device: str, *, p: str, number: int, port_count: int
) -> tuple[str, ...]:
    """The port's netdev: ``gid_attrs/ndevs/0`` (RoCE, bonds), else the PCI device's
    ``net/*`` whose ``dev_port`` (or legacy ``dev_id``) is ``port - 1`` (IPoIB, iWARP)."""
    ndev0 = f"{p}/gid_attrs/ndevs/0"
    if sys.exists(ndev0):
        try:
            name = sys.read_text(ndev0).strip()
        except OSError as exc:
            if exc.errno not in _NO_NDEV_ERRNOS:
                issues.add(ndev0, classify_os_error(exc), exc.strerror or str(exc))
            # else: GID 0 has no netdev (an InfiniBand port); look at the parent device
        else:
            if name:
                return (name,)
    net = f"{CLASS_DIR}/{device}/device/net"
    if not sys.is_dir(net):
        return ()
    names = _listdir(issues, net) or []
    matched: list[str] = []
    for name in names:
        dev_port = issues.read_optional(f"{net}/{name}/dev_port", parse_int)
        if dev_port is None:
            dev_port = issues.read_optional(f"{net}/{name}/dev_id", parse_hex_int)
        if dev_port is None:
            if port_count == 1:
                matched.append(name)
        elif dev_port == number - 1:
            matched.append(name)
    return tuple(matched)


class CounterReader(Protocol):
    """A step that reads a port's PMA counters another way and returns the snapshot with
    them merged (:class:`agent.infiniband.pma.PmaReader`: perfquery at the port's LID)."""

    def update(self, snap: InfinibandSnapshot) -> InfinibandSnapshot: ...


class SaturationClock:
    """Since when each PMA counter has been found at its maximum: the first pass of the
    current run of passes that found it there (this agent's memory: after a restart, the
    restart's first pass)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._since: dict[tuple[str, int, str, str], float] = {}

    def stamp(self, snap: InfinibandSnapshot) -> InfinibandSnapshot:
        now = self._clock()
        seen: dict[tuple[str, int, str, str], float] = {}
        devices = []
        for dev in snap.devices:
            ports = []
            for port in dev.ports:
                counters = []
                for c in port.counters:
                    if not c.saturated:
                        counters.append(c)
                        continue
                    key = (dev.name, port.port, c.source, c.name)
                    seen[key] = self._since.get(key, now)
                    counters.append(dataclasses.replace(c, saturated_since=seen[key]))
                ports.append(dataclasses.replace(port, counters=tuple(counters)))
            devices.append(dataclasses.replace(dev, ports=tuple(ports)))
        self._since = seen
        return dataclasses.replace(snap, devices=tuple(devices))


class InfinibandSampler:
    """Samples ``/sys/class/infiniband`` through a :class:`~agent.core.sysfs.SysfsReader`.

    Keeps memories between passes: each port's fastest rate seen while ACTIVE, stamped (with
    the configured expectation, ``expected_rates``) on the ports it returns for
    :mod:`agent.infiniband.capacity` to judge, and since when each saturated counter has
    been saturated. ``pma``, when given, reads the InfiniBand ports' PMA counters with
    perfquery after sysfs (64-bit where the HCA keeps them; cleared near their maximum when
    asked) and merges them in.
    """

    name = "infiniband"

    def __init__(
        self,
        sys: SysfsReader,
        expected_rates: Sequence[ExpectedRate] = (),
        pma: CounterReader | None = None,
    ) -> None:
        self.sys = sys
        self.expected_rates = tuple(expected_rates)
        self.pma = pma
        self._peaks = PeakRates()
        self._saturation = SaturationClock()

    def sample(self) -> InfinibandSnapshot:
        snap = read_infiniband(self.sys)
        if self.pma is not None:
            snap = self.pma.update(snap)
        snap = self._saturation.stamp(snap)
        return annotate(snap, self._peaks.update(snap), self.expected_rates)


# -- analysis --------------------------------------------------------------------------


PHYS_STATE_DISABLED = 3


def findings(snap: InfinibandSnapshot) -> list[Finding]:
    """Ports down (``port_down``: not ACTIVE with a LinkUp physical link, the condition of
    ``fabricscope_infiniband_port_up == 0`` and of its alert) unless an administrator
    switched them off (``port_disabled``, info), and PMA counters stuck at the maximum of
    their width (``counter_saturated``), sorted. ACTIVE ports below their rate:
    ``capacity.findings``."""
    out: list[Finding] = []
    for dev in snap.devices:
        for port in dev.ports:
            subject = f"{dev.name}/{port.port}"
            phys = port.phys_state
            if phys is not None and phys.number == PHYS_STATE_DISABLED:
                out.append(
                    Finding(
                        "port_disabled",
                        subject,
                        f"{dev.name} port {port.port} is switched off (physical state "
                        f"{phys.name}).",
                    )
                )
            elif port.up is False and port.state is not None and phys is not None:
                why = (
                    f"ACTIVE but its physical state is {phys.name}, not LinkUp"
                    if port.state.number == PORT_STATE_ACTIVE
                    else f"{port.state.name}, physical state {phys.name}, not ACTIVE"
                )
                out.append(Finding("port_down", subject, f"{dev.name} port {port.port} is {why}."))
            for c in port.counters:
                if c.saturated:
                    out.append(
                        Finding("counter_saturated", f"{subject}/{c.name}", _stuck(dev, port, c))
                    )
    return sorted(out)


def _stuck(dev: IbDevice, port: IbPort, c: PortCounter) -> str:
    where = f"{c.source}/{c.name} on {dev.name} port {port.port}"
    src = port.counter_source
    if src is not None and src.source == SOURCE_CLEARED:
        return (
            f"{where} reached {c.raw}, the maximum of its {c.width}-bit width, within one "
            "pass before the agent cleared it: what it missed is lost (a shorter "
            "--sampling.interval, or an HCA with 64-bit PortCountersExtended error counters)."
        )
    return (
        f"{where} sits at {c.raw}, the maximum of its {c.width}-bit width: it no longer counts "
        "until it is cleared (--infiniband.reset-saturated, or perfquery -R)."
    )
