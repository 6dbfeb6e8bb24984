"""What ``perfquery`` (infiniband-diags) prints, parsed: pure functions, no I/O.

A port's Performance Management Agent (PMA) keeps two sets of counters. **PortCounters**
(``perfquery LID PORT``) holds the error counters at 4, 8 or 16 bits, PortXmitWait at 32 and
the data and packet counters at 32; the hardware stops each at the maximum of its width
(it saturates) until someone clears it. **PortCountersExtended** (``perfquery -x LID
PORT``) holds 64-bit data and packet counters and, on PMAs that advertise it, 64-bit copies
of the error counters, PortXmitWait and QP1Dropped too.

Which of those the PMA really keeps is in its **ClassPortInfo**, which perfquery reads
before every query and prints in the block's header line, ``# Port extended counters: Lid 2
port 1 (CapMask: 0x1200 CapMask2: 0x0000000)``. The bits (libibmad ``iba_types.h``; IBA 1.2.1
errata and 1.3):

- CapabilityMask bit 8 AllPortSelect; **bit 9** PortCountersExtended supported (the IETF
  layout, unicast and multicast packet counters included); **bit 10** the same without the
  unicast/multicast counters (``NoIETF``); bit 11 samples only; **bit 12** PortCounters'
  PortXmitWait is supported (perfquery prints 0 for it otherwise); bit 14 RS-FEC counters;
  bit 15 QP1Dropped supported.
- CapabilityMask2 (27 bits; perfquery prints it shifted down to bit 0): bit 0 PM key;
  **bit 1 IsAdditionalPortCountersExtendedSupported**: the error counters, PortXmitWait and
  QP1Dropped of PortCountersExtended are real 64-bit counters.

perfquery up to rdma-core 2x printed the extended error fields whatever CapabilityMask2 said
(the public netdata issue 2620 capture of a ConnectX HCA shows them, zero, under ``CapMask2:
0x0000000``): there they are reserved bytes, not counters. So a field is only taken from an
answer whose header advertises it; an answer whose header names no capability yields its
data counters only.

Every parser reads the first block, ignores lines it does not know and raises ``ValueError``
with a one-line reason for what it cannot use; every pattern is linear and the input is
bounded by the reader (:mod:`agent.core.tools`), so hostile output costs at most its size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.infiniband.parse import PMA_WIDTHS

#: longest field name libibmad prints ("McastPkeyTrapSuppressionEnabled", "Node Description")
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9 ]{0,47}):\.*(.*)$")
_UINT = re.compile(r"^(0x[0-9a-fA-F]{1,16}|\d{1,20})$")
_HEADER = re.compile(
    r"^# Port (extended )?counters: .{0,80}? port (\d{1,3})"
    r"(?: \(CapMask: (0x[0-9A-Fa-f]{1,4})(?: CapMask2: (0x[0-9A-Fa-f]{1,8})\)?)?)?"
)

#: ClassPortInfo CapabilityMask bits (host order, as perfquery prints them)
CAP_ALL_PORT_SELECT = 1 << 8
CAP_EXT_WIDTH = 1 << 9
CAP_EXT_WIDTH_NOIETF = 1 << 10
CAP_XMIT_WAIT = 1 << 12
CAP_QP1_DROP = 1 << 15
#: CapabilityMask2: the extended error counters, PortXmitWait and QP1Dropped are 64-bit
CAP2_ADDITIONAL_EXTENDED = 1 << 1


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


def get_field(fields: dict[str, str], name: str) -> str:
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


@dataclass(frozen=True, slots=True)
class PmaCapabilities:
    """A PMA's ClassPortInfo capability masks, as perfquery's header prints them;
    ``cap_mask2`` is ``None`` where the header names none (an older perfquery, or a header
    cut short)."""

    cap_mask: int
    cap_mask2: int | None

    @property
    def extended(self) -> bool:
        """PortCountersExtended is supported (IETF or NoIETF layout)."""
        return bool(self.cap_mask & (CAP_EXT_WIDTH | CAP_EXT_WIDTH_NOIETF))

    @property
    def extended_ietf(self) -> bool:
        """... with its unicast and multicast packet counters."""
        return bool(self.cap_mask & CAP_EXT_WIDTH)

    @property
    def xmit_wait(self) -> bool:
        """PortCounters' PortXmitWait is a counter (else perfquery prints 0 for it)."""
        return bool(self.cap_mask & CAP_XMIT_WAIT)

    @property
    def additional_extended(self) -> bool:
        """The extended error counters, PortXmitWait and QP1Dropped are 64-bit."""
        return self.cap_mask2 is not None and bool(self.cap_mask2 & CAP2_ADDITIONAL_EXTENDED)


def parse_header(text: str) -> tuple[bool, int, PmaCapabilities | None] | None:
    """The first ``# Port [extended ]counters: ... port N (CapMask: ...)`` line of a
    perfquery answer: (extended, port, capabilities or None); ``None`` without one."""
    for line in text.splitlines()[:8]:
        m = _HEADER.match(line[:512])
        if m is None:
            continue
        caps = None
        if m.group(3) is not None:
            caps = PmaCapabilities(
                int(m.group(3), 16), int(m.group(4), 16) if m.group(4) is not None else None
            )
        return m.group(1) is not None, int(m.group(2)), caps
    return None


#: perfquery field -> the kernel's counters/ file name for the same PMA counter, so counters
#: read with perfquery carry the local sysfs counters' names, widths and units
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
#: PortCountersExtended's counters by what advertises them: the four data counters (bit 9 or
#: 10), the unicast/multicast ones (bit 9), the rest (CapabilityMask2 bit 1)
EXT_DATA = frozenset({"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"})
EXT_IETF = frozenset(
    {
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
    }
)
#: the counters PortCounters' CounterSelect (bits 0-15) and CounterSelect2 (perfquery's mask
#: bit 16) clear: IBA PortCounters, the order perfquery's reset mask uses
RESET_BITS: dict[str, int] = {
    "symbol_error": 0,
    "link_error_recovery": 1,
    "link_downed": 2,
    "port_rcv_errors": 3,
    "port_rcv_remote_physical_errors": 4,
    "port_rcv_switch_relay_errors": 5,
    "port_xmit_discards": 6,
    "port_xmit_constraint_errors": 7,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 9,
    "excessive_buffer_overrun_errors": 10,
    "VL15_dropped": 11,
    "port_xmit_data": 12,
    "port_rcv_data": 13,
    "port_xmit_packets": 14,
    "port_rcv_packets": 15,
    "port_xmit_wait": 16,
}
#: PortCounters' data and packet counters are 32 bits wide
BASIC_32 = EXT_DATA
#: the data counters, which count 4-byte words
DATA_WORDS = frozenset({"port_xmit_data", "port_rcv_data"})


@dataclass(frozen=True, slots=True)
class PerfCounters:
    """One ``perfquery`` answer: the port it is about, the PMA's capabilities its header
    named, and its counters by kernel name with the width in bits each has in the attribute
    that carried it (``None``: unknown). Fields the capabilities do not vouch for are left
    out (see the module docstring)."""

    port_select: int
    extended: bool
    values: tuple[tuple[str, int, int | None], ...]  # (name, raw, width bits)
    caps: PmaCapabilities | None = None
    #: fields of no known counter beyond :data:`MAX_UNKNOWN_FIELDS`, left out
    dropped: int = 0

    def by_name(self) -> dict[str, tuple[int, int | None]]:
        return {name: (raw, width) for name, raw, width in self.values}


def _vouched(name: str, extended: bool, caps: PmaCapabilities | None) -> bool:
    """Whether an answer whose header named ``caps`` really carries counter ``name``."""
    if not extended:
        return name != "port_xmit_wait" or caps is None or caps.xmit_wait
    if name in EXT_DATA:
        return True
    if caps is None:
        return False
    if name in EXT_IETF:
        return caps.extended_ietf
    return caps.additional_extended


#: fields of no known counter kept per answer (each is a series: the tool's output is as
#: untrusted as a log, and 64 KiB of it can name thousands of fields)
MAX_UNKNOWN_FIELDS = 16


def parse_perfquery(text: str, *, extended: bool) -> PerfCounters:
    """``perfquery LID PORT`` (``extended=False``: PortCounters, PMA widths) or
    ``perfquery -x LID PORT`` (PortCountersExtended: 64 bits, each field only where the
    header's capabilities vouch for it). Unknown fields are kept under their perfquery name,
    lower-cased, width unknown: the first :data:`MAX_UNKNOWN_FIELDS` in the order printed,
    the rest counted in ``dropped``; one spelled like a known counter's name never
    replaces it, and of two that spell one name the first holds."""
    f = parse_fields(text)
    port_select = parse_uint(get_field(f, "PortSelect"))
    header = parse_header(text)
    caps = header[2] if header is not None else None
    values: list[tuple[str, int, int | None]] = []
    unknown: set[str] = set()
    known = frozenset(PERFQUERY_NAMES.values())
    dropped = 0
    for field, raw in f.items():
        if field in _NOT_COUNTERS:
            continue
        name = PERFQUERY_NAMES.get(field)
        value = parse_uint(raw)
        if name is None:
            lowered = re.sub(r"[^a-z0-9_]", "_", field.lower())[:48]
            if lowered in unknown or lowered in known:
                continue
            if len(unknown) >= MAX_UNKNOWN_FIELDS:
                dropped += 1
                continue
            unknown.add(lowered)
            values.append((lowered, value, None))
            continue
        if not _vouched(name, extended, caps):
            continue
        if extended:
            width: int | None = 64
        elif name in BASIC_32:
            width = 32
        else:
            width = PMA_WIDTHS.get(name)
        values.append((name, value, width))
    if not any(name in PERFQUERY_NAMES.values() for name, _, _ in values):
        raise ValueError("no PMA counter in perfquery output")
    return PerfCounters(port_select, extended, tuple(sorted(values)), caps, dropped)


def split_blocks(text: str, *, limit: int = 256) -> list[str]:
    """The ``# ...``-headed blocks of a tool's output, in order (``perfquery -l LID 1,5``
    prints one block per port, each under its own header); text before the first header is
    dropped. At most ``limit`` blocks (a switch has at most 254 ports): more is malformed
    output, ``ValueError``."""
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
    answer's own ``PortSelect``, never the order asked), each block parsed as
    :func:`parse_perfquery` parses one answer (its own capabilities, its own cap on unknown
    fields). A block that does not parse raises ``ValueError``; so does a port answered
    twice."""
    out: dict[int, PerfCounters] = {}
    for block in split_blocks(text):
        counters = parse_perfquery(block, extended=extended)
        if counters.port_select in out:
            raise ValueError(f"port {counters.port_select} answered twice")
        out[counters.port_select] = counters
    if not out:
        raise ValueError("no perfquery block in the output")
    return out


def reset_mask(names: set[str] | frozenset[str]) -> int:
    """perfquery's reset mask (``perfquery -R LID PORT MASK``) that clears exactly ``names``
    in PortCounters; raises ``ValueError`` for a counter PortCounters cannot clear."""
    mask = 0
    for name in names:
        bit = RESET_BITS.get(name)
        if bit is None:
            raise ValueError(f"PortCounters has no clear bit for {name}")
        mask |= 1 << bit
    return mask


def near_saturation(raw: int, width: int) -> bool:
    """Whether a ``width``-bit counter is close enough to its maximum to clear it, by
    OpenSM perfmgr's rule (``counter_overflow_*`` in osm_perfmgr.c): 4-bit counters at 10 or
    more, the others within a quarter of their maximum."""
    top = (1 << width) - 1
    if width <= 4:
        return raw >= 10
    return raw >= top - top // 4
