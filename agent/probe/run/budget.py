"""The probes' GPU-time budget: a token bucket of GPU-seconds (:class:`GpuBudget`) and the
estimates a probe is checked against before it runs (:class:`ProbeCosts`: what a probe of
the same scope cost last time)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: a first probe of a kind is budgeted at this many seconds per GPU
INITIAL_ESTIMATE_SECONDS = 10.0


class GpuBudget:
    """A token bucket of GPU-seconds: refilled at ``fraction x gpus`` per second, holding at
    most ``window_seconds`` of that (full at start). :meth:`allows` an estimate up to the
    credit; :meth:`spend` may take it below zero, which later probes then wait out."""

    def __init__(
        self,
        fraction: float,
        gpus: int,
        window_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = fraction * max(gpus, 1)
        self.capacity = self.rate * window_seconds
        self._clock = clock
        self._credit = self.capacity
        self._at = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._credit = min(self.capacity, self._credit + self.rate * max(0.0, now - self._at))
        self._at = now

    def credit(self) -> float:
        with self._lock:
            self._refill()
            return self._credit

    def allows(self, estimate: float) -> bool:
        with self._lock:
            self._refill()
            return estimate <= self._credit

    def spend(self, gpu_seconds: float) -> None:
        with self._lock:
            self._refill()
            self._credit -= gpu_seconds


class ProbeCosts:
    """GPU-seconds the last probe of each scope (``intra``, ``pair:<kind>``) cost: the
    estimate of its next run. A scope not run yet is estimated at
    :data:`INITIAL_ESTIMATE_SECONDS` (at most the probe's timeout) per GPU."""

    def __init__(self, timeout_seconds: float) -> None:
        self._first = min(timeout_seconds, INITIAL_ESTIMATE_SECONDS)
        self._cost: dict[str, float] = {}
        self._lock = threading.Lock()

    def estimate(self, scope: str, gpus: int) -> float:
        with self._lock:
            cost = self._cost.get(scope)
        if cost is not None:
            return cost
        return self._first * gpus

    def note(self, scope: str, gpu_seconds: float) -> None:
        with self._lock:
            self._cost[scope] = gpu_seconds
