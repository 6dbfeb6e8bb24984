"""The NVML sampler: per-GPU identity, PCIe link, NVLink (state, speed, far end, error
counters), row remapping, volatile ECC, clock-event reasons, compute processes and XID errors.

Every NVML call goes through the adapter in :mod:`agent.nvml.api` (:class:`NvmlApi`), so
tests replay recorded answers (:mod:`agent.nvml.record`) instead of mocking calls. The
records a pass returns (:class:`NvmlSnapshot` and its parts) are in :mod:`agent.nvml.snapshot`;
findings are in :mod:`agent.nvml.findings`; a pass's error policy and batched field values
are in :mod:`agent.nvml.sweep`, the XID event watch in :mod:`agent.nvml.xid`, the MIG devices
(read after the GPUs, every pass) in :mod:`agent.nvml.mig`, each GPU's NVLink fabric
registration (its multi-node NVLink domain, read on each GPU's turn: below) in
:mod:`agent.nvml.fabric`.

What is exported and what is not
    Only what the hardware answers. ``NOT_SUPPORTED`` and ``FUNCTION_NOT_FOUND`` (an older
    driver or pynvml lacking the call) leave that value ``None`` *quietly*: no
    :class:`~agent.core.sysfs.ReadIssue`, because the runner counts every issue as a read error
    and "this GPU has no such counter" is not one. ``GPU_IS_LOST`` marks the GPU lost (a
    ``gpu_lost`` finding and metric); its remaining calls are skipped, it keeps its identity
    as last read (so ``gpu_info`` still names the lost GPU), and the other GPUs are still
    sampled. Any other error costs that one value and records an issue with path
    ``nvml/<gpu>/<call>[/<qualifier>]`` (``nvml/0/nvmlDeviceGetNvLinkErrorCounter/link3/replay``);
    an answer of the wrong shape (:class:`NvmlAnswerError`, a PCI address that does not parse)
    is a ``parse`` issue. PCI addresses are exported in sysfs form (``0000:19:00.0``).

NVLink
    Links are discovered by asking ``nvmlDeviceGetNvLinkState`` for every index below
    ``NVML_NVLINK_MAX_LINKS``; an index answered ``NOT_SUPPORTED`` or ``INVALID_ARGUMENT`` is
    no link. Speed, far end (PCI address and device type) are read for links that are up;
    error counters for every link. Replay, recovery and CRC-flit come from the per-link
    ``NVML_FI_DEV_NVLINK_ERROR_DL_*`` fields (161-163, scopeId = link) batched into one
    ``nvmlDeviceGetFieldValues`` per GPU, else ``nvmlDeviceGetNvLinkErrorCounter``, else the
    older per-link ``*_ERROR_COUNT_L<n>`` fields (links 0-11); crc_data and ecc_data from
    ``nvmlDeviceGetNvLinkErrorCounter``, else the older fields. Which links exist and what
    does not change is cached, and the error counters are read in rotation:
    :class:`NvmlSampler` says what a pass reads and why.

XID errors
    The first pass creates an NVML event set registered for ``nvmlEventTypeXidCriticalError``
    on every GPU; every pass ends by collecting the events queued since the last one
    (``nvmlEventSetWait_v2`` with a 0 ms timeout, called until it answers ``TIMEOUT``: NVML
    hands out one queued event per call) and counts them per (GPU, XID code). The counts only
    grow (unlike dcgm-exporter's last-value gauge, dcgm-exporter #500/#190) while the process
    holding the event set lives. A GPU that refuses registration is noted in the snapshot,
    not fatal. There is no XID thread: every NVML call of a sampler is made on the thread
    running its pass, one at a time, so NVML is never entered from two threads at once (a
    2x H200 node corrupted its heap when an event wait in one thread overlapped field-value
    reads in another; issue 13).

Hung calls
    The runner abandons a sampling call that exceeds its timeout (in the agent, the pass runs
    in a child process that is killed instead: :mod:`agent.core.isolation`). ``sample`` holds its
    lock only to take a pass number and to hand its caches over, never across an NVML call,
    so a hung NVML call can block nothing but the thread it hangs in.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.core.errors import NoData
from agent.core.isolation import ChildSpec, IsolatedSampler, Setting
from agent.nvml.api import (
    FI_LEGACY_ERRORS,
    FI_LEGACY_SPEED,
    FI_NVLINK_GET_SPEED,
    FI_NVLINK_SPEED_COMMON,
    FI_SCOPED_ERRORS,
    MEMORY_ERROR_CORRECTED,
    MEMORY_ERROR_UNCORRECTED,
    NVLINK_DEVICE_TYPES,
    NVLINK_ERROR_COUNTERS,
    NVLINK_STATE_INACTIVE,
    VOLATILE_ECC,
    LiveNvml,
    NvmlApi,
    NvmlCallError,
    open_api,
)
from agent.nvml.fabric import GpuFabric, read_fabric
from agent.nvml.mig import read_mig
from agent.nvml.snapshot import (
    ComputeProcess,
    NvLink,
    NvLinkErrorCounts,
    NvmlGpu,
    NvmlSnapshot,
    PcieLink,
    RemappedRows,
)
from agent.nvml.state import (
    COUNTER_PATHS,
    ERROR_COUNTER_IDS,
    FAST_ERRORS,
    GPU_FIELD_IDS,
    GPU_FIELD_SCOPES,
    GPU_FIELDS,
    GPU_LEVEL,
    GPU_PATHS,
    NO_LINK,
    SLOW_ERRORS,
    GpuBuilder,
    GpuCache,
    GpuIdentity,
    LinkStatic,
    NodeStatic,
    State,
    Via,
)
from agent.nvml.sweep import Batch, GpuLost, Miss, Pass, combine
from agent.nvml.xid import XidEvents

log = logging.getLogger(__name__)

_MEGABYTE = 1_000_000
_PCI_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


# -- parsing NVML's answers ----------------------------------------------------------------


def normalize_pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:19:00.0`` -> sysfs's ``0000:19:00.0`` (lower case, the domain in at
    least four hex digits, as Linux names PCI devices)."""
    m = _PCI_BUS_ID.match(nvml_bus_id.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {nvml_bus_id.strip()[:40]!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


# -- the sampler --------------------------------------------------------------------------


class NvmlSampler:
    """Samples every GPU NVML sees. ``api_factory`` builds the :class:`NvmlApi` (default:
    :class:`LiveNvml`); it is called, and ``nvmlInit`` run, once, on the first pass that
    finds a driver. ``watch_xid``: register for XID events on the first successful pass and
    collect them at the end of every pass.

    What a pass costs, and why it does not read everything
        NVML's per-link reads are expensive in CPU (measured on a 2x H200 node, driver
        580.159.04, ``bench/nvml_fieldvalues.py``): ``nvmlDeviceGetNvLinkErrorCounter`` 0.46 ms
        per counter, a link-scoped entry of ``nvmlDeviceGetFieldValues`` 0.13 ms, against
        1.5 us for ``nvmlDeviceGetNvLinkState``. Reading all five counters of all links each
        pass cost 194 ms CPU for two GPUs (430 calls); an 8-GPU node would spend most of a
        second per pass. So a pass reads:

        * every pass, per GPU: link states; the GPU-level counters (PCIe replays, remapped
          rows, volatile ECC) as entries of ONE ``nvmlDeviceGetFieldValues`` call (fields
          94, 142-145, 3, 4), falling back to their own calls where a field answers
          NOT_SUPPORTED; current PCIe generation and width; clock-event reasons; compute
          processes.
        * replay, recovery and CRC-flit counters (the ones that make findings) of the links
          with ``link % link_error_rotation == pass % link_error_rotation``, as entries of
          the same batched call (fields 161-163, scopeId = link), falling back per link and
          counter to ``nvmlDeviceGetNvLinkErrorCounter`` and then the older per-link fields.
          With the default 18, each link's counters are at most 18 passes old (9 min at
          the default 30 s ``--nvml.interval``): alert on their increase over 15 minutes or
          more (the shipped rule uses 1 h).
        * crc_data and ecc_data (no scoped field carries them: one call per counter) of the
          links with ``link % slow_error_rotation == pass % slow_error_rotation``: default
          72, at most 72 passes old (36 min). They are no findings (non-zero on healthy
          links); alert on their rate over hours.

        Why: on an H200 NVML spends about 0.85 ms of CPU per NVLink touched per call (the
        driver asks the GPU's firmware), whatever the number of fields. Measured there on 2
        GPUs (bench/bench_nvml.py): rotations 6/36 cost 12.5 ms per steady pass (50 ms
        extrapolated to 8 GPUs); the defaults 18/72 cost 4.7 ms (18.8 ms for 8). Link state
        is still read every pass (0.07 ms a link), so a link going down shows at once.
        * the NVLink traffic over all links (fields 138/139, scopeId all links) and the fabric
          registration of GPU ``g`` on the passes where ``(pass - g) % N == 0``
          (``traffic_rotation``, ``fabric_rotation``; default 2, a minute at the default
          30 s ``--nvml.interval``; GPUs take turns), the traffic also until a read
          answered and the registration every pass while it is in progress or its last
          read failed. On a 2x H200 the traffic fields cost 1.23 ms a batch and the fabric
          call 0.39 ms a GPU (of a 9.2 ms pass for two): the traffic is a counter (a rate
          over minutes does not need every pass) and the registration changes when Fabric
          Manager or the GPU restarts.
        * once per ``static_refresh_passes`` passes (default 40, 20 min at 30 s; GPU ``g``
          on the passes where ``pass % N == g % N``, so GPUs do not all refresh at once),
          after GPU_IS_LOST, and while a previous read of them failed: what cannot change
          while the driver is loaded, that is identity (PCI address, UUID, name, serial,
          VBIOS), maximum PCIe generation and width, and which link indices exist (all
          ``NVML_NVLINK_MAX_LINKS`` probed). A link's version, speed and far end are read
          when it is first seen and again when its state changes (or a read of them
          failed), not at that refresh: they change only with the link's state, and the
          refresh re-read them for 18 links at once (54 calls and 18 link-scoped field
          entries: the slowest pass of each GPU).

        A counter not read in a pass is exported with its last value: a sample of a counter
        taken a few passes ago is still a correct sample of it. The first pass reads every
        counter of every link (a link seen for the first time is read at once), so one pass
        (``--once``, a snapshot, a recording) is complete; a counter whose read failed is
        absent until it is read again, on the next pass. The path that answers each value
        (batched field, own call, older field) is learned on the first read and kept until
        the static refresh, so a GPU that lacks the fields costs no extra calls per pass.

    Concurrency
        The runner abandons a hung pass and starts the next. Each pass works on a copy of
        what the previous passes cached, and only the newest pass's copy is kept, so a hung
        pass that returns late cannot put older counter values back (a counter that went
        backwards would read as a reset). The lock guarding that hand-over is never held
        across an NVML call.
    """

    name = "nvml"

    def __init__(
        self,
        api_factory: Callable[[], NvmlApi] | None = None,
        *,
        watch_xid: bool = True,
        link_error_rotation: int = 18,
        slow_error_rotation: int = 72,
        static_refresh_passes: int = 40,
        traffic_rotation: int = 2,
        fabric_rotation: int = 2,
    ) -> None:
        for name, value in (
            ("link_error_rotation", link_error_rotation),
            ("slow_error_rotation", slow_error_rotation),
            ("static_refresh_passes", static_refresh_passes),
            ("traffic_rotation", traffic_rotation),
            ("fabric_rotation", fabric_rotation),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        self._factory: Callable[[], NvmlApi] = api_factory or LiveNvml
        self._api: NvmlApi | None = None
        self._watch_xid = watch_xid
        self._xid: XidEvents | None = None
        self.link_error_rotation = link_error_rotation
        self.slow_error_rotation = slow_error_rotation
        self.static_refresh_passes = static_refresh_passes
        self.traffic_rotation = traffic_rotation
        self.fabric_rotation = fabric_rotation
        self._lock = threading.Lock()  # guards the two below, never held across NVML
        self._passes = 0
        self._state = State()

    def _ensure_api(self) -> NvmlApi:
        if self._api is None:
            self._api = open_api(self._factory)
        return self._api

    def sample(self) -> NvmlSnapshot:
        api = self._ensure_api()
        with self._lock:
            k = self._passes
            self._passes += 1
            state = self._state
        p = Pass()
        node = state.node
        if node is None or not node.complete or k % self.static_refresh_passes == 0:
            before = len(p.issues)
            driver = p.get("", api.driver_version)
            nvml_version = p.get("", api.nvml_version)
            complete = len(p.issues) == before
            node = None
        count = api.device_count()
        if count == 0:
            raise NoData("NVML sees no GPU")
        if node is None:
            node = NodeStatic(driver, nvml_version, api.nvlink_max_links(), complete)
        gpus: list[NvmlGpu] = []
        caches: dict[int, GpuCache] = {}
        for gpu in range(count):
            old = state.gpus.get(gpu)
            snap, cache = self._sample_gpu(
                api, p, gpu, None if old is None else old.copy(), k=k, max_links=node.max_links
            )
            gpus.append(snap)
            if cache is not None:
                caches[gpu] = cache
        with self._lock:
            if k > self._state.pass_index:  # a hung pass returning late keeps nothing
                self._state = State(node, caches, k)
        mig_modes, mig_devices = read_mig(api, p, ((g.index, g.uuid) for g in gpus if not g.lost))
        if self._watch_xid and self._xid is None:
            self._xid = XidEvents(api)
            self._xid.open(range(count))
        if self._xid is not None:
            self._xid.poll()
        fabric = self._fabric(api, p, k, [g.index for g in gpus if not g.lost], caches)
        return NvmlSnapshot(
            driver_version=node.driver_version,
            nvml_version=node.nvml_version,
            gpus=tuple(gpus),
            xid_registrations=self._xid.registrations if self._xid else (),
            xid_errors=self._xid.counts() if self._xid else (),
            issues=tuple(p.issues),
            fabric=fabric,
            mig_modes=mig_modes,
            mig_devices=mig_devices,
        )

    def poll_xid(self, wait_ms: int = 0) -> int:
        """Collect XID events now, waiting up to ``wait_ms`` for the first (recording tools);
        how many. Call it from the thread that runs the passes, never beside one."""
        return 0 if self._xid is None else self._xid.poll(wait_ms)

    def close(self) -> None:
        """Free the XID event set and shut NVML down."""
        xid, self._xid = self._xid, None
        if xid is not None:
            xid.close()
        api, self._api = self._api, None
        with self._lock:  # a new NVML session: nothing cached carries over
            self._passes = 0
            self._state = State()
        if api is not None:
            try:
                api.shutdown()
            except NvmlCallError as exc:
                log.debug("nvmlShutdown: %s", exc)

    def _fabric(
        self, api: NvmlApi, p: Pass, k: int, gpus: list[int], caches: Mapping[int, GpuCache]
    ) -> tuple[GpuFabric, ...]:
        """The fabric registrations: read for a GPU on its turn of ``fabric_rotation`` (GPU
        ``g`` on the passes where ``(pass - g) % N == 0``), while its registration is in
        progress, and until a read answered; else its last answer stands (it changes when
        Fabric Manager or the GPU restarts)."""
        due: list[int] = []
        kept: dict[int, GpuFabric] = {}
        for gpu in gpus:
            cache = caches.get(gpu)
            last = cache.fabric if cache is not None else None
            if last is None or last.state == "in_progress" or (k - gpu) % self.fabric_rotation == 0:
                due.append(gpu)
            else:
                kept[gpu] = last
        fresh = {f.gpu: f for f in read_fabric(api, p, due)}
        for gpu in due:
            cache = caches.get(gpu)
            if cache is not None:
                cache.fabric = fresh.get(gpu)  # a failed read is asked again next pass
        kept.update(fresh)
        return tuple(kept[g] for g in gpus if g in kept)

    # -- one GPU ------------------------------------------------------------------------

    def _static_due(self, k: int, cache: GpuCache) -> bool:
        return cache.stale or not cache.static_complete or k >= cache.refresh_at

    def _sample_gpu(
        self, api: NvmlApi, p: Pass, gpu: int, cache: GpuCache | None, *, k: int, max_links: int
    ) -> tuple[NvmlGpu, GpuCache | None]:
        """One GPU's snapshot and what it leaves for the next pass (``cache`` is this pass's
        own copy)."""
        b = GpuBuilder(gpu)
        if cache is not None:
            b.identify(cache.identity)  # a GPU lost later still names itself
        try:
            if cache is None or self._static_due(k, cache):
                n = self.static_refresh_passes
                # at least n passes on, on a pass = gpu (mod n): GPUs take turns
                refresh_at = k + n + (gpu - k) % n
                cache, states = self._read_static(api, p, gpu, max_links, cache)
                cache.refresh_at = refresh_at
                b.identify(cache.identity)
            else:
                states = self._link_states(api, p, gpu, cache.links)
            self._sample_rest(_GpuPass(api, p, gpu, cache), k, states, b)
        except GpuLost:
            if cache is not None:
                cache.stale = True
            return b.freeze(lost=True), cache
        return b.freeze(lost=False), cache

    @staticmethod
    def _read_static(
        api: NvmlApi, p: Pass, gpu: int, max_links: int, old: GpuCache | None
    ) -> tuple[GpuCache, dict[int, int]]:
        """Identity, maximum PCIe link, and which links exist (with this pass's states)."""
        g = str(gpu)
        before = len(p.issues)
        pci = None
        bus_id = p.get(g, lambda: api.pci_bus_id(gpu))
        if bus_id is not None:
            pci = p.get(f"{g}/pci_bus_id", lambda: normalize_pci_bus_id(bus_id))
        ident = GpuIdentity(
            pci_bus_id=pci,
            uuid=p.get(g, lambda: api.uuid(gpu)),
            name=p.get(g, lambda: api.name(gpu)),
            serial=p.get(g, lambda: api.serial(gpu)),
            vbios_version=p.get(g, lambda: api.vbios_version(gpu)),
            max_generation=p.get(g, lambda: api.pcie_max_link_generation(gpu)),
            max_width=p.get(g, lambda: api.pcie_max_link_width(gpu)),
        )
        complete = len(p.issues) == before
        links: list[int] = []
        states: dict[int, int] = {}
        for link in range(max_links):
            state = p.attempt(
                f"{g}/link{link}", functools.partial(api.nvlink_state, gpu, link), quiet=NO_LINK
            )
            if state is Miss.UNSUPPORTED:
                continue
            links.append(link)  # a link, even if its state failed this time
            if not isinstance(state, Miss):
                states[link] = state
        cache = GpuCache(ident, complete, 0, tuple(links))
        if old is not None and not old.stale:  # what outlives a refresh, not a lost GPU
            cache.via = old.via  # the paths that answer: the driver is the same
            kept = set(links)
            cache.counts = {key: v for key, v in old.counts.items() if key[0] in kept}
            # a link's version, speed and far end change only with its state (a cable or a
            # tray cannot move while the link stays up): read again when it changes
            cache.link_static = {n: s for n, s in old.link_static.items() if n in kept}
        return cache, states

    @staticmethod
    def _link_states(api: NvmlApi, p: Pass, gpu: int, links: Sequence[int]) -> dict[int, int]:
        states: dict[int, int] = {}
        for link in links:
            state = p.get(
                f"{gpu}/link{link}", functools.partial(api.nvlink_state, gpu, link), quiet=NO_LINK
            )
            if state is not None:
                states[link] = state
        return states

    def _sample_rest(self, gp: _GpuPass, k: int, states: dict[int, int], b: GpuBuilder) -> None:
        """Everything but the static part: one batched field-values call, then the calls."""
        api, p, gpu, cache, batch = gp.api, gp.p, gp.gpu, gp.cache, gp.batch
        g = str(gpu)
        # the traffic counters on the GPU's turn, or until a read answered (the module doc)
        traffic_due = cache.traffic_kib is None or (k - gpu) % self.traffic_rotation == 0
        for name, fields in GPU_FIELDS:
            if name == "nvlink_data" and not traffic_due:
                continue
            if cache.via.get((GPU_LEVEL, name), Via.FIELD) is Via.FIELD:
                scope = GPU_FIELD_SCOPES.get(name, 0)
                for i, field_id in enumerate(fields):
                    batch.ask((GPU_LEVEL, f"{name}/{i}"), field_id, scope)
        restate: set[int] = set()  # links whose version, speed and far end are (re)read
        for link, state in states.items():
            known = cache.link_static.get(link)
            if known is None or known.state != state or not known.complete:
                restate.add(link)
                if state != NVLINK_STATE_INACTIVE:
                    batch.ask((link, "speed"), FI_NVLINK_GET_SPEED, link)
        r, r2 = self.link_error_rotation, self.slow_error_rotation
        due: dict[int, tuple[str, ...]] = {}
        for link in states:
            names: tuple[str, ...] = ()
            if link % r == k % r or any((link, n) not in cache.counts for n in FAST_ERRORS):
                names += FAST_ERRORS
            if link % r2 == k % r2 or any((link, n) not in cache.counts for n in SLOW_ERRORS):
                names += SLOW_ERRORS
            due[link] = names
            for name in names:
                if cache.via.get((link, name), _default_via(name)) is Via.FIELD:
                    batch.ask((link, name), FI_SCOPED_ERRORS[name], link)
        batch.run(api, gpu)

        replays = gp.gpu_value("pcie_replays", g, lambda: (api.pcie_replay_counter(gpu),))
        rows = gp.gpu_value("remapped_rows", g, lambda: api.remapped_rows(gpu))
        if rows is not None:
            b.remapped_rows = RemappedRows(rows[0], rows[1], bool(rows[2]), bool(rows[3]))
        corrected = gp.gpu_value(
            "ecc_corrected",
            f"{g}/corrected",
            lambda: (api.total_ecc_errors(gpu, MEMORY_ERROR_CORRECTED, VOLATILE_ECC),),
        )
        b.ecc_corrected_volatile = None if corrected is None else corrected[0]
        uncorrected = gp.gpu_value(
            "ecc_uncorrected",
            f"{g}/uncorrected",
            lambda: (api.total_ecc_errors(gpu, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),),
        )
        b.ecc_uncorrected_volatile = None if uncorrected is None else uncorrected[0]
        if traffic_due:
            got = gp.gpu_value("nvlink_data", f"{g}/nvlink_data", None)
            cache.traffic_kib = None if got is None else (got[0], got[1])
        kib = cache.traffic_kib
        if kib is not None:
            b.nvlink_transmitted_bytes, b.nvlink_received_bytes = kib[0] * 1024, kib[1] * 1024
        b.pcie = PcieLink(
            current_generation=p.get(g, lambda: api.pcie_current_link_generation(gpu)),
            max_generation=cache.identity.max_generation,
            current_width=p.get(g, lambda: api.pcie_current_link_width(gpu)),
            max_width=cache.identity.max_width,
            replays=None if replays is None else replays[0],
        )
        b.clocks_event_reasons = p.get(g, lambda: api.clocks_event_reasons(gpu))
        procs = p.get(g, lambda: api.compute_processes(gpu))
        if procs is not None:
            b.compute_processes = tuple(ComputeProcess(pid, mem) for pid, mem in procs)

        for link, state in states.items():
            if link in restate:
                cache.link_static[link] = gp.link_static(link, state)
            for name in due[link]:
                gp.counter(link, name)
            info = cache.link_static[link]
            counts = {name: cache.counts.get((link, name)) for name, _ in NVLINK_ERROR_COUNTERS}
            b.nvlinks.append(
                NvLink(
                    link=link,
                    state=state,
                    version=info.version,
                    speed_bytes_per_second=info.speed_bytes_per_second,
                    remote_pci_bus_id=info.remote_pci_bus_id,
                    remote_device_type=info.remote_device_type,
                    errors=NvLinkErrorCounts(**counts),
                )
            )


def _default_via(name: str) -> Via:
    return Via.FIELD if name in FI_SCOPED_ERRORS else Via.CALL


def _paths(order: tuple[Via, ...], start: Via) -> tuple[Via, ...]:
    """The paths to try, from the one learned (none once nothing answers)."""
    return order[order.index(start) :] if start in order else ()


@dataclass(slots=True)
class _GpuPass:
    """One GPU's part of one pass: the API, the pass's error policy, this pass's copy of the
    GPU's cache and the pass's batched field values."""

    api: NvmlApi
    p: Pass
    gpu: int
    cache: GpuCache
    batch: Batch = field(default_factory=Batch)
    #: NVML's speed for all links, fetched once per GPU when first needed
    common_speed: list[int | None] = field(default_factory=list)

    def gpu_value(
        self, name: str, call_where: str, call: Callable[[], tuple[int, ...]] | None
    ) -> tuple[int, ...] | None:
        """A GPU-level counter from its fields in the batch, else from its own call (when it
        has one: ``call`` None means the fields are the only path)."""
        key = (GPU_LEVEL, name)
        n_fields = len(GPU_FIELD_IDS[name])
        first_failed: Via | None = None
        for via in _paths(GPU_PATHS, self.cache.via.get(key, Via.FIELD)):
            got: tuple[int, ...] | Miss
            if via is Via.FIELD:
                answers = [self.batch[(GPU_LEVEL, f"{name}/{i}")] for i in range(n_fields)]
                got = combine(self.p, f"{self.gpu}/{name}", answers)
            elif call is None:
                got = Miss.UNSUPPORTED
            else:
                got = self.p.attempt(call_where, call)
            if got is Miss.UNSUPPORTED:
                continue
            if isinstance(got, Miss):
                first_failed = first_failed or via
                continue
            self.cache.via[key] = first_failed or via
            return got
        self.cache.via[key] = first_failed or Via.NOTHING
        return None

    def counter(self, link: int, name: str) -> None:
        """One NVLink error counter into the cache's counts: the batched scoped field, else
        ``nvmlDeviceGetNvLinkErrorCounter``, else the older per-link field."""
        key = (link, name)
        where = f"{self.gpu}/link{link}/{name}"
        legacy = FI_LEGACY_ERRORS[name]
        first_failed: Via | None = None
        for via in _paths(COUNTER_PATHS, self.cache.via.get(key, _default_via(name))):
            got: int | Miss
            if via is Via.FIELD:
                got = self.p.answer(where, self.batch[key])
            elif via is Via.CALL:
                counter = ERROR_COUNTER_IDS[name]
                got = self.p.attempt(
                    where, functools.partial(self.api.nvlink_error_counter, self.gpu, link, counter)
                )
            elif link < len(legacy):
                got = self.p.attempt(
                    where, functools.partial(self.api.field_value, self.gpu, legacy[link], 0)
                )
            else:
                got = Miss.UNSUPPORTED
            if got is Miss.UNSUPPORTED:
                continue
            if isinstance(got, Miss):
                first_failed = first_failed or via
                continue
            self.cache.via[key] = first_failed or via
            self.cache.counts[key] = got
            return
        if first_failed is None:  # nothing offers it: absent, not asked until the refresh
            self.cache.via[key] = Via.NOTHING
            self.cache.counts[key] = None
        else:  # it failed: absent now, read again next pass
            self.cache.via[key] = first_failed
            self.cache.counts.pop(key, None)

    def link_static(self, link: int, state: int) -> LinkStatic:
        api, p, gpu = self.api, self.p, self.gpu
        where = f"{gpu}/link{link}"
        before = len(p.issues)
        version = p.get(where, lambda: api.nvlink_version(gpu, link))
        speed = remote_bus = remote_type = None
        if state != NVLINK_STATE_INACTIVE:
            speed = self.link_speed(link)
            raw_bus = p.get(where, lambda: api.nvlink_remote_pci_bus_id(gpu, link))
            if raw_bus is not None:
                remote_bus = p.get(f"{where}/remote", lambda: normalize_pci_bus_id(raw_bus))
            kind = p.get(where, lambda: api.nvlink_remote_device_type(gpu, link))
            if kind is not None:
                remote_type = NVLINK_DEVICE_TYPES.get(kind, "unknown")
        return LinkStatic(
            state, version, speed, remote_bus, remote_type, complete=len(p.issues) == before
        )

    def link_speed(self, link: int) -> int | None:
        """Bytes/second: the per-link speed field (batched), else the older per-link field,
        else the speed NVML gives for all links. NVML reports MBps (10^6 bytes/s)."""
        api, p, gpu = self.api, self.p, self.gpu
        where = f"{gpu}/link{link}/speed"
        got = p.answer(where, self.batch[(link, "speed")])
        mbps = None if isinstance(got, Miss) else got
        if mbps is None and link < len(FI_LEGACY_SPEED):
            mbps = p.get(where, lambda: api.field_value(gpu, FI_LEGACY_SPEED[link], 0))
        if mbps is None:
            if not self.common_speed:
                self.common_speed.append(
                    p.get(f"{gpu}/speed", lambda: api.field_value(gpu, FI_NVLINK_SPEED_COMMON, 0))
                )
            mbps = self.common_speed[0]
        if mbps is None or mbps <= 0:
            return None
        return mbps * _MEGABYTE


def isolated_sampler(
    settings: Mapping[str, Setting],
    timeout_seconds: float,
    *,
    one_shot: bool = False,
    memory_limit: int | None = None,
) -> IsolatedSampler:
    """The live NVML sampler (:func:`child_sampler` with ``settings``) in a supervised child
    process (:mod:`agent.core.isolation`): the agent's, and ``topo``'s (``one_shot``);
    ``memory_limit``: the pod's, of which the child's memory ceiling is a share."""
    return IsolatedSampler(
        "nvml",
        ChildSpec("agent.nvml.sampler:child_sampler", settings),
        timeout_seconds=timeout_seconds,
        one_shot=one_shot,
        memory_limit=memory_limit,
    )


def child_sampler(
    *, watch_xid: bool = True, link_error_rotation: int = 18, slow_error_rotation: int = 72
) -> NvmlSampler:
    """The live NVML sampler as the agent's child process builds it (:mod:`agent.core.isolation`:
    ``ChildSpec("agent.nvml.sampler:child_sampler", {...})``)."""
    return NvmlSampler(
        watch_xid=watch_xid,
        link_error_rotation=link_error_rotation,
        slow_error_rotation=slow_error_rotation,
    )
