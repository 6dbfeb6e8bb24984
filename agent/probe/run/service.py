"""The resident side of the probe: a background service that runs probes on a schedule and
answers peers' offers. The ``probe`` sampler that reports its latest results without
probing is in :mod:`agent.probe.sampler`.

Its parts: :mod:`~agent.probe.run.devices` (which devices, busy checks, locks),
:mod:`~agent.probe.run.budget` (the GPU-time budget), :mod:`~agent.probe.run.specs` (the workers'
specs), :mod:`~agent.probe.run.guest` (one offer and its run), :mod:`~agent.probe.run.results` (what
it reports, aging), :mod:`~agent.probe.run.addresses` (addresses, probe ids).

What runs, and when
    * **Node pairs.** Time is cut into rounds of ``round_seconds``; round ``r`` is
      ``floor(unix_time / round_seconds)``. Every agent computes the same disjoint pairs of the
      sorted member list for round ``r`` (:func:`agent.probe.schedule.pairing.partner_of`,
      the circle method), so nothing coordinates. In each pair the lower-ranked member is the
      *host*: it answers on its rendezvous port and runs rank 0 (the torch store, on its node
      address); the other, the *guest*, proposes one offer per collective of ``pair_kinds``
      and runs rank 1. Each side uses one GPU: the guest picks the first idle one in a rotation that
      advances every round and asks the host for the GPU at the same position ("rail"
      ``k``: GPU ``k`` of every node usually sits on the same leaf switch), by the probe id
      suffix ``.g<k>``.
    * **Intra-node.** Every ``intra_seconds`` an all_reduce across this node's idle GPUs (on a
      CPU-only node with gloo: across ``cpu_slots`` simulated devices), in the second half
      of a round when node pairs run, so it rarely collides with them.

Safety
    * A probe runs only on GPUs with no compute processes (NVML, asked through a child
      process; when it cannot tell, no GPU is taken and the skip counts ``gpu_unknown``)
      and that no pod holds (:mod:`agent.kubernetes.allocation`: when that cannot be
      established, no GPU is taken and the skip counts ``allocation_unknown``, its reason
      counted too). ``force`` overrides both.
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
    The latest run per (collective, peer, GPU, peer GPU), aged out, and counters: see
    :mod:`agent.probe.run.results`. The rendezvous server's accepted / refused counts go with
    them.

GPU numbering
    Workers run with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and without ``CUDA_VISIBLE_DEVICES``, so
    a CUDA device index is the NVML index and the ``gpu`` label of a probe series joins
    ``fabricscope_gpu_info``. An agent started with ``CUDA_VISIBLE_DEVICES`` probes only the
    GPUs it names. Under gloo the "GPUs" are CPU slots ``0 .. cpu_slots - 1``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence

from agent.config import DEFAULT_PROBE_PORT, ProbeSettings
from agent.core.errors import ConfigError
from agent.core.sysfs import ReadIssue
from agent.kubernetes.allocation import GpuAllocation
from agent.probe.measure.launch import Launcher, failure_records, free_port, launch_workers
from agent.probe.measure.records import SpecError, WorkerSpec
from agent.probe.rendezvous.messages import Answer, Offer
from agent.probe.rendezvous.server import RendezvousServer
from agent.probe.run.addresses import MANUAL_PREFIX, probe_id, requested_slot
from agent.probe.run.budget import GpuBudget, ProbeCosts
from agent.probe.run.devices import BusyGpus, GpuLocks, GpuSlot, no_busy_gpus
from agent.probe.run.guest import RENDEZVOUS_TIMEOUT_SECONDS, guest_probe
from agent.probe.run.results import ProbeLedger, ProbeRun, ProbeSnapshot, device_label, run_reason
from agent.probe.run.specs import at_master, default_sizes, guest_spec, intra_specs, worker_timeout
from agent.probe.schedule.membership import MembershipSource, PeersFile, normalize_host
from agent.probe.schedule.pairing import partner_of

log = logging.getLogger(__name__)

#: a host that declines with gpu_busy is asked again this many times, a second apart (its
#: rank of the previous probe may still be exiting)
BUSY_RETRIES = 3


class ProbeService:
    """Runs node-pair rounds and intra-node probes in a background thread and answers peers'
    offers (see the module doc). ``start()`` binds the rendezvous (a taken port is a
    ConfigError there) and starts the thread; ``stop()`` kills running workers and waits.

    Injectable for tests: ``members`` (None: no pair rounds), ``busy`` (GPUs running compute
    processes), ``allocated`` (the GPUs pods hold, or why that is unknown: then no GPU is
    taken; default: no pods, as on a node without Kubernetes), ``launcher`` (worker
    processes), ``clock`` (unix time; rounds and ages), ``peer_address`` (member -> its
    rendezvous address; default: the member at this node's probe port), ``busy_retries``
    (times a ``gpu_busy`` decline is proposed again).
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
        allocated: Callable[[], GpuAllocation] = GpuAllocation,
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
        self._allocated = allocated
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
        self._costs = ProbeCosts(settings.timeout_seconds)
        self._ledger = ProbeLedger(settings, clock)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
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
        self._ledger.membership(len(members), issues)
        return members

    # -- bookkeeping --------------------------------------------------------------------

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        with self._lock:
            first = key not in self._warned
            self._warned.add(key)
        log.log(logging.WARNING if first else logging.DEBUG, msg, *args)

    def _charge(self, scope: str, gpu_seconds: float) -> None:
        self.budget.spend(gpu_seconds)
        self._ledger.spent(gpu_seconds)
        self._costs.note(scope, gpu_seconds)

    def snapshot(self) -> ProbeSnapshot:
        """The latest runs and counters; cheap (no probing, no I/O)."""
        return self._ledger.snapshot(self._server.stats() if self._server is not None else None)

    # -- devices -------------------------------------------------------------------------

    def _idle(self) -> tuple[list[int], str]:
        """Positions of the slots neither busy, nor held by a pod, nor locked now, and the
        skip reason when too few are: ``allocation_unknown`` when which GPUs pods hold
        cannot be established, ``gpu_unknown`` when NVML could not tell which GPUs are busy
        (either way none is taken), else ``gpu_busy``. ``force`` skips both checks."""
        taken = self.locks.held()
        if not self.settings.force:
            allocation = self._allocated()
            self._ledger.allocation(allocation.unknown)
            if allocation.unknown is not None:  # fail closed: probe nothing
                return [], "allocation_unknown"
            busy = self._busy()
            if busy is None:  # unknown: probe nothing
                return [], "gpu_unknown"
            taken |= busy | allocation.gpus
        return [i for i, s in enumerate(self.slots) if s.label not in taken], "gpu_busy"

    # -- intra-node ------------------------------------------------------------------------

    def run_intra(self) -> ProbeRun | None:
        """One intra-node all_reduce over the idle devices now; the run, or None if skipped."""
        if len(self.slots) < 2:
            self._ledger.skip(
                "no_partner",
                "an intra-node probe needs 2 devices, this node has %d",
                len(self.slots),
            )
            return None
        positions, why = self._idle()
        idle = [self.slots[i] for i in positions]
        if len(idle) < 2:
            self._ledger.skip(why, "%d of %d devices idle", len(idle), len(self.slots))
            return None
        if not self.budget.allows(self._costs.estimate("intra", len(idle))):
            self._ledger.skip("budget", "GPU-time credit %.1f s", self.budget.credit())
            return None
        labels = [s.label for s in idle]
        if not self.locks.try_acquire(labels):
            self._ledger.skip("gpu_busy", "devices %s locked by another probe", labels)
            return None
        try:
            s = self.settings
            specs = intra_specs(
                "all_reduce",
                self.backend,
                idle,
                sizes=default_sizes("all_reduce", self.backend, s.sizes),
                warmup=s.warmup,
                iterations=s.iterations,
                deadline_seconds=s.timeout_seconds,
                host=self.node_id,
                max_memory_bytes=s.max_memory_bytes,
            )
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
        self._ledger.record(result)
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
            self._ledger.skip(
                "no_partner", "round %d: no partner (%d members)", round_no, len(members)
            )
            return
        if pair.host == me:
            return
        positions, why = self._idle()
        idle = set(positions)
        n = len(self.slots)
        order = [(round_no + k) % n for k in range(n)]
        pos = next((p for p in order if p in idle), None)
        if pos is None:
            self._ledger.skip(why, "round %d: no idle device", round_no)
            return
        slot = self.slots[pos]
        if not self.locks.try_acquire([slot.label]):
            self._ledger.skip("gpu_busy", "device %s locked by another probe", slot.label)
            return
        try:
            for kind in self.settings.pair_kinds:
                if self._stop.is_set():
                    return
                if not self.budget.allows(self._costs.estimate(f"pair:{kind}", 1)):
                    self._ledger.skip("budget", "GPU-time credit %.1f s", self.budget.credit())
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
        template = guest_spec(
            kind,
            self.backend,
            slot,
            sizes=sizes,
            warmup=s.warmup,
            iterations=s.iterations,
            deadline_seconds=s.timeout_seconds,
            me=self.node_id,
            peer=host,
            dst=f"{host}:{pos}",
            max_memory_bytes=s.max_memory_bytes,
        )
        began = time.monotonic()
        outcome = guest_probe(
            self._peer_address(host),
            secret=self._secret,
            node_id=self.node_id,
            offer=offer,
            make_spec=at_master(template),
            launcher=self._launcher,
            deadline_seconds=s.timeout_seconds,
            rendezvous_timeout=self._rv_timeout,
            abort=self._abort,
            expected_host_id=host,
            busy_retries=self._busy_retries,
        )
        if outcome.answer is not None and not outcome.answer.accepted:
            self._ledger.skip(
                "peer_declined", "%s declined %s (%s)", host, kind, outcome.answer.reason
            )
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
        self._ledger.record(run)
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
        idle, why = self._idle()
        if wanted is not None and wanted >= len(self.slots):
            log.info("probe: %s asked for device %d of %d", guest_id, wanted, len(self.slots))
            return Answer.decline(offer.probe_id, "init_failure")
        pos = wanted if wanted is not None else (idle[0] if idle else None)
        if pos is None or pos not in idle:
            self._ledger.skip(why, "declined %s from %s", offer.kind, guest_id)
            return Answer.decline(offer.probe_id, "gpu_busy")
        if not manual and not self.budget.allows(self._costs.estimate(f"pair:{offer.kind}", 1)):
            self._ledger.skip("budget", "declined %s from %s", offer.kind, guest_id)
            return Answer.decline(offer.probe_id, "gpu_busy")
        slot = self.slots[pos]
        if not self.locks.try_acquire([slot.label]):
            self._ledger.skip(
                "gpu_busy", "declined %s from %s: device locked", offer.kind, guest_id
            )
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
                self._ledger.record(
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
