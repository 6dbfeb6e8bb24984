"""Pure parsers of infiniband-diags output (libibmad's ``Field:.......value`` dumps).

``smpquery portinfo|nodeinfo|nodedesc`` and ``perfquery [-x]`` print one field per line,
the name, a colon, dots up to a column and the value; a ``# ...`` header line opens each
block. Each parser reads the first block and ignores lines it does not know (capability
names under ``CapMask``, a header wrapped by a mail client), so output from older or newer
diags still parses; a field it needs that is absent or malformed raises ``ValueError`` with
a one-line reason. Input is bounded by the reader (:mod:`agent.ibpeer.tools`) and every
pattern here is linear, so a hostile tool output costs at most its size.

Units are converted here: lane speeds (``"53.125 Gbps"``) to bytes/second, PMA data counters
(4-byte words) to bytes through :class:`agent.infiniband.PortCounter`'s scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from agent.infiniband.sampler import IB_DATA_UNIT_BYTES, PMA_WIDTHS, PortCounter

#: longest field name libibmad prints ("McastPkeyTrapSuppressionEnabled", "Node Description")
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9 ]{0,47}):\.*(.*)$")
_WIDTH = re.compile(r"\b(1|2|4|8|12)X\b")
_SPEED = re.compile(r"(?:^|\s)(\d{1,4}(?:\.\d{1,6})?) Gbps\b")
_UINT = re.compile(r"^(0x[0-9a-fA-F]{1,16}|\d{1,20})$")
_GUID = re.compile(r"^0x[0-9a-fA-F]{1,16}$")
#: a value libibmad prints for a field it has no name for, or the "none" of extended speeds
_NO_VALUE = ("No Extended Speed", "Extended speed", "undefined")
#: the longest node description kept (IBA NodeDescription is 64 bytes)
DESCRIPTION_MAX = 64
_BITS_PER_BYTE_GBPS = 125_000_000  # 1 Gb/s = 125,000,000 bytes/s


def parse_fields(text: str) -> dict[str, str]:
    """The first block's ``Field -> value`` pairs (first occurrence wins; values stripped).

    The block ends at the second ``#`` header line, so ``ibportstate``'s local-then-peer
    output and its Mellanox extended PortInfo (which repeats ``LinkSpeedSupported`` as a
    hex mask) do not leak into the first block.
    """
    out: dict[str, str] = {}
    headers = 0
    for line in text.splitlines():
        if line.startswith("#"):
            headers += 1
            if headers > 1 and out:
                break
            continue
        m = _FIELD.match(line[:4096])
        if m is None:
            continue
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def _get(fields: dict[str, str], name: str) -> str:
    value = fields.get(name)
    if value is None:
        raise ValueError(f"no {name} field")
    return value


def parse_uint(text: str) -> int:
    """``"42"`` or ``"0x2a"`` -> 42 (perfquery prints some selects in hex)."""
    s = text.strip()
    if _UINT.match(s) is None:
        raise ValueError(f"not an unsigned integer: {s[:40]!r}")
    value = int(s, 16) if s.lower().startswith("0x") else int(s)
    if value >= 1 << 64:
        raise ValueError(f"{s[:40]} does not fit in 64 bits")
    return value


def parse_widths(text: str) -> frozenset[int]:
    """``"1X or 4X or 8X or 12X or 2X"`` -> {1, 2, 4, 8, 12} lanes; ``"4X (IBA extension)"``
    (a mask libibmad has no name for) -> {4}."""
    found = frozenset(int(w) for w in _WIDTH.findall(text[:256]))
    if not found:
        raise ValueError(f"no link width in {text.strip()[:40]!r}")
    return found


def parse_width(text: str) -> int:
    """An active width: exactly one of 1X, 2X, 4X, 8X, 12X."""
    found = parse_widths(text)
    if len(found) != 1:
        raise ValueError(f"expected one active width, got {text.strip()[:40]!r}")
    return next(iter(found))


def lane_speed_bytes(gbps: str) -> int:
    """``"53.125"`` (Gb/s per lane) -> 6_640_625_000 bytes/second."""
    try:
        return int(Decimal(gbps) * _BITS_PER_BYTE_GBPS)
    except InvalidOperation as exc:  # the regex admits only plain decimals; kept for safety
        raise ValueError(f"bad speed {gbps[:20]!r}") from exc


def parse_speeds(text: str) -> frozenset[int]:
    """``"2.5 Gbps or 5.0 Gbps or 10.0 Gbps"`` -> lane speeds in bytes/second; ``"0"``,
    ``"No Extended Speed"`` and the like -> the empty set (none of that kind)."""
    s = text.strip()
    speeds = frozenset(lane_speed_bytes(g) for g in _SPEED.findall(s[:512]))
    if speeds:
        return speeds
    if s == "0" or s.startswith(_NO_VALUE):
        return frozenset()
    raise ValueError(f"no lane speed in {s[:40]!r}")


@dataclass(frozen=True, slots=True)
class PortInfo:
    """One port's PortInfo as ``smpquery portinfo`` prints it.

    Widths are lane counts; speeds are per-lane signalling rates in bytes/second, the base
    and extended (FDR and faster) speed fields merged: the active speed is the extended one
    when a port reports one (the IBA rule: LinkSpeedExtActive overrides when non-zero).
    ``None`` or empty means absent, never 0.
    """

    lid: int | None
    link_state: str | None
    phys_state: str | None
    width_active: int | None
    width_enabled: frozenset[int]
    width_supported: frozenset[int]
    speed_active: int | None
    speed_enabled: frozenset[int]
    speed_supported: frozenset[int]


def _speed_set(fields: dict[str, str], kind: str) -> frozenset[int]:
    """Union of LinkSpeed<kind>, LinkSpeedExt<kind> and LinkSpeedExt<kind>2 (XDR)."""
    out: set[int] = set()
    for name in (f"LinkSpeed{kind}", f"LinkSpeedExt{kind}", f"LinkSpeedExt{kind}2"):
        if name in fields:
            out |= parse_speeds(fields[name])
    return frozenset(out)


def _active_speed(fields: dict[str, str]) -> int | None:
    for name in ("LinkSpeedExtActive2", "LinkSpeedExtActive", "LinkSpeedActive"):
        if name in fields:
            speeds = parse_speeds(fields[name])
            if len(speeds) > 1:
                raise ValueError(f"{name} names more than one speed")
            if speeds:
                return next(iter(speeds))
    return None


def parse_portinfo(text: str) -> PortInfo:
    """``smpquery portinfo`` (or ``ibportstate``'s first block) -> :class:`PortInfo`.

    Raises ``ValueError`` when the output holds no PortInfo (no LinkWidthActive field) or a
    width/speed field is malformed.
    """
    f = parse_fields(text)
    lid = f.get("Lid")
    width_enabled = f.get("LinkWidthEnabled")
    width_supported = f.get("LinkWidthSupported")
    return PortInfo(
        lid=parse_uint(lid) if lid is not None else None,
        link_state=f.get("LinkState") or None,
        phys_state=f.get("PhysLinkState") or None,
        width_active=parse_width(_get(f, "LinkWidthActive")),
        width_enabled=parse_widths(width_enabled) if width_enabled else frozenset(),
        width_supported=parse_widths(width_supported) if width_supported else frozenset(),
        speed_active=_active_speed(f),
        speed_enabled=_speed_set(f, "Enabled"),
        speed_supported=_speed_set(f, "Supported"),
    )


#: NodeInfo NodeType as libibmad prints it -> the kernel's node_type spelling
NODE_TYPES = {"Channel Adapter": "CA", "Switch": "switch", "Router": "router"}


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The neighbour's NodeInfo: its node GUID (``0x`` and 16 hex digits), node type
    (``CA``, ``switch``, ``router``), port count and ``local_port``, the port number the
    query entered it by: the neighbour's end of the cable."""

    guid: str
    node_type: str
    num_ports: int
    local_port: int


def parse_guid(text: str) -> str:
    """``"0x0002c90300a4e720"`` -> the same, lower case, 16 digits."""
    s = text.strip()
    if _GUID.match(s) is None:
        raise ValueError(f"not a GUID: {s[:40]!r}")
    return f"0x{int(s, 16):016x}"


def parse_nodeinfo(text: str) -> NodeInfo:
    """``smpquery nodeinfo`` -> :class:`NodeInfo`; NumPorts and LocalPort are 8-bit fields
    of the MAD, a larger number is malformed output (``ValueError``)."""
    f = parse_fields(text)
    kind = _get(f, "NodeType")
    num_ports = parse_uint(_get(f, "NumPorts"))
    local_port = parse_uint(_get(f, "LocalPort"))
    for name, value in (("NumPorts", num_ports), ("LocalPort", local_port)):
        if value > 255:
            raise ValueError(f"{name} {value} is not an 8-bit value")
    return NodeInfo(
        guid=parse_guid(_get(f, "Guid")),
        node_type=NODE_TYPES.get(kind, "unknown"),
        num_ports=num_ports,
        local_port=local_port,
    )


def clean_description(text: str) -> str:
    """A node description as a label value: printable ASCII only (others become ``?``),
    whitespace runs collapsed, at most :data:`DESCRIPTION_MAX` characters."""
    head = text[: DESCRIPTION_MAX * 4]
    printable = "".join(c if " " <= c <= "~" else " " if c.isspace() else "?" for c in head)
    return " ".join(printable.split())[:DESCRIPTION_MAX]


def parse_nodedesc(text: str) -> str:
    """``smpquery nodedesc`` -> the neighbour's description, cleaned (may be empty)."""
    return clean_description(_get(parse_fields(text), "Node Description"))


#: perfquery field -> the kernel's counters/ file name for the same PMA counter, so the
#: neighbour's counters carry the local counters' names, widths and units
PERFQUERY_NAMES: dict[str, str] = {
    "SymbolErrorCounter": "symbol_error",
    "LinkErrorRecoveryCounter": "link_error_recovery",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "port_rcv_errors",
    "PortRcvRemotePhysicalErrors": "port_rcv_remote_physical_errors",
    "PortRcvSwitchRelayErrors": "port_rcv_switch_relay_errors",
    "PortXmitDiscards": "port_xmit_discards",
    "PortXmitConstraintErrors": "port_xmit_constraint_errors",
    "PortRcvConstraintErrors": "port_rcv_constraint_errors",
    "LocalLinkIntegrityErrors": "local_link_integrity_errors",
    "ExcessiveBufferOverrunErrors": "excessive_buffer_overrun_errors",
    "VL15Dropped": "VL15_dropped",
    "PortXmitWait": "port_xmit_wait",
    "PortXmitData": "port_xmit_data",
    "PortRcvData": "port_rcv_data",
    "PortXmitPkts": "port_xmit_packets",
    "PortRcvPkts": "port_rcv_packets",
    "PortUnicastXmitPkts": "unicast_xmit_packets",
    "PortUnicastRcvPkts": "unicast_rcv_packets",
    "PortMulticastXmitPkts": "multicast_xmit_packets",
    "PortMulticastRcvPkts": "multicast_rcv_packets",
    "QP1Dropped": "qp1_dropped",
}
#: fields that are selectors, not counters
_NOT_COUNTERS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})
_DATA = frozenset({"port_xmit_data", "port_rcv_data"})
#: PortCounters (not extended) data and packet counters are 32 bits wide
_BASIC_32 = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"})


@dataclass(frozen=True, slots=True)
class PerfCounters:
    """One ``perfquery`` answer: the port it is about and its counters by kernel name,
    with the width in bits each has in the attribute that carried it."""

    port_select: int
    extended: bool
    values: tuple[tuple[str, int, int | None], ...]  # (name, raw, width bits)


def parse_perfquery(text: str, *, extended: bool) -> PerfCounters:
    """``perfquery LID PORT`` (``extended=False``: PortCounters, PMA widths) or
    ``perfquery -x LID PORT`` (PortCountersExtended: every counter 64 bits, including the
    error counters newer PMAs append to it). Unknown fields are kept under their perfquery
    name, lower-cased, width unknown."""
    f = parse_fields(text)
    port_select = parse_uint(_get(f, "PortSelect"))
    values: list[tuple[str, int, int | None]] = []
    for field, raw in f.items():
        if field in _NOT_COUNTERS:
            continue
        name = PERFQUERY_NAMES.get(field)
        value = parse_uint(raw)
        if name is None:
            values.append((re.sub(r"[^a-z0-9_]", "_", field.lower())[:48], value, None))
            continue
        if extended:
            width: int | None = 64
        elif name in _BASIC_32:
            width = 32
        else:
            width = PMA_WIDTHS.get(name)
        values.append((name, value, width))
    if not any(name in PERFQUERY_NAMES.values() for name, _, _ in values):
        raise ValueError("no PMA counter in perfquery output")
    return PerfCounters(port_select, extended, tuple(sorted(values)))


def split_blocks(text: str, *, limit: int = 256) -> list[str]:
    """The ``# ...``-headed blocks of a tool's output, in order (``perfquery -l LID 1,5``
    prints one block per port); text before the first header is dropped. At most ``limit``
    blocks (a switch has at most 254 ports): more is malformed output, ``ValueError``."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("#"):
            if len(blocks) == limit:
                raise ValueError(f"more than {limit} blocks in the output")
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    return ["\n".join(b) for b in blocks]


def parse_perfquery_ports(text: str, *, extended: bool) -> dict[int, PerfCounters]:
    """``perfquery [-x] -l LID P1,P2,...`` -> each port's counters by port number (the
    answer's own ``PortSelect``, never the order asked). A block that does not parse raises
    ``ValueError``; so does a port answered twice."""
    out: dict[int, PerfCounters] = {}
    for block in split_blocks(text):
        counters = parse_perfquery(block, extended=extended)
        if counters.port_select in out:
            raise ValueError(f"port {counters.port_select} answered twice")
        out[counters.port_select] = counters
    if not out:
        raise ValueError("no perfquery block in the output")
    return out


def merge_counters(basic: PerfCounters | None, ext: PerfCounters | None) -> tuple[PortCounter, ...]:
    """The neighbour port's counters as :class:`PortCounter` (source ``counters``): a field
    of the extended answer wins over the same field of the basic one (64 bits against 16 or
    32, as the kernel's sysfs does when the PMA supports extended width); data counters are
    scaled from 4-byte words to bytes."""
    chosen: dict[str, tuple[int, int | None]] = {}
    for answer in (basic, ext):
        if answer is None:
            continue
        for name, raw, width in answer.values:
            chosen[name] = (raw, width)
    return tuple(
        PortCounter(
            source="counters",
            name=name,
            raw=raw,
            scale=IB_DATA_UNIT_BYTES if name in _DATA else 1,
            width=width,
        )
        for name, (raw, width) in sorted(chosen.items())
    )
