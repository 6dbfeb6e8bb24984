"""Pure parsers of infiniband-diags output (libibmad's ``Field:.......value`` dumps).

``smpquery portinfo|nodeinfo|nodedesc`` and ``perfquery [-x]`` print one field per line,
the name, a colon, dots up to a column and the value; a ``# ...`` header line opens each
block. Each parser reads the first block and ignores lines it does not know (capability
names under ``CapMask``, a header wrapped by a mail client), so output from older or newer
diags still parses; a field it needs that is absent or malformed raises ``ValueError`` with
a one-line reason. Input is bounded by the reader (:mod:`agent.core.tools`) and every
pattern here is linear, so a hostile tool output costs at most its size.

Units are converted here: lane speeds (``"53.125 Gbps"``) to bytes/second, PMA data counters
(4-byte words) to bytes through :class:`agent.infiniband.records.PortCounter`'s scale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from agent.infiniband.parse import IB_DATA_UNIT_BYTES
from agent.infiniband.perfquery import DATA_WORDS, PerfCounters, get_field, parse_fields, parse_uint
from agent.infiniband.records import PortCounter

_WIDTH = re.compile(r"\b(1|2|4|8|12)X\b")
_SPEED = re.compile(r"(?:^|\s)(\d{1,4}(?:\.\d{1,6})?) Gbps\b")
_GUID = re.compile(r"^0x[0-9a-fA-F]{1,16}$")
#: a value libibmad prints for a field it has no name for, or the "none" of extended speeds
_NO_VALUE = ("No Extended Speed", "Extended speed", "undefined")
#: the longest node description kept (IBA NodeDescription is 64 bytes)
DESCRIPTION_MAX = 64
_BITS_PER_BYTE_GBPS = 125_000_000  # 1 Gb/s = 125,000,000 bytes/s


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
        width_active=parse_width(get_field(f, "LinkWidthActive")),
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
    kind = get_field(f, "NodeType")
    num_ports = parse_uint(get_field(f, "NumPorts"))
    local_port = parse_uint(get_field(f, "LocalPort"))
    for name, value in (("NumPorts", num_ports), ("LocalPort", local_port)):
        if value > 255:
            raise ValueError(f"{name} {value} is not an 8-bit value")
    return NodeInfo(
        guid=parse_guid(get_field(f, "Guid")),
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
    return clean_description(get_field(parse_fields(text), "Node Description"))


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
            scale=IB_DATA_UNIT_BYTES if name in DATA_WORDS else 1,
            width=width,
        )
        for name, (raw, width) in sorted(chosen.items())
    )
