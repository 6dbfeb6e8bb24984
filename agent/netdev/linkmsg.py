"""RTM_GETLINK on the wire: the question (one interface by name, or a dump of all) and the
six attributes the netdev sampler reads out of each answer, with ``struct``.

Why not pyroute2's ``ifinfmsg`` for the answers: it decodes every attribute of a link (about
45, among them the nested per-family configuration) into objects that each keep themselves in
a list (reference cycles to break after reading), and looks each one up by a scan: 0.55 ms an
answer on the development machine, with the attributes the sampler never reads mapped to
nothing still 0.5 ms. Read here, an answer costs a few microseconds (the whole question and
answer about 0.06 ms). pyroute2 keeps its part: ``setns`` for a socket made in a named
namespace, and its ``NetlinkError`` for the kernel's errors.

The layout (``linux/netlink.h``, ``linux/rtnetlink.h``, ``linux/if_link.h``): each message a
16-byte ``nlmsghdr`` (length, type, flags, sequence, port), a link's body a 16-byte
``ifinfomsg`` (family, type, index, flags, change) and then attributes, each a 4-byte header
(length including the header, type; the top two bits of the type are flags) and its payload,
padded to 4 bytes. ``NLMSG_ERROR`` carries the negative errno; ``NLMSG_DONE`` ends a dump.
The kernel never writes a message past its datagram, but a reader that trusts the lengths
reads out of bounds or loops: every length is checked against what is left, and a message
that does not fit is refused (``ValueError``), as is an attribute that does not.

Standard library only.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWLINK = 16
RTM_GETLINK = 18
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300

IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_OPERSTATE = 16
IFLA_STATS64 = 23
IFLA_CARRIER = 33
IFLA_CARRIER_CHANGES = 35
#: the flag bits of an attribute's type (NLA_F_NESTED, NLA_F_NET_BYTEORDER)
NLA_TYPE_MASK = 0x3FFF

NLMSGHDR = struct.Struct("=IHHII")
IFINFOMSG = struct.Struct("=BxHiII")
NLAHDR = struct.Struct("=HH")
U32 = struct.Struct("=I")
I32 = struct.Struct("=i")

#: ``IF_OPER_*`` (``linux/if.h``) in the spelling pyroute2 and sysfs use
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")
#: ``struct rtnl_link_stats64`` in the kernel's order; kernels since 4.6 and 5.19 append
#: ``rx_nohandler`` and ``rx_otherhost_dropped``, which the sampler does not export
STATS64_NAMES = (
    "rx_packets",
    "tx_packets",
    "rx_bytes",
    "tx_bytes",
    "rx_errors",
    "tx_errors",
    "rx_dropped",
    "tx_dropped",
    "multicast",
    "collisions",
    "rx_length_errors",
    "rx_over_errors",
    "rx_crc_errors",
    "rx_frame_errors",
    "rx_fifo_errors",
    "rx_missed_errors",
    "tx_aborted_errors",
    "tx_carrier_errors",
    "tx_fifo_errors",
    "tx_heartbeat_errors",
    "tx_window_errors",
    "rx_compressed",
    "tx_compressed",
)
_STATS64 = struct.Struct("=" + "Q" * len(STATS64_NAMES))
#: the attributes read, by type, under the names pyroute2 gives them
_READ = {
    IFLA_IFNAME: "IFLA_IFNAME",
    IFLA_MTU: "IFLA_MTU",
    IFLA_OPERSTATE: "IFLA_OPERSTATE",
    IFLA_STATS64: "IFLA_STATS64",
    IFLA_CARRIER: "IFLA_CARRIER",
    IFLA_CARRIER_CHANGES: "IFLA_CARRIER_CHANGES",
}


def question(seq: int, ifname: str | None) -> bytes:
    """``RTM_GETLINK`` for the link named ``ifname`` (``None``: a dump of every link)."""
    body = IFINFOMSG.pack(0, 0, 0, 0, 0)
    flags = NLM_F_REQUEST
    if ifname is None:
        flags |= NLM_F_DUMP
    else:
        name = ifname.encode() + b"\0"
        body += NLAHDR.pack(4 + len(name), IFLA_IFNAME) + name + b"\0" * (-len(name) % 4)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETLINK, flags, seq, 0) + body


@dataclass(frozen=True, slots=True)
class Answer:
    """One message of a datagram: ``kind`` "link" (``link`` holds it, as
    :class:`agent.netdev.stats.LinkMessage` reads it), "error" (``error``: the errno, 0 for an
    acknowledgement), "done", or "other" (a type the sampler does not ask for)."""

    seq: int
    kind: str
    link: dict[str, object] | None = None
    error: int = 0


def answers(data: bytes) -> Iterator[Answer]:
    """The messages of one datagram, in order. Raises ValueError on a message or an attribute
    whose length does not fit (what came before it has been yielded)."""
    offset, end = 0, len(data)
    while end - offset >= NLMSGHDR.size:
        length, kind, _flags, seq, _port = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size or length > end - offset:
            raise ValueError(f"netlink message of {length} bytes, {end - offset} left")
        body = offset + NLMSGHDR.size
        if kind == RTM_NEWLINK:
            yield Answer(seq, "link", link=_link(data, body, offset + length))
        elif kind == NLMSG_ERROR:
            if length < NLMSGHDR.size + I32.size:
                raise ValueError(f"netlink error message of {length} bytes")
            yield Answer(seq, "error", error=-I32.unpack_from(data, body)[0])
        elif kind == NLMSG_DONE:
            yield Answer(seq, "done")
        else:
            yield Answer(seq, "other")
        offset += (length + 3) & ~3
    if offset < end and any(data[offset:]):
        raise ValueError(f"{end - offset} bytes after the last netlink message")


def _link(data: bytes, start: int, end: int) -> dict[str, object]:
    if end - start < IFINFOMSG.size:
        raise ValueError(f"link message body of {end - start} bytes")
    _family, _type, index, _flags, _change = IFINFOMSG.unpack_from(data, start)
    out: dict[str, object] = {"index": index}
    offset = start + IFINFOMSG.size
    while end - offset >= NLAHDR.size:
        length, kind = NLAHDR.unpack_from(data, offset)
        if length < NLAHDR.size or length > end - offset:
            raise ValueError(f"link attribute {kind & NLA_TYPE_MASK} of {length} bytes")
        name = _READ.get(kind & NLA_TYPE_MASK)
        if name is not None:  # the other ~40 attributes of a link are passed over unsliced
            payload = data[offset + NLAHDR.size : offset + length]
            if name == "IFLA_IFNAME":
                out[name] = payload.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif name in ("IFLA_MTU", "IFLA_CARRIER_CHANGES"):
                out[name] = _u32(payload)
            elif name == "IFLA_CARRIER":
                out[name] = payload[0] if payload else None
            elif name == "IFLA_OPERSTATE":
                code = payload[0] if payload else None
                out[name] = (
                    OPERSTATES[code] if code is not None and code < len(OPERSTATES) else f"{code}"
                )
            else:
                out[name] = _stats64(payload)
        offset += (length + 3) & ~3
    return out


def _u32(payload: bytes) -> int | None:
    return U32.unpack_from(payload)[0] if len(payload) >= U32.size else None


def _stats64(payload: bytes) -> dict[str, int]:
    if len(payload) >= _STATS64.size:
        return dict(zip(STATS64_NAMES, _STATS64.unpack_from(payload), strict=True))
    whole = len(payload) // 8  # a shorter struct than any kernel writes: what it holds
    return dict(zip(STATS64_NAMES, struct.unpack_from(f"={whole}Q", payload), strict=False))


__all__ = [
    "IFLA_STATS64",
    "NLMSG_DONE",
    "NLMSG_ERROR",
    "OPERSTATES",
    "RTM_GETLINK",
    "RTM_NEWLINK",
    "STATS64_NAMES",
    "Answer",
    "answers",
    "question",
]
