"""Which credential checks the metrics server runs: bcrypt for credentials it has not seen
succeed, bounded so that wrong passwords cannot be used to deny service.

A request whose ``Authorization`` header matches credentials verified before is answered on
the event loop and never reaches this gate (``BasicAuth.check_cached``); nor does one with
no or malformed credentials (``401`` at once), nor ``/healthz``. What is left needs bcrypt
(50-250 ms of CPU at the usual cost), and that is what a password-guessing or flooding
client asks for. The gate decides in constant time, before anything is queued:

- **per client address** (IPv4 address, IPv6 /64: ``agent.core.clientaddr``): at most one
  check queued or running at a time, and a budget of failed checks, ``failures_burst`` at
  once and then one per ``failure_interval`` seconds (a token bucket that only failures
  drain: a client with the right password is never slowed by its own successes);
- **in all**: at most ``max_checks`` checks queued or running (the server runs them one at
  a time on one worker thread: a guessing client gets one core at most, and the checks of
  different addresses wait behind at most ``max_checks - 1`` others).

A refused check is decided at once and answered a second later (the connection can be
closed for a newcomer meanwhile, so a flood on keep-alive connections gets one answer a
second on each, not as many as the event loop can write): ``429`` with ``Retry-After`` when
the address spent its budget or already has a check running, ``503`` with ``Retry-After``
when the checks in all are at their cap. Neither counts against ``--web.max-requests``, and
neither costs a worker thread. The gate remembers at most ``max_addresses`` addresses (the
least recently failing forgotten first); an address forgotten has a full budget again,
which only the cap in all then bounds.

:class:`AuthGate` is the bookkeeping alone (no sockets; an injectable clock); the server
calls it from its event-loop thread.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from agent.core.errors import ConfigError

#: refusals, as counted in ``fabricscope_http_connections_closed_total{reason}``
THROTTLED = "auth_throttled"
BUSY = "auth_busy"


@dataclass(frozen=True, slots=True)
class AuthLimits:
    """Bounds on bcrypt checks. Times in seconds.

    ``failures_burst``: failed checks one address may make before it is slowed down.
    ``failure_interval``: after that, one more failed check per this many seconds.
    ``max_checks``: checks queued or running at once, all addresses together.
    ``max_addresses``: addresses whose failures are remembered.
    """

    failures_burst: int = 5
    failure_interval: float = 2.0
    max_checks: int = 8
    max_addresses: int = 4096

    def __post_init__(self) -> None:
        for name in ("failures_burst", "max_checks", "max_addresses"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.failure_interval > 0:
            raise ConfigError(f"failure_interval must be positive, got {self.failure_interval}")


@dataclass(slots=True)
class _Budget:
    tokens: float
    at: float


class AuthGate:
    """Admits bcrypt checks per the module doc. Not thread-safe: one caller thread."""

    def __init__(
        self, limits: AuthLimits | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or AuthLimits()
        self._clock = clock
        #: addresses with failures not yet earned back, least recently failing first
        self._budgets: OrderedDict[str, _Budget] = OrderedDict()
        #: addresses with a check queued or running
        self._checking: set[str] = set()

    @property
    def checking(self) -> int:
        """Checks queued or running now."""
        return len(self._checking)

    def admit(self, address: str) -> tuple[str, int] | None:
        """None when a check for ``address`` may start now (then call :meth:`done` when it
        ends), else (the refusal, :data:`THROTTLED` or :data:`BUSY`; whole seconds after
        which asking again may succeed)."""
        if address in self._checking:
            return THROTTLED, 1
        tokens = self._tokens(address)
        if tokens < 1.0:
            return THROTTLED, max(1, math.ceil((1.0 - tokens) * self.limits.failure_interval))
        if len(self._checking) >= self.limits.max_checks:
            return BUSY, 1
        self._checking.add(address)
        return None

    def done(self, address: str, *, ok: bool) -> None:
        """The check admitted for ``address`` ended; a failure spends one of its budget."""
        self._checking.discard(address)
        if ok:
            return
        now = self._clock()
        budget = self._budgets.pop(address, None)
        tokens = self._refill(budget, now) if budget is not None else self.limits.failures_burst
        self._budgets[address] = _Budget(tokens - 1.0, now)
        while len(self._budgets) > self.limits.max_addresses:
            self._budgets.popitem(last=False)

    def _tokens(self, address: str) -> float:
        budget = self._budgets.get(address)
        if budget is None:
            return float(self.limits.failures_burst)
        tokens = self._refill(budget, self._clock())
        if tokens >= self.limits.failures_burst:
            del self._budgets[address]  # all earned back: as good as never seen
        return tokens

    def _refill(self, budget: _Budget, now: float) -> float:
        earned = max(0.0, now - budget.at) / self.limits.failure_interval
        return min(float(self.limits.failures_burst), budget.tokens + earned)
