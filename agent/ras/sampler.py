"""The ``ras`` sampler: each pass, the RAS endpoints of this node's GPU processes
(:mod:`agent.ras.targets`), a query of the ones this node asks, and what the answers say
(:mod:`agent.ras.track`).

Two halves
    :class:`RasSampler` runs in the agent: it plans the endpoints from the workload
    sampler's processes and the pod watch, reads this node's addresses
    (:mod:`agent.ras.addresses`), keeps the query error counters and logs state changes.
    It never touches a job's bytes: the endpoints it asks go to :class:`RasQuerier`, which
    runs in a supervised child process (:mod:`agent.core.isolation`): it queries every
    endpoint at once, one thread and one deadline each (:mod:`agent.ras.wire`), parses the
    answers (:mod:`agent.ras.parse`), keeps each job's tracker and sends back a small
    summary per job: counts and at most ``max_named`` named ranks, whatever the job's size.
    A child that hangs past its pass deadline is killed (``hung``) and restarted; its
    trackers start again (a job's "counts unchanged" time restarts from 0).

A pass with nothing to ask keeps no child (it is stopped), and a node without a GPU
process or a ``--ras.endpoint`` has ``NoData``.

Named ranks running on this node get their PCI bus id, pod and host pid: a rank is this
node's when its host is one of this node's addresses (or a loopback address: every rank on
one node) or its pod's IP, its pid is a local process's own pid and its NVML device one of
that process's GPUs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from agent.config import RasSettings
from agent.core.ceiling import SHARES, child_ceiling
from agent.core.errors import NoData
from agent.core.isolation import ChildSpec, IsolatedSampler, expect
from agent.core.sysfs import ReadIssue, SysfsReader
from agent.kubernetes.pods import PodIndex
from agent.ras.addresses import NodeAddress, read_node_addresses
from agent.ras.parse import MalformedAnswer, OversizedAnswer, parse_status
from agent.ras.targets import Endpoint, LocalProcess, plan
from agent.ras.track import JobStatus, JobTracker, NamedRank
from agent.ras.wire import QUERY_ERRORS, Hold, QueryError, ReadBudget, query
from agent.workload.records import WorkloadSnapshot

log = logging.getLogger(__name__)

#: seconds the child may take past the query deadline (parsing, tracking, the frame)
PASS_MARGIN_SECONDS = 3.0
#: bytes of the child's memory ceiling each byte of ``--ras.max-answer-bytes`` adds to its
#: floor: the answer read whole, and decoded within agent.ras.parse's budget (6 times its
#: size) with the decoder's transient copies
CEILING_PER_ANSWER_BYTE = 14
#: the stack of each query thread
THREAD_STACK_BYTES = 1 << 20
#: the smallest answer cap a pod's memory limit can bring --ras.max-answer-bytes down to
MIN_ANSWER_CAP = 1 << 20
#: the most one receive adds to an answer's buffer
READ_CHUNK_BYTES = 65536
#: endpoints one pass asks at most (a node hosts a handful of jobs at most); past that, each
#: pass asks the ones asked longest ago, so every endpoint is asked within
#: ceil(endpoints / MAX_QUERIED) passes, and one not asked in a pass is counted (``skipped``)
MAX_QUERIED = 16


# -- the child's answer ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryOutcome:
    """One endpoint's query this pass: ``status`` when it answered, else ``error`` (a reason
    of :data:`~agent.ras.wire.QUERY_ERRORS`) and ``detail`` (this agent's words, never the
    job's bytes). ``seconds``: the query's wall time; ``cpu_seconds``: the CPU the child
    spent on it (talking, parsing, tracking)."""

    endpoint: str
    status: JobStatus | None
    error: str | None = None
    detail: str = ""
    seconds: float | None = None
    cpu_seconds: float = 0.0
    attempts: int = 0


@dataclass(frozen=True, slots=True)
class RasAnswers:
    """What the child sends back: one outcome per endpoint asked."""

    outcomes: tuple[QueryOutcome, ...] = ()
    issues: tuple[ReadIssue, ...] = ()


@dataclass(frozen=True, slots=True)
class RasInputs:
    """What the child needs each pass: the endpoints to ask and this node's addresses;
    ``keep``: the other endpoints still planned (asked in a later pass: their trackers stay)."""

    endpoints: tuple[Endpoint, ...] = ()
    addresses: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()


# -- the agent's snapshot ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RasJob:
    """A queried endpoint: its latest outcome (``status`` None when it failed this pass)."""

    endpoint: str
    namespace: str
    job_name: str
    status: JobStatus | None
    query_seconds: float | None
    errors_total: tuple[tuple[str, int], ...]
    #: answers that needed NCCL 2.28's missing comma repaired, since the agent started
    repaired_total: int = 0
    #: passes that did not ask this endpoint (more than MAX_QUERIED to ask), since it appeared;
    #: ``status`` and ``query_seconds`` are then its latest query's
    skipped_total: int = 0
    #: False until this endpoint is first asked (only ``skipped_total`` means anything)
    asked: bool = True


@dataclass(frozen=True, slots=True)
class RasSnapshot:
    """One pass: every endpoint of this node's GPU processes (and the static ones), the
    queried jobs, this node's addresses."""

    endpoints: tuple[Endpoint, ...] = ()
    jobs: tuple[RasJob, ...] = ()
    addresses: tuple[NodeAddress, ...] = ()
    #: queries answered or failed, and the CPU the querying threads spent on them (talking,
    #: parsing, tracking), since the agent started
    queries_total: int = 0
    query_cpu_seconds_total: float = 0.0
    issues: tuple[ReadIssue, ...] = ()


# -- the child ---------------------------------------------------------------------------------


def local_rank(
    named: NamedRank, processes: Sequence[LocalProcess], addresses: frozenset[str]
) -> NamedRank:
    """``named`` with its PCI bus id, pod and host pid when it runs on this node."""
    loopback = named.host.startswith("127.") or named.host == "::1"
    for p in processes:
        if p.ns_pid != named.pid:
            continue
        here = named.host == p.address if p.address else named.host in addresses or loopback
        if not here:
            continue
        for index, bus in p.gpus:
            if index == named.gpu:
                return replace(
                    named, pci_bus_id=bus, namespace=p.namespace, pod=p.pod, host_pid=p.host_pid
                )
    return named


class RasQuerier:
    """The child's half: asks the endpoints it is given, one thread each, and tracks each
    job's answers (see the module docstring)."""

    name = "ras"

    def __init__(
        self,
        *,
        deadline_seconds: float = 15.0,
        ras_timeout_seconds: int = 5,
        max_answer_bytes: int = 16 << 20,
        lag_answers: int = 4,
        max_named_ranks: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._deadline = deadline_seconds
        self._ras_timeout = ras_timeout_seconds
        self._max_bytes = max_answer_bytes
        self._lag = lag_answers
        self._max_named = max_named_ranks
        self._clock = clock
        self._inputs = RasInputs()
        self._trackers: dict[str, JobTracker] = {}
        #: one answer decoded at a time: the child's memory holds one decoded answer at most
        #: (each bounded by agent.ras.parse), however many jobs answer at once
        self._decoding = threading.Lock()
        #: what the answers read at once may buffer together: two of the largest
        self._budget = ReadBudget(max_answer_bytes + READ_CHUNK_BYTES)

    def accept_inputs(self, value: object) -> None:
        self._inputs = expect(value, RasInputs)

    def _ask(self, ep: Endpoint, addresses: frozenset[str]) -> QueryOutcome:
        cpu0 = time.thread_time()
        label = ep.label
        hold = Hold(self._budget)
        try:
            answer = query(
                ep.host,
                ep.port,
                deadline_seconds=self._deadline,
                max_bytes=self._max_bytes,
                ras_timeout=self._ras_timeout,
                hold=hold,
            )
        except QueryError as exc:
            return QueryOutcome(
                label, None, exc.reason, str(exc), cpu_seconds=time.thread_time() - cpu0
            )
        try:
            with self._decoding:
                parsed = parse_status(answer.data)
        except MalformedAnswer as exc:
            return QueryOutcome(
                label,
                None,
                "oversized" if isinstance(exc, OversizedAnswer) else "malformed",
                str(exc),
                answer.seconds,
                time.thread_time() - cpu0,
                answer.attempts,
            )
        finally:
            hold.release()  # decoded or refused: the answer's buffer goes with this call
        tracker = self._trackers.setdefault(label, JobTracker(self._lag, self._max_named))
        status = tracker.update(parsed, self._clock())
        named = tuple(local_rank(n, ep.processes, addresses) for n in status.named)
        return QueryOutcome(
            label,
            replace(status, named=named),
            seconds=answer.seconds,
            cpu_seconds=time.thread_time() - cpu0,
            attempts=answer.attempts,
        )

    def sample(self) -> RasAnswers:
        endpoints = self._inputs.endpoints[:MAX_QUERIED]
        addresses = frozenset(self._inputs.addresses)
        live = {e.label for e in endpoints} | set(self._inputs.keep)
        for gone in set(self._trackers) - live:
            del self._trackers[gone]
        results: dict[str, QueryOutcome] = {}

        out_of_memory: list[MemoryError] = []

        def run(ep: Endpoint) -> None:
            try:
                results[ep.label] = self._ask(ep, addresses)
            except MemoryError as exc:  # the child's ceiling: the pass ends with it, below
                out_of_memory.append(exc)

        threads = [
            threading.Thread(target=run, args=(ep,), name=f"ras-{ep.label}", daemon=True)
            for ep in endpoints
        ]
        # a thread's stack counts against the child's memory ceiling whole (8 MiB by
        # default): these need little (the decoder's nesting is bounded by the recursion limit)
        before = threading.stack_size(THREAD_STACK_BYTES)
        try:
            for t in threads:
                t.start()
        finally:
            threading.stack_size(before)
        for t in threads:
            t.join(self._deadline + PASS_MARGIN_SECONDS)
        if out_of_memory:
            raise MemoryError(f"a query thread: {out_of_memory[0]!s}"[:200])
        out = []
        for ep in endpoints:
            got = results.get(ep.label)
            if got is None:  # a thread past its own deadline: should not happen; counted
                got = QueryOutcome(ep.label, None, "timeout", "the query thread overran")
            out.append(got)
        return RasAnswers(tuple(out))


def answer_cap(configured: int, pod_limit: int | None) -> int:
    """The largest answer the RAS child reads and decodes: ``--ras.max-answer-bytes``, or
    less when decoding that much would not fit the child's share of the pod's memory limit
    (never below :data:`MIN_ANSWER_CAP`)."""
    if not pod_limit:
        return configured
    room = child_ceiling("ras", pod_limit) - SHARES["ras"].floor
    return max(min(configured, room // CEILING_PER_ANSWER_BYTE), min(configured, MIN_ANSWER_CAP))


def child_sampler(
    *,
    deadline_seconds: float,
    ras_timeout_seconds: int,
    max_answer_bytes: int,
    lag_answers: int,
    max_named_ranks: int,
) -> RasQuerier:
    """The querier as the agent's child process builds it (:mod:`agent.core.isolation`)."""
    return RasQuerier(
        deadline_seconds=deadline_seconds,
        ras_timeout_seconds=ras_timeout_seconds,
        max_answer_bytes=max_answer_bytes,
        lag_answers=lag_answers,
        max_named_ranks=max_named_ranks,
    )


# -- the agent's half --------------------------------------------------------------------------


def rotate(wanted: Sequence[Endpoint], asked_in: dict[str, int]) -> tuple[Endpoint, ...]:
    """The endpoints this pass asks: all of ``wanted`` when they are :data:`MAX_QUERIED` or
    fewer, else the :data:`MAX_QUERIED` asked longest ago (never asked first), in plan order
    among equals; ``asked_in`` maps an endpoint to the pass it was last asked in."""
    if len(wanted) <= MAX_QUERIED:
        return tuple(wanted)
    order = sorted(range(len(wanted)), key=lambda i: (asked_in.get(wanted[i].label, -1), i))
    chosen = set(order[:MAX_QUERIED])
    return tuple(e for i, e in enumerate(wanted) if i in chosen)


class RasSampler:
    """Plans, delegates the queries, keeps the counters (see the module docstring).

    ``workload`` and ``pods`` return the workload sampler's latest snapshot and the pod
    watch's index (None when absent); ``procfs`` is rooted at ``--path.procfs``.
    ``memory_limit``: the pod's, of which the child's memory ceiling is a share; answers are
    capped at what that share can decode (:func:`answer_cap`).
    """

    name = "ras"

    def __init__(
        self,
        settings: RasSettings,
        procfs: SysfsReader,
        workload: Callable[[], WorkloadSnapshot | None],
        pods: Callable[[], PodIndex | None] = lambda: None,
        *,
        isolate: bool | None = None,
        memory_limit: int | None = None,
    ) -> None:
        self.settings = settings
        self._procfs = procfs
        self._workload = workload
        self._pods = pods
        self._next = RasInputs()
        cap = answer_cap(settings.max_answer_bytes, memory_limit)
        if cap < settings.max_answer_bytes:
            log.info(
                "ras: answers over %d bytes are refused (too_large), not %d: decoding more "
                "would not fit the RAS child's share of --agent.memory-limit (%d MiB)",
                cap,
                settings.max_answer_bytes,
                (memory_limit or 0) >> 20,
            )
        kwargs = {
            "deadline_seconds": settings.deadline_seconds,
            "ras_timeout_seconds": settings.ras_timeout_seconds,
            "max_answer_bytes": cap,
            "lag_answers": settings.lag_answers,
            "max_named_ranks": settings.max_named_ranks,
        }
        self._child: IsolatedSampler | None = None
        self._local: RasQuerier | None = None
        if settings.isolate if isolate is None else isolate:
            self._child = IsolatedSampler(
                "ras",
                ChildSpec("agent.ras.sampler:child_sampler", kwargs),
                timeout_seconds=settings.deadline_seconds + PASS_MARGIN_SECONDS,
                inputs=lambda: self._next,
                # its floor admits the largest answer it decodes (agent.ras.parse's budget)
                memory_limit=memory_limit,
                ceiling_extra=CEILING_PER_ANSWER_BYTE * cap,
            )
        else:
            self._local = child_sampler(**kwargs)  # type: ignore[arg-type]
        self._errors: dict[str, dict[str, int]] = {}
        self._repaired: dict[str, int] = {}
        self._skipped: dict[str, int] = {}
        #: endpoint -> the pass it was last asked in (the rotation's order) and its latest job
        self._asked_in: dict[str, int] = {}
        self._latest: dict[str, RasJob] = {}
        self._passes = 0
        self._last: dict[str, str] = {}  # endpoint -> "ok" or the latest error reason
        self._states: dict[tuple[str, str, str], str] = {}
        self._queries = 0
        self._cpu = 0.0

    # the runner's hooks for a sampler run in a child
    def call_deadline_seconds(self) -> float:
        if self._child is not None:
            return self._child.call_deadline_seconds()
        return self.settings.deadline_seconds + PASS_MARGIN_SECONDS

    @property
    def restarts_total(self) -> int | None:
        return self._child.restarts_total if self._child is not None else None

    def close(self) -> None:
        if self._child is not None:
            self._child.close()

    def _query(self, inputs: RasInputs) -> RasAnswers:
        self._next = inputs
        if self._child is not None:
            return expect(self._child.sample(), RasAnswers)
        assert self._local is not None
        self._local.accept_inputs(inputs)
        return self._local.sample()

    def sample(self) -> RasSnapshot:
        s = self.settings
        addresses = read_node_addresses(self._procfs)
        endpoints = plan(
            self._workload(),
            self._pods(),
            leader=s.leader,
            static=s.endpoints,
            node=frozenset(a.address for a in addresses),
        )
        if not endpoints:
            raise NoData("no NCCL process on this node and no --ras.endpoint")
        self._log_states(endpoints)
        self._passes += 1
        wanted = tuple(e for e in endpoints if e.state == "queried")
        asked = rotate(wanted, self._asked_in)
        skipped = tuple(e for e in wanted if e not in asked)
        outcomes: dict[str, QueryOutcome] = {}
        if asked:
            inputs = RasInputs(
                asked, tuple(a.address for a in addresses), tuple(e.label for e in skipped)
            )
            outcomes = {o.endpoint: o for o in self._query(inputs).outcomes}
        elif self._child is not None:
            self._child.close()  # nothing to ask: no second process kept
        jobs = []
        for ep in asked:
            o = outcomes.get(ep.label)
            if o is None:
                continue
            self._queries += 1
            self._cpu += o.cpu_seconds
            counts = self._errors.setdefault(ep.label, dict.fromkeys(QUERY_ERRORS, 0))
            if o.error is not None:
                counts[o.error] = counts.get(o.error, 0) + 1
            if o.status is not None and o.status.repaired:
                self._repaired[ep.label] = self._repaired.get(ep.label, 0) + 1
            self._log_outcome(ep, o)
            self._asked_in[ep.label] = self._passes
            job = RasJob(
                ep.label,
                ep.namespace,
                ep.job_name,
                o.status,
                o.seconds,
                tuple(sorted(counts.items())),
                self._repaired.get(ep.label, 0),
                self._skipped.get(ep.label, 0),
            )
            self._latest[ep.label] = job
            jobs.append(job)
        for ep in skipped:
            n = self._skipped[ep.label] = self._skipped.get(ep.label, 0) + 1
            if n == 1:
                log.warning(
                    "ras: more than %d endpoints to ask: %s is asked in turn, not every pass",
                    MAX_QUERIED,
                    ep.label,
                )
            before = self._latest.get(ep.label)
            if before is not None:
                jobs.append(replace(before, skipped_total=n))
            else:  # not asked yet: no series of its answers, but the skip is counted
                jobs.append(
                    RasJob(ep.label, ep.namespace, ep.job_name, None, None, (), 0, n, asked=False)
                )
        place = {e.label: i for i, e in enumerate(wanted)}
        jobs.sort(key=lambda j: place[j.endpoint])
        live = set(place)
        for table in (self._errors, self._last, self._repaired, self._skipped):
            for gone in set(table) - live:
                del table[gone]
        for gone in set(self._asked_in) - live:
            del self._asked_in[gone]
            self._latest.pop(gone, None)
        return RasSnapshot(
            endpoints=endpoints,
            jobs=tuple(jobs),
            addresses=addresses,
            queries_total=self._queries,
            query_cpu_seconds_total=self._cpu,
        )

    def _log_states(self, endpoints: Sequence[Endpoint]) -> None:
        now = {(e.label, e.namespace, e.job_name): e.state for e in endpoints}
        for key, state in sorted(now.items()):
            if self._states.get(key) != state:
                where = key[0] or "no reachable endpoint"
                log.info("ras: job %s/%s (%s): %s", key[1] or "-", key[2] or "-", where, state)
        self._states = now

    def _log_outcome(self, ep: Endpoint, o: QueryOutcome) -> None:
        outcome = "ok" if o.error is None else o.error
        before = self._last.get(ep.label)
        self._last[ep.label] = outcome
        if outcome == before:
            return
        if o.error is None:
            if before is not None:
                log.info("ras: %s answers again", ep.label)
        else:
            log.warning("ras: %s: %s (%s)", ep.label, o.error, o.detail)
