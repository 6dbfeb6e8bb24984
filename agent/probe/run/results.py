"""What the probe service reports, and the ledger it keeps them in.

The latest run per (collective, peer, GPU, peer GPU) is kept, with one record per message
size; intra-node runs have an empty peer and GPU. Runs older than ``max_age_seconds``
(default: 3 rounds for node pairs, 3 intervals for intra-node) are dropped, so the series
of a peer that left, or of a probe that stopped running, go away instead of going stale.
Counters: runs by collective and outcome (``ok`` or a failure reason), skips by reason,
GPU-seconds spent. The ledger logs state changes (a probe starting to fail, succeeding
again, a spell of skips for one reason), not every run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.config import ProbeSettings
from agent.core.sysfs import ReadIssue
from agent.kubernetes.allocation import UNKNOWN_REASONS
from agent.probe.measure.records import REASONS, ProbeRecord
from agent.probe.rendezvous.server import RendezvousStats

log = logging.getLogger(__name__)

#: outcome of a run, the ``reason`` label of ``runs_total``
RUN_REASONS = ("ok", *REASONS)
#: why a probe did not run: which GPUs pods hold could not be established (no GPU is taken;
#: the reason is counted in ``allocation_unknown_total``), over budget, GPUs busy or locked,
#: NVML could not tell which GPUs are busy (its child crashed, hung or errs: no GPU is
#: taken), no partner this round (or fewer than two local GPUs for an intra-node probe),
#: the partner declined the offer
SKIP_REASONS = (
    "allocation_unknown",
    "budget",
    "gpu_busy",
    "gpu_unknown",
    "no_partner",
    "peer_declined",
)


@dataclass(frozen=True, slots=True)
class ProbeRun:
    """The latest run of one probe: ``collective`` between this node's ``gpu`` and ``peer``'s
    ``peer_gpu`` (all three empty for an intra-node probe). ``finished_at``: unix seconds;
    ``duration_seconds``: wall time from launch to exit; ``reason``: None when every size
    measured correctly, else the first failure's reason; ``records``: one per size."""

    collective: str
    peer: str
    gpu: str
    peer_gpu: str
    finished_at: float
    duration_seconds: float
    reason: str | None
    records: tuple[ProbeRecord, ...]

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.collective, self.peer, self.gpu, self.peer_gpu)


@dataclass(frozen=True, slots=True)
class ProbeSnapshot:
    """What the probe sampler returns: the latest runs (aged), counters, rendezvous stats.

    ``runs_total``: (collective, reason, count), reason ``ok`` or a failure reason.
    ``skipped_total``: (reason, count) for every reason of :data:`SKIP_REASONS`.
    ``gpu_seconds_total``: GPU time spent by probes. ``members``: nodes in the membership
    (0 without one). ``rendezvous``: None when this node answers no offers.
    ``allocation_unknown_total``: (reason, count) for every reason of
    :data:`agent.kubernetes.allocation.UNKNOWN_REASONS`: the times no GPU was taken because
    which GPUs pods hold could not be established.
    """

    runs: tuple[ProbeRun, ...] = ()
    runs_total: tuple[tuple[str, str, int], ...] = ()
    skipped_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in SKIP_REASONS)
    gpu_seconds_total: float = 0.0
    members: int = 0
    rendezvous: RendezvousStats | None = None
    issues: tuple[ReadIssue, ...] = ()
    allocation_unknown_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in UNKNOWN_REASONS)


def device_label(records: Sequence[ProbeRecord], rank: int) -> str | None:
    """The CUDA device (= NVML index) ``rank`` used, as the ranks exchange it; None when no
    record names it (gloo, or the group never formed)."""
    for rec in records:
        if len(rec.ranks) > rank and rec.ranks[rank][1] is not None:
            return str(rec.ranks[rank][1])
    return None


def run_reason(records: Sequence[ProbeRecord]) -> str | None:
    """A run's outcome: None when every size measured correctly, else the first reason."""
    if not records:
        return "crashed"
    return next((r.reason for r in records if r.reason is not None), None)


class ProbeLedger:
    """The service's accounts (see the module doc); thread-safe, no I/O but logging.
    ``clock``: unix time, for ages."""

    def __init__(self, settings: ProbeSettings, clock: Callable[[], float]) -> None:
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str, str, str], ProbeRun] = {}
        self._runs_total: dict[tuple[str, str], int] = {}
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._allocation_unknown = dict.fromkeys(UNKNOWN_REASONS, 0)
        self._allocation_state: str | None = None
        self._gpu_seconds = 0.0
        self._members_count = 0
        self._issues: tuple[ReadIssue, ...] = ()
        self._last_skip: str | None = None

    def skip(self, reason: str, why: str, *args: object) -> None:
        """Count a skip; log it when skipping for this reason starts (a probe running, or a
        skip for another reason, ends a spell), at debug while it goes on."""
        with self._lock:
            self._skipped[reason] += 1
            first = self._last_skip != reason
            self._last_skip = reason
        log.log(
            logging.INFO if first else logging.DEBUG, "probe skipped (%s): " + why, reason, *args
        )

    def allocation(self, unknown: str | None) -> None:
        """Whether the GPUs pods hold are known now (None) or why not; an unknown is counted
        (no GPU is taken for it). Logged when the state changes, not on every check."""
        with self._lock:
            if unknown is not None:
                self._allocation_unknown[unknown] += 1
            previous, self._allocation_state = self._allocation_state, unknown
        if unknown == previous:
            return
        if unknown is not None:
            log.warning(
                "probe: cannot establish which GPUs pods hold (%s); probing none until it can",
                unknown,
            )
        elif previous is not None:
            log.info("probe: the GPUs pods hold are known again; probing idle ones")

    def spent(self, gpu_seconds: float) -> None:
        """Add GPU time probes spent."""
        with self._lock:
            self._gpu_seconds += gpu_seconds

    def membership(self, members: int, issues: tuple[ReadIssue, ...]) -> None:
        """The membership's size and its source's problems, as last read."""
        with self._lock:
            self._members_count = members
            self._issues = issues

    def record(self, run: ProbeRun) -> None:
        outcome = run.reason or "ok"
        with self._lock:
            previous = self._runs.get(run.key)
            self._runs[run.key] = run
            counter = (run.collective, outcome)
            self._runs_total[counter] = self._runs_total.get(counter, 0) + 1
            self._last_skip = None
            self._age_out(self._clock())
        where = f"{run.collective} {run.peer or 'intra-node'}"
        if run.gpu or run.peer_gpu:
            where += f" gpu {run.gpu} -> {run.peer_gpu or '?'}"
        was_ok = previous is None or previous.reason is None
        if run.reason is not None:
            detail = next((r.error.detail for r in run.records if r.error is not None), "")
            log.log(
                logging.WARNING if was_ok else logging.DEBUG,
                "probe %s failed (%s): %s",
                where,
                run.reason,
                detail,
            )
        elif not was_ok:
            log.info("probe %s succeeds again", where)
        else:
            busbw = max((r.busbw_bytes_per_second or 0.0 for r in run.records), default=0.0)
            log.debug("probe %s ok: busbw up to %.3g B/s", where, busbw)

    def _max_age(self, peer: str) -> float:
        s = self._settings
        if s.max_age_seconds is not None:
            return s.max_age_seconds
        if peer:
            return 3 * s.round_seconds
        return 3 * max(s.intra_seconds, s.round_seconds)

    def _age_out(self, now: float) -> None:
        """Drop runs older than their max age (the caller holds the lock)."""
        for key in [
            k for k, r in self._runs.items() if now - r.finished_at > self._max_age(r.peer)
        ]:
            del self._runs[key]

    def snapshot(self, rendezvous: RendezvousStats | None) -> ProbeSnapshot:
        """The latest runs and counters, with the rendezvous server's stats."""
        with self._lock:
            self._age_out(self._clock())
            runs = tuple(sorted(self._runs.values(), key=lambda r: r.key))
            totals = tuple(sorted((c, r, n) for (c, r), n in self._runs_total.items()))
            return ProbeSnapshot(
                runs=runs,
                runs_total=totals,
                skipped_total=tuple(sorted(self._skipped.items())),
                gpu_seconds_total=self._gpu_seconds,
                members=self._members_count,
                rendezvous=rendezvous,
                issues=self._issues,
                allocation_unknown_total=tuple(sorted(self._allocation_unknown.items())),
            )
