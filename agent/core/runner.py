"""The runner: the one place that calls samplers, times them, enforces timeouts and keeps
the latest state of each.

Each sampler runs on its own schedule in a background thread. Its calls run in a pass thread
of its own, kept from one pass to the next (a thread started for every pass cost about 0.6
ms of CPU each on the development machine, about 0.4 millicores for the agent's samplers at
15 s: :class:`_PassThread`), and a call is abandoned (not killed: Python cannot) when it
exceeds the timeout; until that hung call returns, no new call of the same sampler starts,
so a hung read costs at most one thread, never a pile of them. Scrapes read
:meth:`Runner.statuses` and never touch the hardware.

A sampler that runs its work in a child process (:mod:`agent.core.isolation`) kills that child
itself at its deadline and fails the pass with :class:`~agent.core.errors.SamplerFailure`
(``crashed``, ``hung``, ``backoff``), each counted under its own reason. Such a sampler has
``call_deadline_seconds()``: the runner waits that long plus :data:`SELF_TIMED_MARGIN`
instead of its timeout, so the sampler's own verdict is the one counted. Its optional
``restarts_total`` (children started to replace a failed one) is copied into the status.

The runner starts no garbage collection of its own. Collecting after every pass (so that what
a pass leaves in reference cycles, pyroute2's netlink messages and errors, goes with it rather
than waiting in the oldest generation for the collector's threshold) was tried and measured:
the agent's main process spent 7.1-9.6 millicores against 3.9-6.3 without it
(``bench/bench_sizing.py``, five pairs side by side on the development machine), and once a
minute cost as much: py-spy put a third of the main process's busy samples in those
collections. Its long soaks grew no slower with it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from agent.core.errors import NoData, SamplerFailure
from agent.core.procstat import ProcessStats
from agent.core.sampler import Sampler, Snapshot

log = logging.getLogger(__name__)

#: reasons counted in ``SamplerStatus.errors_total``: the last four are a sampler's child
#: process dying in a pass, killed for not answering in time, ended at its memory ceiling
#: (:mod:`agent.core.ceiling`), and not restarted yet
CHILD_REASONS = ("crashed", "hung", "memory_ceiling", "backoff")
ERROR_REASONS = ("exception", "timeout", "still_running", *CHILD_REASONS)
#: seconds the runner waits beyond a self-timed sampler's own deadline
SELF_TIMED_MARGIN = 1.0


@dataclass(frozen=True, slots=True)
class SamplerSpec:
    """How to run one sampler. Times in seconds."""

    sampler: Sampler
    interval_seconds: float = 15.0
    timeout_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class SamplerStatus:
    """What the runner knows about one sampler after its latest attempt.

    ``snapshot`` is the latest successful pass's state, or ``None`` if the latest attempt
    failed, timed out or found no hardware (so stale data is never exported as fresh).
    ``hardware_present`` is False when the latest attempt raised ``NoData``.
    """

    name: str
    attempts_total: int = 0
    success: bool = False
    hardware_present: bool = False
    snapshot: Snapshot | None = None
    duration_seconds: float | None = None
    #: CPU the finished passes' own threads spent in this process (a pass abandoned at its
    #: timeout is not counted)
    cpu_seconds_total: float = 0.0
    last_success_timestamp_seconds: float | None = None
    errors_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in ERROR_REASONS)
    read_errors_total: tuple[tuple[str, int], ...] = ()
    generation: int = 0
    #: children started to replace a crashed or hung one (None: not run in a child)
    child_restarts_total: int | None = None
    #: the sampler's running child process as of its latest pass (None: none runs)
    child: ProcessStats | None = None

    def error_count(self, reason: str) -> int:
        return dict(self.errors_total).get(reason, 0)


def _bump(
    counts: tuple[tuple[str, int], ...], key: str, by: int = 1
) -> tuple[tuple[str, int], ...]:
    d = dict(counts)
    d[key] = d.get(key, 0) + by
    return tuple(sorted(d.items()))


class _PassThread:
    """One sampler's pass thread: runs the calls handed to :meth:`submit`, one at a time,
    until :meth:`close`. ``busy`` is true from a submit until its call has returned (a hung
    call keeps it busy: the runner then skips passes as ``still_running``)."""

    def __init__(self, name: str) -> None:
        self._cv = threading.Condition()
        self._job: tuple[Callable[[], None], threading.Event] | None = None
        self._closed = False
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=f"sample-{name}", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> threading.Event:
        """Run ``job`` on the thread; the event is set when it has returned."""
        done = threading.Event()
        with self._cv:  # the runner submits only when not busy, from the sampler's schedule
            self._job, self.busy = (job, done), True
            self._cv.notify()
        return done

    def close(self) -> None:
        """End the thread once it is idle (at once, or when a hung call returns)."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._job is None and not self._closed:
                    self._cv.wait()
                if self._job is None:
                    return
                job, done = self._job
                self._job = None
            try:
                job()  # catches every Exception itself (the runner's ``call``)
            except BaseException:  # SystemExit or the like from a sampler: this thread lives on
                log.exception("a pass raised past the runner")
            finally:
                with self._cv:
                    self.busy = False
                done.set()
                # the call's box (a snapshot, an exception) is not kept until the next pass
                del job, done


@dataclass(slots=True)
class _Slot:
    spec: SamplerSpec
    status: SamplerStatus
    worker: _PassThread | None = None
    failing_paths: frozenset[str] = field(default_factory=frozenset)
    last_outcome: str = ""


#: outcomes after which a good pass is a recovery
_FAILED = frozenset(
    {"timeout", "still_running", "exception", "backoff", "crashed", "hung", "memory_ceiling"}
)


def found(snapshot: object) -> str:
    """What a pass found, for the log: the snapshot's own ``describe()`` where it has one,
    else the length of each of its non-empty collections (``2 devices``), and its
    unreadable files."""
    describe = getattr(snapshot, "describe", None)
    if callable(describe):
        return str(describe())
    parts: list[str] = []
    issues = 0
    if dataclasses.is_dataclass(snapshot) and not isinstance(snapshot, type):
        for f in dataclasses.fields(snapshot):
            value = getattr(snapshot, f.name)
            if f.name == "issues" and isinstance(value, tuple | list):
                issues = len(value)
            elif isinstance(value, tuple | list | dict | frozenset | set) and value:
                parts.append(f"{len(value)} {f.name.replace('_', ' ')}")
    text = ", ".join(parts) if parts else "nothing found"
    if issues:
        text += f" ({issues} unreadable or malformed, logged below)"
    return text


class Runner:
    """Runs samplers on their schedules and keeps the latest status of each.

    ``on_update(name)`` is called (from the sampler's thread) after every attempt, so a
    consumer such as the exporter can re-render that sampler's series once per change
    rather than once per scrape.
    """

    def __init__(
        self,
        specs: Sequence[SamplerSpec],
        *,
        on_update: Callable[[str], None] | None = None,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        announce: bool = False,
    ) -> None:
        """``announce``: say at INFO what each sampler's first pass found or why it has
        nothing, and hardware appearing or going (the agent); else at DEBUG (one-shot
        commands that print their own result: topo, snapshot)."""
        self._announce = logging.INFO if announce else logging.DEBUG
        names = [s.sampler.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate sampler names: {names}")
        self._slots = {s.sampler.name: _Slot(s, SamplerStatus(s.sampler.name)) for s in specs}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._on_update = on_update
        self._wall = wall_clock
        self._mono = monotonic

    @property
    def names(self) -> list[str]:
        return sorted(self._slots)

    def statuses(self) -> dict[str, SamplerStatus]:
        with self._lock:
            return {name: slot.status for name, slot in sorted(self._slots.items())}

    def status(self, name: str) -> SamplerStatus:
        with self._lock:
            return self._slots[name].status

    # -- scheduling --------------------------------------------------------------------

    def start(self) -> None:
        """Start one scheduling thread per sampler. Each runs its first pass at once."""
        for name, slot in self._slots.items():
            t = threading.Thread(
                target=self._loop, args=(slot,), name=f"sampler-{name}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the schedules, then let samplers that hold resources (NVML's XID thread)
        release them through their optional ``close()``."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        self._close_workers()
        for slot in self._slots.values():
            close = getattr(slot.spec.sampler, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("closing sampler %s failed", slot.spec.sampler.name)

    def run_once(self, names: Iterable[str] | None = None) -> dict[str, SamplerStatus]:
        """Run every sampler (or those of ``names`` that exist) once, in parallel, each under
        its timeout; return all statuses."""
        chosen = self._slots if names is None else [n for n in names if n in self._slots]
        threads = [
            threading.Thread(target=self.run_sampler, args=(name,), daemon=True) for name in chosen
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if not self._threads:  # no schedule runs: nothing will use the pass threads again
            self._close_workers()
        return self.statuses()

    def _close_workers(self) -> None:
        for slot in self._slots.values():
            worker, slot.worker = slot.worker, None
            if worker is not None:
                worker.close()

    def _loop(self, slot: _Slot) -> None:
        interval = slot.spec.interval_seconds
        next_at = self._mono()
        while not self._stop.is_set():
            self.run_sampler(slot.spec.sampler.name)
            next_at += interval
            now = self._mono()
            if next_at < now:  # fell behind (a hung call): skip missed slots, keep the phase
                next_at += ((now - next_at) // interval + 1) * interval
            self._stop.wait(next_at - now)

    # -- one attempt -------------------------------------------------------------------

    def run_sampler(self, name: str) -> SamplerStatus:
        """Run one attempt of sampler ``name`` now (blocking up to its timeout)."""
        slot = self._slots[name]
        spec = slot.spec
        if slot.worker is not None and slot.worker.busy:
            self._finish(slot, "still_running", None, None, None)
            return slot.status

        box: dict[str, object] = {}
        limit = spec.timeout_seconds
        deadline_of = getattr(spec.sampler, "call_deadline_seconds", None)
        if callable(deadline_of):
            limit = float(deadline_of()) + SELF_TIMED_MARGIN

        def call() -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                box["snapshot"] = spec.sampler.sample()
            except NoData as exc:
                box["nodata"] = exc
            except SamplerFailure as exc:
                box["failure"] = exc
            except Exception as exc:  # the runner is the one place that isolates failures
                box["error"] = exc
            box["duration"] = time.perf_counter() - t0
            box["cpu"] = time.thread_time() - c0  # the thread runs this pass alone

        if slot.worker is None:
            slot.worker = _PassThread(name)
        if not slot.worker.submit(call).wait(limit):
            self._finish(slot, "timeout", None, float(limit), None)
            return slot.status
        try:
            self._outcome(slot, box)
        finally:
            # an exception in ``box`` holds its traceback, which holds ``call``'s frame, which
            # holds ``box``: a reference cycle per failed pass, left to the cycle collector
            box.clear()
        return slot.status

    def _outcome(self, slot: _Slot, box: dict[str, object]) -> None:
        """What a finished pass left in ``box``, recorded."""
        duration = box.get("duration")
        assert isinstance(duration, float)
        cpu = box.get("cpu")
        assert isinstance(cpu, float)
        if "failure" in box:
            failure = box["failure"]
            assert isinstance(failure, SamplerFailure)
            reason = failure.reason if failure.reason in ERROR_REASONS else "exception"
            self._finish(slot, reason, None, duration, failure, cpu=cpu)
        elif "error" in box:
            exc = box["error"]
            assert isinstance(exc, Exception)
            self._finish(slot, "exception", None, duration, exc, cpu=cpu)
        elif "nodata" in box:
            self._finish(slot, "nodata", None, duration, box["nodata"], cpu=cpu)  # type: ignore[arg-type]
        else:
            snap = box["snapshot"]
            self._finish(slot, "ok", snap, duration, None, cpu=cpu)  # type: ignore[arg-type]

    def _finish(
        self,
        slot: _Slot,
        outcome: str,
        snapshot: Snapshot | None,
        duration: float | None,
        exc: BaseException | None,
        *,
        cpu: float = 0.0,
    ) -> None:
        """Record an attempt; ``cpu``: what its pass thread spent (0 for a pass not run or
        abandoned)."""
        name = slot.spec.sampler.name
        with self._lock:
            st = slot.status
            restarts = getattr(slot.spec.sampler, "restarts_total", None)
            child = getattr(slot.spec.sampler, "child_stats", None)
            st = replace(
                st,
                attempts_total=st.attempts_total + 1,
                generation=st.generation + 1,
                cpu_seconds_total=st.cpu_seconds_total + cpu,
                child_restarts_total=restarts if isinstance(restarts, int) else None,
                child=child if isinstance(child, ProcessStats) else None,
            )
            if outcome == "ok":
                assert snapshot is not None
                counts = st.read_errors_total
                for issue in snapshot.issues:
                    counts = _bump(counts, issue.reason)
                st = replace(
                    st,
                    success=True,
                    hardware_present=True,
                    snapshot=snapshot,
                    duration_seconds=duration,
                    last_success_timestamp_seconds=self._wall(),
                    read_errors_total=counts,
                )
            elif outcome == "nodata":
                st = replace(
                    st,
                    success=True,
                    hardware_present=False,
                    snapshot=None,
                    duration_seconds=duration,
                    last_success_timestamp_seconds=self._wall(),
                )
            else:
                st = replace(
                    st,
                    success=False,
                    snapshot=None,
                    duration_seconds=duration,
                    errors_total=_bump(st.errors_total, outcome),
                )
            slot.status = st
            previous = slot.last_outcome
            slot.last_outcome = outcome
        self._log_transition(slot, previous, outcome, snapshot, exc)
        if self._on_update is not None:
            try:
                self._on_update(name)
            except Exception:
                log.exception("update callback failed for sampler %s", name)

    def _log_transition(
        self,
        slot: _Slot,
        previous: str,
        outcome: str,
        snapshot: Snapshot | None,
        exc: BaseException | None,
    ) -> None:
        """Log state changes only: a sampler starting to fail or recovering, a file starting
        or ceasing to fail, and every child process lost (crashed or hung: at most one per
        restart backoff: crashed, hung or at its memory ceiling). Never one line per pass."""
        name = slot.spec.sampler.name
        if outcome != previous:
            if outcome == "ok" and previous in _FAILED:
                log.info("sampler %s recovered: %s", name, found(snapshot))
            elif outcome == "ok":  # the first pass, or hardware that appeared
                log.log(
                    self._announce,
                    "sampler %s: %s%s",
                    name,
                    "" if not previous else "hardware appeared: ",
                    found(snapshot),
                )
            elif outcome == "nodata":
                # at INFO once (the first pass, or the hardware going): why it has nothing
                log.log(self._announce, "sampler %s: nothing to sample: %s", name, exc)
            elif outcome == "timeout":
                log.error("sampler %s timed out after %.1fs", name, slot.spec.timeout_seconds)
            elif outcome == "still_running":
                log.error("sampler %s: previous call still hung; skipping this pass", name)
            elif outcome == "exception":
                log.error("sampler %s failed: %r", name, exc, exc_info=exc)
            elif outcome == "backoff":
                log.debug("sampler %s: %s", name, exc)
        if outcome in ("crashed", "hung", "memory_ceiling"):  # every time: each is a child lost
            log.error("sampler %s %s: %s", name, outcome, exc)
        if snapshot is None:
            return
        now_failing = {i.path: i for i in snapshot.issues}
        for path in sorted(set(now_failing) - slot.failing_paths):
            issue = now_failing[path]
            log.warning(
                "sampler %s: cannot use %s (%s: %s); that series is absent",
                name,
                path,
                issue.reason,
                issue.detail,
            )
        for path in sorted(slot.failing_paths - set(now_failing)):
            log.info("sampler %s: %s readable again", name, path)
        slot.failing_paths = frozenset(now_failing)
