"""Connection limits of the metrics server: what is counted, what is closed first.

A connection is *busy* while one of its requests is being answered (from its last header
byte until the handler has produced the response) and *evictable* otherwise: waiting for a
TLS handshake or a request head, idle between keep-alive requests, or delivering a response
to a slow reader. Only busy connections count as requests in flight (``max_requests``);
idle keep-alive connections cost no request slot.

When a new connection would exceed ``max_per_address`` connections from its client address,
or ``max_connections`` in all, the oldest evictable connection (of that address, then of
all) is closed to make room; the new one is refused only when every connection in the way
is busy. One address holding many idle, half-sent or slowly read connections therefore only
ever displaces its own, and a scraper's fresh connection always gets in.

:class:`ConnectionTable` is the bookkeeping alone (no sockets, no clocks); the server calls
it from its one event-loop thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from agent.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """Limits of one server. Times in seconds.

    ``max_requests``: requests answered at once; more get ``503 too many requests``.
    ``max_connections``: open connections in all (file descriptors, memory).
    ``max_per_address``: open connections from one client IP address.
    ``header_timeout``: from accepting a connection (TLS handshake included), or from the
    first byte of a later request on it, until its request head and body have arrived.
    ``idle_timeout``: how long an idle keep-alive connection is kept.
    ``send_timeout``: how long a response may take to be delivered.
    """

    max_requests: int = 40
    max_connections: int = 512
    max_per_address: int = 16
    header_timeout: float = 5.0
    idle_timeout: float = 120.0
    send_timeout: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_connections", "max_per_address"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("header_timeout", "idle_timeout", "send_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")


C = TypeVar("C", bound=Hashable)


class ConnectionTable(Generic[C]):
    """Open connections by client address, evictable ones oldest first."""

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._address: dict[C, str] = {}
        self._per_address: dict[str, int] = {}
        # insertion order is age order: a connection moves to the end when it turns evictable
        self._evictable: OrderedDict[C, None] = OrderedDict()
        self._evictable_by_address: dict[str, OrderedDict[C, None]] = {}

    def __len__(self) -> int:
        return len(self._address)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._address))

    def count(self, address: str) -> int:
        return self._per_address.get(address, 0)

    def admit(self, conn: C, address: str) -> list[C] | None:
        """Add ``conn`` (evictable, newest) and return the connections to close for it, or
        None (and add nothing) when only busy connections stand in the way."""
        victims: list[C] = []
        if self.count(address) >= self.max_per_address:
            mine = self._evictable_by_address.get(address)
            if not mine:
                return None
            victims.append(next(iter(mine)))
        elif len(self._address) >= self.max_connections:
            if not self._evictable:
                return None
            victims.append(next(iter(self._evictable)))
        for victim in victims:
            self.remove(victim)
        self._address[conn] = address
        self._per_address[address] = self.count(address) + 1
        self.evictable(conn)
        return victims

    def busy(self, conn: C) -> None:
        """``conn`` is answering a request: never closed to make room."""
        address = self._address.get(conn)
        if address is None:
            return
        self._evictable.pop(conn, None)
        mine = self._evictable_by_address.get(address)
        if mine is not None:
            mine.pop(conn, None)
            if not mine:
                del self._evictable_by_address[address]

    def evictable(self, conn: C) -> None:
        """``conn`` is waiting, idle or sending: the newest candidate for closing."""
        address = self._address.get(conn)
        if address is None:
            return
        self._evictable.pop(conn, None)
        self._evictable[conn] = None
        mine = self._evictable_by_address.setdefault(address, OrderedDict())
        mine.pop(conn, None)
        mine[conn] = None

    def remove(self, conn: C) -> None:
        """Forget ``conn`` (closed); a second call is a no-op."""
        self.busy(conn)
        address = self._address.pop(conn, None)
        if address is None:
            return
        left = self._per_address[address] - 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]
