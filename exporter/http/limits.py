"""Connection limits of the metrics server: what is counted, what is closed first.

A connection is *busy* while one of its requests is being answered (from its last request
byte until the handler has produced the response), *idle* between keep-alive requests, and
*pending* otherwise: waiting for a TLS handshake or a request, or delivering a response to
a slow reader. Only busy connections count as requests in flight (``max_requests``); idle
keep-alive connections cost no request slot.

A new connection from an address that already has ``max_per_address`` connections closes
that address's oldest idle connection; if there is none, it is refused at once (cheaply:
no parser, no timer), unless its complete request head is already waiting in the socket,
in which case the address's oldest pending connection is closed for it: a client that
asks at once is preferred to one that holds a half-sent request. A new connection that
would exceed ``max_connections`` in all closes the oldest non-busy connection of the
address holding the most connections, if that address holds more than the newcomer's
would (else the newcomer's address's own oldest idle one, else it is refused): addresses
holding as many as each other never take each other's connections, so a flood from many
addresses at the cap does not churn. Nothing busy is ever closed to make room.

So one address holding many idle, half-sent or slowly read connections only ever displaces
its own, costs the server a refused ``accept`` per retry once at its cap, and a scraper at
another address always gets in. :class:`ConnectionTable` is the bookkeeping alone (no
sockets, no clocks); the server calls it from its one event-loop thread.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from agent.core.errors import ConfigError


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

BUSY, IDLE, PENDING = "busy", "idle", "pending"


class ConnectionTable(Generic[C]):
    """Open connections by client address; idle and pending ones each oldest first."""

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self._address: dict[C, str] = {}
        self._state: dict[C, str] = {}
        self._per_address: dict[str, int] = {}
        # insertion order is age order: a connection moves to the end when its state changes
        self._queues: dict[tuple[str, str], OrderedDict[C, None]] = {}

    def __len__(self) -> int:
        return len(self._address)

    def __iter__(self) -> Iterator[C]:
        return iter(list(self._address))

    def count(self, address: str) -> int:
        return self._per_address.get(address, 0)

    def admit(self, conn: C, address: str, *, has_request: bool = False) -> list[C] | None:
        """Add ``conn`` (pending, newest) and return the connections to close for it, or
        None (and add nothing) when it is refused. ``has_request``: its complete request
        head has already arrived."""
        victim: C | None = None
        if self.count(address) >= self.max_per_address:
            victim = self._oldest(address, IDLE)
            if victim is None and has_request:
                victim = self._oldest(address, PENDING)
            if victim is None:
                return None
        elif len(self._address) >= self.max_connections:
            # only from an address that would still hold more than this one: a flood of
            # equals at the cap replaces its own connections (or is refused), never each
            # other's, so it cannot churn every connection and keep a newcomer waiting
            mine = self.count(address) + 1
            heaviest = sorted(self._per_address, key=self._per_address.__getitem__, reverse=True)
            for other in heaviest:
                if self._per_address[other] <= mine:
                    break
                victim = self._oldest(other, IDLE) or self._oldest(other, PENDING)
                if victim is not None:
                    break
            if victim is None:
                victim = self._oldest(address, IDLE)
            if victim is None:
                return None
        if victim is not None:
            self.remove(victim)
        self._address[conn] = address
        self._per_address[address] = self.count(address) + 1
        self._set(conn, PENDING)
        return [] if victim is None else [victim]

    def busy(self, conn: C) -> None:
        """``conn`` is answering a request: never closed to make room."""
        self._set(conn, BUSY)

    def idle(self, conn: C) -> None:
        """``conn`` waits for its next keep-alive request: the first to go."""
        self._set(conn, IDLE)

    def pending(self, conn: C) -> None:
        """``conn`` waits for a request or delivers a response."""
        self._set(conn, PENDING)

    def state(self, conn: C) -> str | None:
        return self._state.get(conn)

    def remove(self, conn: C) -> None:
        """Forget ``conn`` (closed); a second call is a no-op."""
        address = self._address.pop(conn, None)
        if address is None:
            return
        self._unqueue(conn, address)
        del self._state[conn]
        left = self._per_address[address] - 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]

    def _oldest(self, address: str, state: str) -> C | None:
        queue = self._queues.get((address, state))
        return next(iter(queue)) if queue else None

    def _set(self, conn: C, state: str) -> None:
        address = self._address.get(conn)
        if address is None:
            return
        self._unqueue(conn, address)
        self._state[conn] = state
        if state != BUSY:
            self._queues.setdefault((address, state), OrderedDict())[conn] = None

    def _unqueue(self, conn: C, address: str) -> None:
        old = self._state.get(conn)
        if old is None or old == BUSY:
            return
        queue = self._queues[(address, old)]
        del queue[conn]
        if not queue:
            del self._queues[(address, old)]
