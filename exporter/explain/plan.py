"""The run's limits: a whole-run deadline every request is held to, the request and byte counts,
and progress lines on stderr for long runs; the query plan that keeps each query's answer and
length bounded for a large job (the job's instances or pods in groups of at most
``max_names``); and the cycle collector paused while a run holds its answers.

The per-request timeout (``--prometheus.timeout``) bounds one query; the deadline bounds the
run: each request gets the smaller of its timeout and the time left, and a request that
would start after the deadline fails at once with a one-line error saying how far it got.
"""

from __future__ import annotations

import functools
import gc
import threading
import time
from collections.abc import Callable, Sequence
from typing import ParamSpec, TextIO, TypeVar

from exporter.explain.client import PrometheusError

#: instances (or pods) one query names at most. Prometheus evaluates a range function series
#: by series (a query's peak samples are one series', whatever the group), and what costs it
#: is each series a selector reads, once per period however the job is cut; a group only
#: bounds an answer's size and a query's length, and every request costs a little more on
#: both sides. So a job of up to 1,024 nodes is one query per check: 122 queries for the
#: 1,024-node benchmark job, where groups of 64 made 1,712 (docs/performance.md)
MAX_NAMES_PER_QUERY = 1024


class RunLedger:
    """Thread-safe: the run's deadline, what it has asked, and progress on ``stream`` every
    ``every`` seconds once the run is ``every`` seconds old (a short run prints nothing)."""

    def __init__(
        self,
        deadline_seconds: float,
        *,
        stream: TextIO | None = None,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_seconds = deadline_seconds
        self._clock = clock
        self._start = clock()
        self._stream = stream
        self._every = every
        self._last_print = self._start
        self._lock = threading.Lock()
        self.requests = 0
        self.wire_bytes = 0
        self.body_bytes = 0

    def elapsed(self) -> float:
        return self._clock() - self._start

    def timeout(self, per_request: float) -> float:
        """The timeout for the next request; PrometheusError once the deadline passed."""
        left = self.deadline_seconds - self.elapsed()
        if left <= 0:
            with self._lock:
                n = self.requests
            raise PrometheusError(
                f"the run's deadline of {self.deadline_seconds:g}s passed after {n} queries "
                "(a large job or a slow Prometheus? --deadline raises it)"
            )
        return min(per_request, left)

    def done(self, wire: int, body: int) -> None:
        """One answered request: ``wire`` bytes received, ``body`` after decompression."""
        now = self._clock()
        with self._lock:
            self.requests += 1
            self.wire_bytes += wire
            self.body_bytes += body
            due = self._stream is not None and now - self._last_print >= self._every
            if due:
                self._last_print = now
            line = (
                f"fabricscope explain: {self.requests} queries, "
                f"{self.wire_bytes / 1e6:.1f} MB received ({self.body_bytes / 1e6:.1f} MB "
                f"uncompressed), {now - self._start:.0f}s of {self.deadline_seconds:g}s\n"
            )
        if due and self._stream is not None:
            self._stream.write(line)
            self._stream.flush()


def groups(names: Sequence[str], max_names: int = MAX_NAMES_PER_QUERY) -> list[tuple[str, ...]]:
    """``names`` sorted and cut into groups of at most ``max_names`` (one group when few)."""
    if max_names < 1:
        raise ValueError("max_names must be at least 1")
    ordered = sorted(names)
    return [tuple(ordered[i : i + max_names]) for i in range(0, len(ordered), max_names)] or [()]


_P = ParamSpec("_P")
_R = TypeVar("_R")


def without_cycle_collector(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run with Python's cycle collector paused (as it was again after).

    A run holds what it parsed from the answers until it has compared them: a 1,024-node
    job's are 650,000 label sets and as many figures, every one of them a tracked object,
    and the collector walks all of them each time the young ones outnumber its threshold.
    On 40 answers of 12,288 ports each (that job's size) it made 52 full collections, 63 %
    of the CPU; that job's answer took 12.1 CPU-seconds with it running, 5.4 with it paused
    (docs/performance.md). Everything a run makes is freed by reference counting; what cycles it may
    leave (an exception and its frames) are collected once the collector runs again."""

    @functools.wraps(fn)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return paused
