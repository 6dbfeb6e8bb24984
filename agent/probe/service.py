"""The resident side of the probe: a background service that runs probes on a schedule, and
the ``probe`` sampler that reports their latest results without probing.

What runs, and when
    * **Node pairs.** Time is cut into rounds of ``round_seconds``; round ``r`` is
      ``floor(unix_time / round_seconds)``. Every agent computes the same disjoint pairs of the
      sorted member list for round ``r`` (:func:`agent.probe.schedule.partner_of`, the circle
      method), so nothing coordinates. In each pair the lower-ranked member is the *host*: it
      answers on its rendezvous port and runs rank 0 (the torch store, on its node address);
      the other, the *guest*, proposes one offer per collective of ``pair_kinds`` and runs
      rank 1. Each side uses one GPU: the guest picks the first idle one in a rotation that
      advances every round and asks the host for the GPU at the same position ("rail"
      ``k``: GPU ``k`` of every node usually sits on the same leaf switch), by the probe id
      suffix ``.g<k>``.
    * **Intra-node.** Every ``intra_seconds`` an all_reduce across this node's idle GPUs (on a
      CPU-only node with gloo: across ``cpu_slots`` simulated devices), in the second half
      of a round when node pairs run, so it rarely collides with them.

Safety
    * A probe runs only on GPUs with no compute processes (NVML; ``force`` overrides).
    * A per-GPU lock: never two probes on one GPU. An offer for a locked or busy GPU is
      declined with ``gpu_busy`` and counted as a skip.
    * A GPU-time budget: probes may spend ``budget`` of the node's GPU time (GPU-seconds =
      the probe's wall time x GPUs it held, process start included), a token bucket refilled
      at ``budget x GPUs`` per second and holding at most ``budget_window_seconds`` of it. A
      probe whose estimate (the last cost of its kind) exceeds the credit is skipped and
      counted. Manual probes (``fabricscope probe`` against this agent, probe ids starting
      ``cli-``) are not refused for budget but are charged to it.
    * Every probe is a worker process per rank, in its own session (process group), with a
      hard deadline of ``timeout_seconds``: at the deadline, or when the service stops, the
      whole group is killed (``os.killpg``), so no worker outlives its probe. A worker's own
      rendezvous and collective timeouts are half the deadline, so a healthy worker reports
      a peer that vanished before it is killed.
    * The rendezvous authenticates peers (shared secret) before anything starts; refusals
      are counted by reason.

Results
    The latest run per (collective, peer, GPU, peer GPU) is kept, with one record per message
    size; intra-node runs have an empty peer and GPU. Runs older than ``max_age_seconds``
    (default: 3 rounds for node pairs, 3 intervals for intra-node) are dropped, so the series
    of a peer that left, or of a probe that stopped running, go away instead of going stale.
    Counters: runs by collective and outcome (``ok`` or a failure reason), skips by reason,
    GPU-seconds spent, and the rendezvous server's accepted / refused counts.

GPU numbering
    Workers run with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and without ``CUDA_VISIBLE_DEVICES``, so
    a CUDA device index is the NVML index and the ``gpu`` label of a probe series joins
    ``fabricscope_gpu_info``. An agent started with ``CUDA_VISIBLE_DEVICES`` probes only the
    GPUs it names. Under gloo the "GPUs" are CPU slots ``0 .. cpu_slots - 1``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from agent.config import DEFAULT_PROBE_PORT, ProbeSettings
from agent.errors import ConfigError
from agent.nvml_api import LiveNvml, NvmlApi, NvmlCallError
from agent.probe.launch import (
    WorkerRun,
    failure_records,
    free_port,
    launch_workers,
)
from agent.probe.membership import MembershipSource, PeersFile, normalize_host
from agent.probe.records import (
    CPU_DEFAULT_SIZES,
    GPU_DEFAULT_SIZES,
    LATENCY_SIZE_BYTES,
    REASONS,
    ProbeRecord,
    SpecError,
    WorkerSpec,
)
from agent.probe.rendezvous import (
    Answer,
    Offer,
    RendezvousError,
    RendezvousServer,
    RendezvousStats,
    load_secret,
    propose,
)
from agent.probe.schedule import partner_of
from agent.sysfs import ReadIssue

log = logging.getLogger(__name__)

#: outcome of a run, the ``reason`` label of ``runs_total``
RUN_REASONS = ("ok", *REASONS)
#: why a probe did not run: over budget, GPUs busy or locked, no partner this round (or
#: fewer than two local GPUs for an intra-node probe), the partner declined the offer
SKIP_REASONS = ("budget", "gpu_busy", "no_partner", "peer_declined")
MANUAL_PREFIX = "cli-"
#: longest a guest waits for a host's rendezvous answer
RENDEZVOUS_TIMEOUT_SECONDS = 10.0
#: a host that declines with gpu_busy is asked again this many times, a second apart (its
#: rank of the previous probe may still be exiting)
BUSY_RETRIES = 3
#: a first probe of a kind is budgeted at this many seconds per GPU
INITIAL_ESTIMATE_SECONDS = 10.0


# --- what the service reports ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuSlot:
    """A device a probe can use. ``label`` names it in metrics: the NVML index, or the slot
    number of a simulated CPU device under gloo. ``device`` is the CUDA device index the
    worker uses (the NVML index, see the module doc), None under gloo."""

    label: int
    device: int | None


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
    """

    runs: tuple[ProbeRun, ...] = ()
    runs_total: tuple[tuple[str, str, int], ...] = ()
    skipped_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in SKIP_REASONS)
    gpu_seconds_total: float = 0.0
    members: int = 0
    rendezvous: RendezvousStats | None = None
    issues: tuple[ReadIssue, ...] = ()


# --- local devices -------------------------------------------------------------------------


def _visible(env: Mapping[str, str], api: NvmlApi, count: int) -> list[int]:
    """NVML indices named by ``CUDA_VISIBLE_DEVICES`` (indices or GPU UUIDs; parsing stops
    at the first entry that names no GPU, as CUDA's does); all of them when unset."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None or raw.strip() in ("all", ""):
        return list(range(count)) if raw is None or raw.strip() == "all" else []
    uuids: dict[str, int] | None = None
    out: list[int] = []
    for token in (t.strip() for t in raw.split(",")):
        index: int | None = None
        if token.isdigit():
            index = int(token) if int(token) < count else None
        elif token.startswith("GPU-"):
            if uuids is None:
                uuids = {}
                for i in range(count):
                    try:
                        uuids[api.uuid(i)] = i
                    except NvmlCallError as exc:
                        log.warning("probe: NVML has no UUID for GPU %s: %s", i, exc)
            index = next((i for u, i in uuids.items() if u.startswith(token)), None)
        if index is None or index in out:
            break
        out.append(index)
    return out


def discover_slots(
    backend: str,
    cpu_slots: int,
    *,
    nvml: Callable[[], NvmlApi] | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, tuple[GpuSlot, ...]]:
    """(backend, devices) a probe may use: NCCL on the GPUs NVML sees (those of
    ``CUDA_VISIBLE_DEVICES`` when set) or, for gloo or ``auto`` without GPUs, ``cpu_slots``
    simulated devices. ConfigError when ``nccl`` is asked for and there is no GPU."""
    cpu = tuple(GpuSlot(i, None) for i in range(cpu_slots))
    if backend == "gloo":
        return "gloo", cpu
    why = ""
    labels: list[int] = []
    try:
        api = (nvml or LiveNvml)()
        api.init()
        try:
            labels = _visible(os.environ if env is None else env, api, api.device_count())
        finally:
            api.shutdown()
    except NvmlCallError as exc:
        why = f" (NVML: {exc})"
    if labels:
        return "nccl", tuple(GpuSlot(i, i) for i in labels)
    if backend == "nccl":
        raise ConfigError(f"--probe.backend nccl: no NVIDIA GPU to probe{why}")
    log.info("probe: no GPU%s; probing %d CPU slots with gloo", why, cpu_slots)
    return "gloo", cpu


#: labels of the GPUs running compute processes now; None when that cannot be told
BusyGpus = Callable[[], frozenset[int] | None]


def no_busy_gpus() -> frozenset[int]:
    """The busy check of simulated CPU slots: never busy."""
    return frozenset()


class NvmlBusyGpus:
    """Busy GPUs by NVML's compute-process lists (no CUDA context is created). NVML failing
    is "unknown" (None): the service then treats every GPU as busy."""

    def __init__(self, labels: Sequence[int], nvml: Callable[[], NvmlApi] | None = None) -> None:
        self._labels = tuple(labels)
        self._factory: Callable[[], NvmlApi] = nvml or LiveNvml
        self._api: NvmlApi | None = None
        self._lock = threading.Lock()
        self._failing = False

    def __call__(self) -> frozenset[int] | None:
        with self._lock:
            try:
                if self._api is None:
                    api = self._factory()
                    api.init()
                    self._api = api
                busy = frozenset(g for g in self._labels if self._api.compute_processes(g))
            except NvmlCallError as exc:
                if not self._failing:
                    log.warning("probe: cannot tell busy GPUs (%s); probing none", exc)
                self._failing = True
                return None
            if self._failing:
                log.info("probe: NVML answers compute processes again")
            self._failing = False
            return busy

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                try:
                    self._api.shutdown()
                except NvmlCallError as exc:
                    log.debug("probe: nvmlShutdown: %s", exc)
                self._api = None


class GpuLocks:
    """Which devices a probe holds now; acquiring is all or nothing."""

    def __init__(self) -> None:
        self._held: set[int] = set()
        self._lock = threading.Lock()

    def try_acquire(self, labels: Iterable[int]) -> bool:
        want = set(labels)
        with self._lock:
            if want & self._held:
                return False
            self._held |= want
            return True

    def release(self, labels: Iterable[int]) -> None:
        with self._lock:
            self._held -= set(labels)

    def held(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._held)


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


# --- launching workers ---------------------------------------------------------------------


class Launcher(Protocol):
    """Runs one worker process per spec and returns the first spec's records."""

    def __call__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        deadline_seconds: float,
        abort: threading.Event | None = None,
    ) -> WorkerRun: ...


# --- addresses and probe ids ---------------------------------------------------------------


def parse_hostport(text: str, default_port: int = DEFAULT_PROBE_PORT) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or a bare IPv6 literal -> (host, port).
    ValueError naming the problem."""
    value = text.strip()
    if not value:
        raise ValueError("empty address")
    port_text = ""
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: expected [IPv6]:PORT")
        port_text = rest[1:]
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
    else:
        host = value  # a name, IPv4, or an IPv6 literal without a port
    if not host:
        raise ValueError(f"{text!r}: no host")
    port = default_port
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{text!r}: port {port_text!r} is not 1..65535")
        port = int(port_text)
    return host, port


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe_id(prefix: str, slot: int | None = None) -> str:
    """A fresh probe id; ``.g<k>`` asks the host for the GPU at position ``k``."""
    suffix = f".g{slot}" if slot is not None else ""
    return f"{prefix}-{secrets.token_hex(6)}{suffix}"


def requested_slot(pid: str) -> int | None:
    """The GPU position a probe id asks for (its ``.g<k>`` suffix), or None."""
    _, sep, tail = pid.rpartition(".g")
    if sep and tail.isdigit() and len(tail) <= 4:
        return int(tail)
    return None


def _unspecified(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_unspecified
    except ValueError:
        return False


def worker_timeout(timeout_seconds: float) -> float:
    """A worker's own rendezvous / collective timeout: half the probe's hard deadline."""
    return max(1.0, timeout_seconds / 2)


def default_sizes(kind: str, backend: str, sizes: Sequence[int]) -> tuple[int, ...]:
    """The sizes an offer carries: latency is always 8 bytes; else ``sizes`` or the
    backend's defaults."""
    if kind == "latency":
        return (LATENCY_SIZE_BYTES,)
    if sizes:
        return tuple(sizes)
    return GPU_DEFAULT_SIZES if backend == "nccl" else CPU_DEFAULT_SIZES


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


# --- the guest side of one node-pair probe ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class GuestOutcome:
    """One offer's fate: ``error`` when the rendezvous failed; ``answer`` declined; or
    ``answer`` accepted and ``run`` the local rank's records."""

    answer: Answer | None = None
    error: RendezvousError | None = None
    run: WorkerRun | None = None


def guest_probe(
    peer: tuple[str, int],
    *,
    secret: bytes,
    node_id: str,
    offer: Offer,
    make_spec: Callable[[str, int], WorkerSpec],
    launcher: Launcher,
    deadline_seconds: float,
    rendezvous_timeout: float = RENDEZVOUS_TIMEOUT_SECONDS,
    abort: threading.Event | None = None,
    expected_host_id: str | None = None,
    busy_retries: int = 0,
    retry_seconds: float = 1.0,
) -> GuestOutcome:
    """Propose ``offer`` to the host at ``peer``; if accepted, run rank 1 (the spec
    ``make_spec(master_addr, master_port)``) against the host's store.

    A ``gpu_busy`` decline is proposed again up to ``busy_retries`` times, ``retry_seconds``
    apart: the host's rank of the previous probe may still be exiting and hold its GPU for a
    moment after ours has."""
    host, port = peer
    waiter = abort or threading.Event()
    for attempt in range(busy_retries + 1):
        try:
            answer = propose(
                host,
                port,
                secret,
                node_id,
                offer,
                rendezvous_timeout,
                expected_host_id=expected_host_id,
            )
        except RendezvousError as exc:
            return GuestOutcome(error=exc)
        if answer.accepted or answer.reason != "gpu_busy" or attempt == busy_retries:
            break
        if waiter.wait(retry_seconds):
            break
    if not answer.accepted or answer.master_addr is None or answer.master_port is None:
        return GuestOutcome(answer=answer)
    addr = host if _unspecified(answer.master_addr) else answer.master_addr
    spec = make_spec(addr, answer.master_port)
    run = launcher([spec], deadline_seconds=deadline_seconds, abort=abort)
    return GuestOutcome(answer=answer, run=run)


# --- the service -----------------------------------------------------------------------------


class ProbeService:
    """Runs node-pair rounds and intra-node probes in a background thread and answers peers'
    offers (see the module doc). ``start()`` binds the rendezvous (a taken port is a
    ConfigError there) and starts the thread; ``stop()`` kills running workers and waits.

    Injectable for tests: ``members`` (None: no pair rounds), ``busy`` (GPUs running compute
    processes), ``launcher`` (worker processes), ``clock`` (unix time; rounds and ages),
    ``peer_address`` (member -> its rendezvous address; default: the member at this node's
    probe port), ``busy_retries`` (times a ``gpu_busy`` decline is proposed again).
    """

    def __init__(
        self,
        settings: ProbeSettings,
        *,
        node_id: str,
        backend: str,
        slots: Sequence[GpuSlot],
        secret: bytes | None = None,
        members: MembershipSource | None = None,
        listen: tuple[str, int] | None = None,
        busy: BusyGpus = no_busy_gpus,
        launcher: Launcher = launch_workers,
        clock: Callable[[], float] = time.time,
        peer_address: Callable[[str], tuple[str, int]] | None = None,
        rendezvous_timeout: float = RENDEZVOUS_TIMEOUT_SECONDS,
        busy_retries: int = BUSY_RETRIES,
    ) -> None:
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend {backend!r}: resolve auto before starting the service")
        if (members is not None or listen is not None) and secret is None:
            raise ConfigError("cross-node probes need the shared secret (--probe.secret-file)")
        if members is not None and listen is None:
            raise ConfigError("cross-node probes need --probe.listen-address")
        self.settings = settings
        self.node_id = node_id
        try:
            self._me = normalize_host(node_id)
        except ValueError as exc:
            raise ConfigError(f"probe node id: {exc}") from None
        self.backend = backend
        self.slots = tuple(slots)
        self._secret = secret
        self._members = members
        self._listen = listen
        self._busy = busy
        self._launcher = launcher
        self._clock = clock
        port = listen[1] if listen is not None else DEFAULT_PROBE_PORT
        self._peer_address = peer_address or (lambda member: (member, port))
        self._rv_timeout = min(rendezvous_timeout, settings.timeout_seconds)
        self._busy_retries = busy_retries
        self.locks = GpuLocks()
        self.budget = GpuBudget(
            settings.budget, len(self.slots), settings.budget_window_seconds, time.monotonic
        )
        self._lock = threading.Lock()
        self._runs: dict[tuple[str, str, str, str], ProbeRun] = {}
        self._runs_total: dict[tuple[str, str], int] = {}
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._gpu_seconds = 0.0
        self._cost: dict[str, float] = {}
        self._members_count = 0
        self._issues: tuple[ReadIssue, ...] = ()
        self._warned: set[str] = set()
        self._last_skip: str | None = None
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._server: RendezvousServer | None = None
        self._thread: threading.Thread | None = None
        self._host_threads: set[threading.Thread] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Bind the rendezvous (when listening) and start the schedule thread."""
        if self._thread is not None:
            return
        if self._listen is not None and self._secret is not None:
            host, port = self._listen
            self._server = RendezvousServer(host, port, self._secret, self.node_id, self._on_offer)
        if self._members is not None:
            self._refresh_members()
        self._thread = threading.Thread(target=self._loop, name="probe-service", daemon=True)
        self._thread.start()
        log.info(
            "probe service %s: %s on %s %s; rounds of %gs, intra-node every %s, budget %g",
            self.node_id,
            self.backend,
            "GPUs" if self.backend == "nccl" else "CPU slots",
            ",".join(str(s.label) for s in self.slots),
            self.settings.round_seconds,
            f"{self.settings.intra_seconds:g}s" if self.settings.intra_seconds else "(off)",
            self.settings.budget,
        )

    @property
    def port(self) -> int | None:
        """The rendezvous port bound (None when not listening)."""
        return self._server.port if self._server is not None else None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop scheduling, refuse new offers, kill running workers, wait for threads."""
        self._stop.set()
        self._abort.set()
        if self._server is not None:
            self._server.close()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._lock:
            hosts = list(self._host_threads)
        for t in hosts:
            t.join(timeout)
        for owner in (self._busy, self._members):
            close = getattr(owner, "close", None)
            if callable(close):
                close()

    # -- the schedule --------------------------------------------------------------------

    def _loop(self) -> None:
        s = self.settings
        rounds = self._members is not None and self._server is not None
        delay = min(1.0, s.round_seconds * 0.05)  # host clocks may lag a little
        next_intra = math.inf
        if s.intra_seconds > 0:
            next_intra = self._intra_at(self._clock() + min(s.intra_seconds, 30.0), rounds)
        last_round: int | None = None
        while not self._stop.is_set():
            now = self._clock()
            r = math.floor(now / s.round_seconds)
            next_pair = math.inf
            if rounds:
                next_pair = (r if r != last_round else r + 1) * s.round_seconds + delay
            if now >= next_pair:
                last_round = r
                self._guarded(self.run_pair_round, r)
                continue
            if now >= next_intra:
                self._guarded(self.run_intra)
                next_intra = self._intra_at(
                    max(next_intra + s.intra_seconds, self._clock()), rounds
                )
                continue
            self._stop.wait(min(max(min(next_pair, next_intra) - now, 0.01), 5.0))

    def _intra_at(self, t: float, rounds: bool) -> float:
        """``t``, or when node pairs run and ``t`` falls in a round's first half, the middle
        of that round (pair probes start at a round's beginning)."""
        if not rounds:
            return t
        r = self.settings.round_seconds
        start = math.floor(t / r) * r
        return max(t, start + r / 2)

    def _guarded(self, fn: Callable[..., object], *args: int) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("probe: %s failed", getattr(fn, "__name__", "a probe"))

    def _refresh_members(self) -> tuple[str, ...]:
        assert self._members is not None
        members = self._members.members()
        issues: tuple[ReadIssue, ...] = ()
        if isinstance(self._members, PeersFile) and not self._members.healthy:
            path = self._members.path
            reason = "parse" if os.path.exists(path) else "vanished"
            issues = (ReadIssue(path, reason, "peers file unusable; last good list in use"),)
        elif not getattr(self._members, "healthy", True):
            issues = (
                ReadIssue(
                    "kubernetes/probe-members", "io", "membership source failing; last good list"
                ),
            )
        with self._lock:
            self._members_count = len(members)
            self._issues = issues
        return members

    # -- bookkeeping --------------------------------------------------------------------

    def _skip(self, reason: str, why: str, *args: object) -> None:
        """Count a skip; log it when skipping for this reason starts (a probe running, or a
        skip for another reason, ends a spell), at debug while it goes on."""
        with self._lock:
            self._skipped[reason] += 1
            first = self._last_skip != reason
            self._last_skip = reason
        log.log(
            logging.INFO if first else logging.DEBUG, "probe skipped (%s): " + why, reason, *args
        )

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        log.log(logging.WARNING if first else logging.DEBUG, msg, *args)

    def _estimate(self, scope: str, gpus: int) -> float:
        with self._lock:
            cost = self._cost.get(scope)
        if cost is not None:
            return cost
        return min(self.settings.timeout_seconds, INITIAL_ESTIMATE_SECONDS) * gpus

    def _charge(self, scope: str, gpu_seconds: float) -> None:
        self.budget.spend(gpu_seconds)
        with self._lock:
            self._gpu_seconds += gpu_seconds
            self._cost[scope] = gpu_seconds

    def _record(self, run: ProbeRun) -> None:
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
        s = self.settings
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

    def snapshot(self) -> ProbeSnapshot:
        """The latest runs and counters; cheap (no probing, no I/O)."""
        stats = self._server.stats() if self._server is not None else None
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
                rendezvous=stats,
                issues=self._issues,
            )

    # -- devices -------------------------------------------------------------------------

    def _busy_labels(self) -> frozenset[int]:
        if self.settings.force:
            return frozenset()
        busy = self._busy()
        if busy is None:  # unknown: probe nothing
            return frozenset(s.label for s in self.slots)
        return busy

    def _idle(self) -> list[int]:
        """Positions of the slots neither busy nor locked now."""
        busy = self._busy_labels() | self.locks.held()
        return [i for i, s in enumerate(self.slots) if s.label not in busy]

    # -- intra-node ------------------------------------------------------------------------

    def run_intra(self) -> ProbeRun | None:
        """One intra-node all_reduce over the idle devices now; the run, or None if skipped."""
        if len(self.slots) < 2:
            self._skip("no_partner", "an intra-node probe needs 2 devices, this node has %d", 1)
            return None
        idle = [self.slots[i] for i in self._idle()]
        if len(idle) < 2:
            self._skip("gpu_busy", "%d of %d devices idle", len(idle), len(self.slots))
            return None
        if not self.budget.allows(self._estimate("intra", len(idle))):
            self._skip("budget", "GPU-time credit %.1f s", self.budget.credit())
            return None
        labels = [s.label for s in idle]
        if not self.locks.try_acquire(labels):
            self._skip("gpu_busy", "devices %s locked by another probe", labels)
            return None
        try:
            s = self.settings
            base = WorkerSpec(
                kind="all_reduce",
                rank=0,
                world_size=len(idle),
                master_addr="127.0.0.1",
                master_port=free_port("127.0.0.1"),
                backend=self.backend,
                devices=tuple(x.device for x in idle if x.device is not None),
                sizes=default_sizes("all_reduce", self.backend, s.sizes),
                warmup=s.warmup,
                iterations=s.iterations,
                timeout_seconds=worker_timeout(s.timeout_seconds),
                max_memory_bytes=s.max_memory_bytes,
                host=self.node_id,
            )
            specs = [replace(base, rank=r, local_rank=r) for r in range(len(idle))]
            run = self._launcher(specs, deadline_seconds=s.timeout_seconds, abort=self._abort)
        finally:
            self.locks.release(labels)
        self._charge("intra", run.duration_seconds * len(idle))
        if self._abort.is_set():
            return None
        result = ProbeRun(
            "all_reduce",
            "",
            "",
            "",
            self._clock(),
            run.duration_seconds,
            run_reason(run.records),
            run.records,
        )
        self._record(result)
        return result

    # -- node pairs: guest ---------------------------------------------------------------------

    def run_pair_round(self, round_no: int) -> None:
        """This node's part of round ``round_no``: propose to the partner when this node is
        the guest (the host only answers)."""
        if self._members is None or self._secret is None:
            return
        members = self._refresh_members()
        me = self._me
        if me not in members:
            self._warn_once(
                "not-member",
                "probe: this node (%s) is not among the %d members; it answers probes but "
                "starts none",
                self.node_id,
                len(members),
            )
            return
        pair = partner_of(me, members, round_no)
        if pair is None:
            self._skip("no_partner", "round %d: no partner (%d members)", round_no, len(members))
            return
        if pair.host == me:
            return
        idle = set(self._idle())
        n = len(self.slots)
        order = [(round_no + k) % n for k in range(n)]
        pos = next((p for p in order if p in idle), None)
        if pos is None:
            self._skip("gpu_busy", "round %d: no idle device", round_no)
            return
        slot = self.slots[pos]
        if not self.locks.try_acquire([slot.label]):
            self._skip("gpu_busy", "device %s locked by another probe", slot.label)
            return
        try:
            for kind in self.settings.pair_kinds:
                if self._stop.is_set():
                    return
                if not self.budget.allows(self._estimate(f"pair:{kind}", 1)):
                    self._skip("budget", "GPU-time credit %.1f s", self.budget.credit())
                    return
                if not self._guest_one(round_no, pair.host, kind, pos, slot):
                    return
        finally:
            self.locks.release([slot.label])

    def _guest_one(self, round_no: int, host: str, kind: str, pos: int, slot: GpuSlot) -> bool:
        """One offer and its run; False when the round should not go on (the host failed or
        declined)."""
        s = self.settings
        assert self._secret is not None
        sizes = default_sizes(kind, self.backend, s.sizes)
        offer = Offer(
            probe_id=probe_id(f"r{round_no}", pos),
            kind=kind,
            backend=self.backend,
            sizes_bytes=sizes,
            iterations=s.iterations,
            warmup=s.warmup,
        )
        template = WorkerSpec(
            kind=kind,
            rank=1,
            world_size=2,
            master_addr="127.0.0.1",
            master_port=1,
            backend=self.backend,
            local_rank=0,
            devices=(slot.device,) if slot.device is not None else (),
            sizes=sizes,
            warmup=s.warmup,
            iterations=s.iterations,
            timeout_seconds=worker_timeout(s.timeout_seconds),
            max_memory_bytes=s.max_memory_bytes,
            peer=host,
            src=f"{self.node_id}:{slot.label}",
            dst=f"{host}:{pos}",
            host=self.node_id,
        )
        began = time.monotonic()
        outcome = guest_probe(
            self._peer_address(host),
            secret=self._secret,
            node_id=self.node_id,
            offer=offer,
            make_spec=lambda addr, port: replace(template, master_addr=addr, master_port=port),
            launcher=self._launcher,
            deadline_seconds=s.timeout_seconds,
            rendezvous_timeout=self._rv_timeout,
            abort=self._abort,
            expected_host_id=host,
            busy_retries=self._busy_retries,
        )
        if outcome.answer is not None and not outcome.answer.accepted:
            self._skip("peer_declined", "%s declined %s (%s)", host, kind, outcome.answer.reason)
            return False
        if self._abort.is_set():
            return False
        if outcome.run is not None:
            records = outcome.run.records
            duration = outcome.run.duration_seconds
            self._charge(f"pair:{kind}", duration)
        else:
            error = outcome.error
            reason = error.reason if error is not None else "peer_unreachable"
            records = failure_records(template, reason, str(error or "no answer"))
            duration = time.monotonic() - began
        run = ProbeRun(
            kind,
            host,
            str(slot.label),
            device_label(records, 0) or str(pos),
            self._clock(),
            duration,
            run_reason(records),
            records,
        )
        self._record(run)
        return outcome.run is not None

    # -- node pairs: host -----------------------------------------------------------------

    def _on_offer(self, offer: Offer, guest_id: str) -> Answer:
        """Answer an authenticated offer: accept on a free idle device and start rank 0 in
        its own thread, or decline (``gpu_busy``: busy, locked or over budget;
        ``init_failure``: no such device, another backend, a bad offer)."""
        manual = offer.probe_id.startswith(MANUAL_PREFIX)
        if self._stop.is_set() or self._listen is None:
            return Answer.decline(offer.probe_id, "init_failure")
        if offer.backend != self.backend:
            self._warn_once(
                f"backend:{guest_id}",
                "probe: %s offered %s, this node probes with %s; declined",
                guest_id,
                offer.backend,
                self.backend,
            )
            return Answer.decline(offer.probe_id, "init_failure")
        wanted = requested_slot(offer.probe_id)
        idle = self._idle()
        if wanted is not None and wanted >= len(self.slots):
            log.info("probe: %s asked for device %d of %d", guest_id, wanted, len(self.slots))
            return Answer.decline(offer.probe_id, "init_failure")
        pos = wanted if wanted is not None else (idle[0] if idle else None)
        if pos is None or pos not in idle:
            self._skip("gpu_busy", "declined %s from %s", offer.kind, guest_id)
            return Answer.decline(offer.probe_id, "gpu_busy")
        if not manual and not self.budget.allows(self._estimate(f"pair:{offer.kind}", 1)):
            self._skip("budget", "declined %s from %s", offer.kind, guest_id)
            return Answer.decline(offer.probe_id, "gpu_busy")
        slot = self.slots[pos]
        if not self.locks.try_acquire([slot.label]):
            self._skip("gpu_busy", "declined %s from %s: device locked", offer.kind, guest_id)
            return Answer.decline(offer.probe_id, "gpu_busy")
        host_addr = self._listen[0]
        try:
            s = self.settings
            port = free_port(host_addr)
            spec = WorkerSpec(
                kind=offer.kind,
                rank=0,
                world_size=2,
                master_addr=host_addr,
                master_port=port,
                backend=self.backend,
                local_rank=0,
                devices=(slot.device,) if slot.device is not None else (),
                sizes=offer.sizes_bytes,
                warmup=offer.warmup,
                iterations=offer.iterations,
                timeout_seconds=worker_timeout(s.timeout_seconds),
                max_memory_bytes=s.max_memory_bytes,
                peer=guest_id,
                src=f"{self.node_id}:{slot.label}",
                dst=guest_id if wanted is None else f"{guest_id}:{wanted}",
                host=self.node_id,
            )
        except (OSError, SpecError) as exc:
            self.locks.release([slot.label])
            log.warning("probe: cannot host %s from %s: %s", offer.kind, guest_id, exc)
            return Answer.decline(offer.probe_id, "init_failure")
        thread = threading.Thread(
            target=self._host_run,
            args=(spec, slot, guest_id, wanted, manual),
            name=f"probe-host {guest_id}",
            daemon=True,
        )
        with self._lock:
            self._host_threads.add(thread)
        thread.start()
        return Answer.accept(offer.probe_id, host_addr, port)

    def _host_run(
        self, spec: WorkerSpec, slot: GpuSlot, guest_id: str, wanted: int | None, manual: bool
    ) -> None:
        try:
            run = self._launcher(
                [spec], deadline_seconds=self.settings.timeout_seconds, abort=self._abort
            )
            self._charge(f"pair:{spec.kind}", run.duration_seconds)
            if manual:
                log.info(
                    "probe: hosted a manual %s from %s (%s)",
                    spec.kind,
                    guest_id,
                    run_reason(run.records) or "ok",
                )
            elif not self._abort.is_set():
                peer_gpu = device_label(run.records, 1) or ("" if wanted is None else str(wanted))
                self._record(
                    ProbeRun(
                        spec.kind,
                        guest_id,
                        str(slot.label),
                        peer_gpu,
                        self._clock(),
                        run.duration_seconds,
                        run_reason(run.records),
                        run.records,
                    )
                )
        except Exception:
            log.exception("probe: hosting %s for %s failed", spec.kind, guest_id)
        finally:
            self.locks.release([slot.label])
            with self._lock:
                self._host_threads.discard(threading.current_thread())


# --- the sampler ---------------------------------------------------------------------------


class ProbeSampler:
    """The ``probe`` sampler: reports the service's latest results; never probes itself.
    ``close()`` (the runner calls it on shutdown) stops the service."""

    name = "probe"

    def __init__(self, service: ProbeService) -> None:
        self.service = service

    def sample(self) -> ProbeSnapshot:
        return self.service.snapshot()

    def close(self) -> None:
        self.service.stop()


class UnionBusy:
    """GPUs busy by either check; unknown (None) when the first cannot tell. ``close`` is
    passed on to the first (NVML's handle)."""

    def __init__(self, first: BusyGpus, second: Callable[[], frozenset[int]]) -> None:
        self._first = first
        self._second = second

    def __call__(self) -> frozenset[int] | None:
        a = self._first()
        return None if a is None else a | self._second()

    def close(self) -> None:
        close = getattr(self._first, "close", None)
        if callable(close):
            close()


def build_probe_sampler(
    settings: ProbeSettings,
    *,
    nvml: Callable[[], NvmlApi] | None = None,
    allocated: Callable[[], frozenset[int]] | None = None,
) -> ProbeSampler:
    """Load the secret, open the membership source (peers file or Kubernetes), find the
    devices, start the service (binding the rendezvous port). ``allocated``: GPUs the kubelet
    gave to pods (never probed, whatever NVML says). ConfigError, one clear line, for
    anything the user must fix."""
    secret = load_secret(settings.secret_file) if settings.secret_file else None
    listen: tuple[str, int] | None = None
    if settings.listen_address:
        try:
            listen = parse_hostport(settings.listen_address)
        except ValueError as exc:
            raise ConfigError(f"--probe.listen-address: {exc}") from None
    members: MembershipSource | None = None
    if settings.peers_file:
        if not os.path.isfile(settings.peers_file):
            raise ConfigError(f"probe peers file {settings.peers_file} does not exist")
        members = PeersFile(settings.peers_file)
    elif settings.kubernetes_selector:
        members = _kubernetes_members(settings)
    node_id = settings.node_id or (listen[0] if listen else socket.gethostname())
    try:
        node_id = normalize_host(node_id)
    except ValueError as exc:
        raise ConfigError(f"probe node id: {exc}") from None
    backend, slots = discover_slots(settings.backend, settings.cpu_slots, nvml=nvml)
    busy: BusyGpus = (
        NvmlBusyGpus([s.label for s in slots], nvml) if backend == "nccl" else no_busy_gpus
    )
    if allocated is not None and not settings.force:
        busy = UnionBusy(busy, allocated)
    service = ProbeService(
        settings,
        node_id=node_id,
        backend=backend,
        slots=slots,
        secret=secret,
        members=members,
        listen=listen,
        busy=busy,
    )
    service.start()
    return ProbeSampler(service)


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def _kubernetes_members(settings: ProbeSettings) -> MembershipSource:
    """The agent pods matching ``--probe.kubernetes-selector``, in their namespace (default:
    the service account's). Imports the Kubernetes client only here."""
    from agent.probe.k8s_members import KubernetesMembers

    namespace = settings.kubernetes_namespace
    if not namespace:
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as f:
                namespace = f.read().strip()
        except OSError:
            raise ConfigError(
                "--probe.kubernetes-selector: no --probe.kubernetes-namespace given and "
                f"{SERVICE_ACCOUNT_NAMESPACE} is unreadable (not in a pod?)"
            ) from None
    assert settings.kubernetes_selector is not None
    return KubernetesMembers(
        namespace, settings.kubernetes_selector, self_node=os.environ.get("NODE_NAME")
    )
