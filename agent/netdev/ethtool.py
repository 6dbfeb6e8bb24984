"""Driver statistics through the ethtool ioctl (``ETHTOOL_GSSET_INFO``, ``ETHTOOL_GSTRINGS``,
``ETHTOOL_GSTATS``), with pyroute2's ctypes structures, for the few statistics a sampler
keeps out of the thousands a driver reports.

pyroute2's ``IoctlEthtool.get_statistics`` asks the driver for the names again at every
``change_ifname`` and decodes each name a byte at a time in Python: 9 µs a statistic on the
development machine (a real veth with 64 queues, 577 statistics: 5.2 ms a call). An mlx5
port reports a set per ring and per priority besides its port-wide set (the kernel's mlx5
``counters.rst``: 102 names per ring, 13 per priority), thousands with one ring per CPU, for
every port of a node at every pass. Here each pass makes the same three ioctls, compares a
digest of the names' raw bytes with the last pass's, decodes and matches them only when they
changed (a driver reload, ``ethtool -L``), and reads only the kept values. The buffers'
ctypes classes are made once per count.

The kernel writes as many strings or values as the driver counts *at that call* into the
caller's buffer, whatever size the caller gave; a count that grows between the size query
and the read would run past the buffer. Both buffers are allocated with headroom
(:data:`HEADROOM`), and an answer whose count is not the one asked for is refused (the
caller records an issue; the next pass asks again).

Imports pyroute2's ethtool ioctl module (via :mod:`agent.netdev.netlink`, as ``eth``), ctypes
and the standard library only.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import hashlib
import re
import socket
from dataclasses import dataclass

from agent.netdev.netlink import NoSuchDevice, NotSupportedError
from agent.netdev.netlink import pyroute2_ethtool as eth

#: extra entries in each buffer beyond the count the driver gave, against a count that grows
#: between the size query and the read
HEADROOM = 256


class CountChangedError(OSError):
    """The driver's statistics count changed between two ioctls of one read."""


@dataclass(frozen=True, slots=True)
class Names:
    digest: bytes  # of the names as the kernel wrote them (count x 32 bytes: 160 KB for 5,000)
    include: re.Pattern[str]
    kept: tuple[tuple[int, str], ...]  # (index, name) of the names include fully matches


#: each interface's names as last read, by interface name (kept by the caller across sockets)
KnownNames = dict[str, Names]


class EthtoolStatistics:
    """An ``AF_INET`` datagram socket for ethtool ioctls (in the namespace it was created in);
    ``names``: each interface's names as last read (a caller's, kept across sockets; a new
    one when not given). One thread at a time."""

    def __init__(self, names: KnownNames | None = None) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._names: KnownNames = {} if names is None else names

    def close(self) -> None:
        self._sock.close()

    def statistics(self, ifname: str, include: re.Pattern[str]) -> list[tuple[str, int]]:
        """The ``(name, value)`` of each statistic of ``ifname`` whose name ``include`` fully
        matches, in the driver's order. Raises :class:`NoSuchDevice` (no such interface),
        :class:`NotSupportedError` (the driver has no statistics), :class:`CountChangedError`, or
        ``OSError``."""
        name = _ifr_name(ifname)
        count = self._count(ifname, name)
        strings_type, stats_type = _buffer_types(count)
        strings = strings_type(cmd=eth.ETHTOOL_GSTRINGS, string_set=eth.ETH_SS_STATS, len=count)
        self._ioctl(ifname, name, "gstrings", strings)
        if strings.len != count:
            raise CountChangedError(errno.EAGAIN, f"{count} statistics, then {strings.len} names")
        raw = ctypes.string_at(ctypes.addressof(strings.strings), count * eth.ETH_GSTRING_LEN)
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        known = self._names.get(ifname)
        if known is None or known.digest != digest or known.include is not include:
            known = Names(digest, include, _kept(raw, count, include))
            self._names[ifname] = known
        stats = stats_type(cmd=eth.ETHTOOL_GSTATS, size=count)
        self._ioctl(ifname, name, "gstats", stats)
        if stats.size != count:
            raise CountChangedError(errno.EAGAIN, f"{count} names, then {stats.size} values")
        data = stats.data
        return [(n, int(data[i])) for i, n in known.kept]

    def _count(self, ifname: str, name: bytes) -> int:
        info = eth.EthtoolSsetInfo(
            cmd=eth.ETHTOOL_GSSET_INFO, reserved=0, sset_mask=1 << eth.ETH_SS_STATS
        )
        req = eth.IfReqSsetInfo()
        req.ifr_name = (ctypes.c_uint8 * eth.IFNAMSIZ).from_buffer_copy(name)
        req.info = ctypes.pointer(info)
        self._call(ifname, req)
        if not info.sset_mask & (1 << eth.ETH_SS_STATS) or info.data == 0:
            raise NotSupportedError(ifname)
        return int(info.data)

    def _ioctl(self, ifname: str, name: bytes, field: str, buf: ctypes.Structure) -> None:
        req = eth.IfReq()
        req.ifr_name = (ctypes.c_uint8 * eth.IFNAMSIZ).from_buffer_copy(name)
        setattr(req, field, ctypes.cast(ctypes.byref(buf), ctypes.c_void_p))
        self._call(ifname, req)

    def _call(self, ifname: str, req: ctypes.Structure) -> None:
        try:
            fcntl.ioctl(self._sock, eth.SIOCETHTOOL, req)
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:
                raise NotSupportedError(ifname) from None
            if exc.errno == errno.ENODEV:
                raise NoSuchDevice(ifname) from None
            raise


@functools.lru_cache(maxsize=16)  # a node's ports share a few counts
def _buffer_types(count: int) -> tuple[type[ctypes.Structure], type[ctypes.Structure]]:
    """The GSTRINGS and GSTATS structures for ``count`` entries and the headroom: made once
    per count (each is a new ctypes class, which only the cyclic collector frees)."""
    return eth.generate_EthtoolGstrings(count + HEADROOM), eth.generate_EthtoolGStats(
        count + HEADROOM
    )


def _ifr_name(ifname: str) -> bytes:
    encoded = ifname.encode()
    if not encoded or len(encoded) >= eth.IFNAMSIZ or b"\0" in encoded:
        raise NoSuchDevice(ifname)  # the kernel has no interface of that name
    return encoded.ljust(eth.IFNAMSIZ, b"\0")


def _kept(raw: bytes, count: int, include: re.Pattern[str]) -> tuple[tuple[int, str], ...]:
    kept = []
    for i in range(count):
        entry = raw[i * eth.ETH_GSTRING_LEN : (i + 1) * eth.ETH_GSTRING_LEN]
        text = entry.split(b"\0", 1)[0].decode("utf-8", "replace")
        if include.fullmatch(text):
            kept.append((i, text))
    return tuple(kept)


__all__ = ["HEADROOM", "CountChangedError", "EthtoolStatistics", "KnownNames", "Names"]
