"""What a job's RAS answers mean, one answer after another.

One answer is a snapshot NCCL itself warns against trusting alone: collectives are fast and
outpace the gather, so ranks of a healthy job often differ by an operation or two ("as long
as the counts increase across repeated queries" the difference is harmless), and an "OK"
answer says nothing about whether the counts still move. :class:`JobTracker` therefore keeps,
per job, the previous answer's counts and, per rank, how many answers in a row it has been
behind, and derives:

``ranks`` (responsive / unresponsive / dead)
    Each GPU of the job once (a process's host, pid and NVML device; a rank of several
    communicators counts once): *dead* when any communicator lists it as considered dead,
    *unresponsive* when its process sent no data to this gather, else *responsive* (it
    answered, or it was reachable and simply not a member of a communicator in
    initialisation or teardown).
``mismatched_communicators``, ``count_spread``
    Communicators whose answering ranks have launched different numbers of collectives, and
    the largest gap (operations, all collective types together) between a communicator's
    most and least advanced answering rank.
``counts_unchanged_seconds``
    Seconds since any rank's counts last changed (a rank present in two answers with other
    counts, or a communicator not seen before). Counted from the first answer the tracker
    saw: a job first met stalled reads 0 then grows. Counts that stop on *every* rank while
    ranks lag or stop answering are a hang; counts that stop with every rank level may be
    one long collective or a pause between epochs (docs/throughput.md).
``lagging`` ranks
    A rank behind its communicator's most advanced rank in ``lag_answers`` answers in a
    row. A straggler that keeps up most of the time is behind in one answer, not in four.
``named``
    The ranks worth a name, at most ``max_named``: dead, then unresponsive, then lagging
    (furthest behind first), each with the rank number of the largest communicator it is in
    (its world rank in the usual layout), host, pid and NVML device.

Pure apart from the state it keeps; ``now`` (monotonic seconds) comes from the caller.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agent.ras.parse import ERROR_KINDS, RasAnswer, RasCommunicator, error_kind

RANK_STATES: tuple[str, ...] = ("dead", "responsive", "unresponsive")
NAMED_STATES: tuple[str, ...] = ("dead", "unresponsive", "lagging")
#: answers in a row a rank must be behind to be named lagging
DEFAULT_LAG_ANSWERS = 4
#: ranks named per job
DEFAULT_MAX_NAMED = 8

#: a GPU of the job: (host, pid, NVML device), and for ranks RAS could not place (host
#: "unknown") the communicator and rank too, so two of them never merge
GpuKey = tuple[str, int, int, str, int]


@dataclass(frozen=True, slots=True)
class NamedRank:
    """A rank worth naming. ``behind``: collectives behind its communicator's most advanced
    rank (lagging ranks; 0 otherwise); ``answers``: answers in a row it has been behind.
    The rest is filled in by the sampler when the rank runs on this node: its PCI bus id,
    pod and the pid as the host sees it."""

    rank: int
    state: str
    host: str
    pid: int
    gpu: int
    behind: int = 0
    answers: int = 0
    pci_bus_id: str = ""
    namespace: str = ""
    pod: str = ""
    host_pid: int | None = None


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One job as of its latest answer (see the module docstring)."""

    nccl_version: str
    ranks: tuple[tuple[str, int], ...]
    communicators: int
    mismatched_communicators: int
    count_spread: int
    counts_unchanged_seconds: float
    async_error_ranks: tuple[tuple[str, int], ...]
    collection_seconds: float
    timeouts: int
    named: tuple[NamedRank, ...] = ()
    #: the answer needed NCCL 2.28's missing comma repaired (agent/ras/parse.py)
    repaired: bool = False

    def rank_count(self, state: str) -> int:
        return dict(self.ranks).get(state, 0)


def gpu_key(comm: RasCommunicator, rank: int, host: str, pid: int, gpu: int) -> GpuKey:
    if host == "unknown" or pid < 0:
        return (host, pid, gpu, comm.key, rank)
    return (host, pid, gpu, "", 0)


@dataclass(slots=True)
class JobTracker:
    """Keeps one job's previous counts and lag streaks; :meth:`update` with each answer."""

    lag_answers: int = DEFAULT_LAG_ANSWERS
    max_named: int = DEFAULT_MAX_NAMED
    _counts: dict[tuple[str, int], tuple[tuple[str, int], ...]] = field(default_factory=dict)
    _streak: dict[tuple[str, int], int] = field(default_factory=dict)
    _changed_at: float | None = None

    def update(self, answer: RasAnswer, now: float) -> JobStatus:
        counts: dict[tuple[str, int], tuple[tuple[str, int], ...]] = {}
        streak: dict[tuple[str, int], int] = {}
        known_comms = {k for k, _ in self._counts}
        moved = self._changed_at is None
        state: dict[GpuKey, str] = {}
        world: dict[GpuKey, tuple[int, str, int]] = {}  # -> (-size, comm key, rank)
        where: dict[GpuKey, tuple[str, int, int]] = {}  # -> (host, pid, gpu)
        errors: dict[GpuKey, str] = {}
        lag: dict[GpuKey, tuple[int, int]] = {}  # -> (behind, answers in a row)
        mismatched = spread = 0

        def seen(key: GpuKey, comm: RasCommunicator, rank: int, at: tuple[str, int, int]) -> None:
            order = (-comm.size, comm.key, rank)
            if key not in world or order < world[key]:
                world[key] = order
            where[key] = at

        for comm in answer.communicators:
            if comm.ranks and comm.key not in known_comms:
                moved = True
            totals = [r.total for r in comm.ranks]
            top = max(totals, default=0)
            low = min(totals, default=0)
            spread = max(spread, top - low)
            if len({r.counts for r in comm.ranks}) > 1:
                mismatched += 1
            for r in comm.ranks:
                key = gpu_key(comm, r.rank, r.host, r.pid, r.nvml_dev)
                seen(key, comm, r.rank, (r.host, r.pid, r.nvml_dev))
                state.setdefault(key, "responsive")
                kind = error_kind(r.async_error)
                if kind is not None:
                    errors[key] = kind
                slot = (comm.key, r.rank)
                counts[slot] = r.counts
                before = self._counts.get(slot)
                if before is not None and before != r.counts:
                    moved = True
                if len(comm.ranks) > 1 and r.total < top:
                    n = streak[slot] = self._streak.get(slot, 0) + 1
                    behind = top - r.total
                    if n >= self.lag_answers and behind > lag.get(key, (0, 0))[0]:
                        lag[key] = (behind, n)
            for m in comm.missing:
                key = gpu_key(comm, m.rank, m.host, m.pid, m.nvml_dev)
                seen(key, comm, m.rank, (m.host, m.pid, m.nvml_dev))
                if m.considered_dead:
                    state[key] = "dead"
                elif m.unresponsive and state.get(key) != "dead":
                    state[key] = "unresponsive"
                else:
                    state.setdefault(key, "responsive")
        if moved:
            self._changed_at = now
        self._counts = counts
        self._streak = streak
        tally = Counter(state.values())
        kinds = Counter(errors.values())
        named = [
            NamedRank(world[k][2], s, *where[k])
            for k, s in state.items()
            if s in ("dead", "unresponsive")
        ]
        named += [
            NamedRank(world[k][2], "lagging", *where[k], behind=b, answers=n)
            for k, (b, n) in lag.items()
            if state.get(k) == "responsive"
        ]
        named.sort(key=lambda r: (NAMED_STATES.index(r.state), -r.behind, r.rank, r.host))
        assert self._changed_at is not None
        return JobStatus(
            nccl_version=answer.nccl_version,
            ranks=tuple((s, tally.get(s, 0)) for s in RANK_STATES),
            communicators=len(answer.communicators),
            mismatched_communicators=mismatched,
            count_spread=spread,
            counts_unchanged_seconds=max(0.0, now - self._changed_at),
            async_error_ranks=tuple((k, kinds.get(k, 0)) for k in ERROR_KINDS),
            collection_seconds=answer.collection_seconds,
            timeouts=answer.timeouts,
            named=tuple(named[: self.max_named]),
            repaired=answer.repaired,
        )
