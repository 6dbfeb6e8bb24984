"""Pure parsers of ``/sys/class/infiniband`` files, and the kernel's tables they need: port
states, link rates (widths and lane speeds), PMA counter widths, the units data counters
count in. No function here touches the filesystem; the sampler
(:mod:`agent.infiniband.sampler`) reads the files and hands their text here.

Units are converted here: ``rate`` (Gb/s) to bytes/second, the PMA data counters (4-byte
words on InfiniBand, 8-byte flits on Omni-Path hfi1) to bytes, ``hw_counters/lifespan`` (ms)
to seconds. PMA counters saturate at the maximum of their width instead of wrapping; each
counter carries the width the kernel gives it so a stuck counter can be flagged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal

from agent.core.sysfs import UnsupportedValue
from agent.infiniband.records import LinkRate, PortCounter, PortState

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


class NoPmaError(UnsupportedValue):
    """A PMA counter file says the device has no PMA (``N/A (no PMA)``, Linux < 4.20)."""


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
