"""One stream's NCCL state: what the lines :mod:`agent.throughput.nccl` parses add up to for
one container log (:class:`NcclRun`), in bounded memory: at most :data:`MAX_PIDS` processes'
HCA lists and :data:`MAX_HCAS` HCA names per stream.

Bounded series: every label value here comes from a pod's output, so every label set a
stream can grow is capped, per stream and (through an :class:`Admission` the sampler shares
between its streams) per node. IB completion errors keep at most
:data:`MAX_IB_ERROR_PAIRS` (status, vendor error) pairs per stream and
:data:`NODE_IB_ERROR_PAIRS` per node, each pair admitted for good the first time it is
seen; a pair seen past either cap is counted under the one overflow pair
(:data:`OVERFLOW`, ``other``/``other``), so no error goes uncounted and a counter never
moves from one series to another. HCA names past :data:`MAX_HCAS` per stream or
:data:`NODE_HCAS` per node are counted under the HCA name ``other``.

Ranks and communicator ids are kept only inside :class:`NcclRun`, bounded
(:data:`MAX_COMM_RANKS`, :data:`MAX_RANK_CHANNELS`), to join a channel's two ranks with the
GPUs their ``Init START`` lines named (:attr:`NcclRun.comm_gpus`, :attr:`NcclRun.rank_channels`):
what leaves the agent is a pair of this node's GPU addresses, never a rank.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import TypeVar

from agent.throughput.nccl import (
    Abort,
    Channel,
    CommDevice,
    IbDevices,
    InitComplete,
    NcclLine,
    NcclWarning,
    Process,
    Version,
)

T = TypeVar("T")

#: processes per stream whose NET/IB list is remembered (least recently seen forgotten)
MAX_PIDS = 256
#: distinct HCA names counted per stream (a name beyond them counts as unmapped)
MAX_HCAS = 64
#: distinct (GPU, HCA) pairs counted per stream (16 GPUs x 16 HCAs)
MAX_PAIRS = 256
#: (status, vendor error) pairs of IB completion errors given their own series per stream
#: (a failing link shows one to three: retry_exc_err and wr_flush_err with their syndromes)
MAX_IB_ERROR_PAIRS = 16
#: ... and per node, over all streams
NODE_IB_ERROR_PAIRS = 256
#: HCA names given their own series per node, over all streams
NODE_HCAS = 256
#: the label value(s) of what is counted past a cap
OTHER = "other"
OVERFLOW = (OTHER, OTHER)
#: (communicator, rank) -> GPU entries remembered per stream (a job's view of one node needs
#: its local ranks: 8 per communicator on an 8-GPU node)
MAX_COMM_RANKS = 1024
#: distinct (communicator, rank, rank, transport) channel endpoints counted per stream
MAX_RANK_CHANNELS = 4096


class Admission:
    """A per-node cap on the series of one kind (IB error pairs, HCA names) that all streams
    together may hold: a stream takes a place before it gives a value a series of its own,
    and gives its places back when it goes. ``refused_total`` counts the refusals (each a
    line counted under the overflow value instead)."""

    __slots__ = ("in_use", "limit", "refused_total")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self.refused_total = 0

    def admit(self) -> bool:
        if self.in_use >= self.limit:
            self.refused_total += 1
            return False
        self.in_use += 1
        return True

    def take(self, n: int) -> None:
        """Places of series that exist already (a stream resumed from another process)."""
        self.in_use += n

    def give_back(self, n: int) -> None:
        self.in_use = max(0, self.in_use - n)


def _own(counter: Counter[T], overflow: T) -> int:
    """Series of ``counter`` that hold a place of their own (all but the overflow)."""
    return len(counter) - (overflow in counter)


def _capped(counter: Counter[T], key: T, overflow: T, limit: int, node: Admission | None) -> T:
    """The key to count ``key`` under: itself when it already has a series or there is room
    for it in this stream (``limit``) and the node (``node``), else ``overflow``."""
    if key in counter or key == overflow:
        return key
    if len(counter) - (overflow in counter) >= limit:
        return overflow
    if node is not None and not node.admit():
        return overflow
    return key


class NcclRun:
    """What one stream's (container log's) NCCL lines said, in bounded memory.

    The channel and HCA counts describe the current run: :meth:`new_run` (a restarted
    container's new log) forgets them; warnings, IB completion errors, inits and aborts are
    counters since the stream was first read and never go back. A channel line's
    ``NET/IB/<index>`` is mapped to an HCA name through the NET/IB list its own process
    printed (the pid in the line's prefix), else through the last list any process printed.
    ``gpu_hca_channels`` pairs those channels with the GPU their process drives (the
    ``busId`` of its communicator lines): 2.17+ print ``Init START`` before the channels,
    older versions only ``Init COMPLETE`` after them, so a process's channels wait (bounded)
    until its GPU is known.
    """

    __slots__ = (
        "_comms",
        "_gpus",
        "_hca_admission",
        "_ib_admission",
        "_last_list",
        "_lists",
        "_pending",
        "aborts",
        "channels",
        "comm_gpus",
        "gpu_hca_channels",
        "hca_channels",
        "heard",
        "ib_errors",
        "inits",
        "last_init_ts",
        "lines",
        "rank_channels",
        "version",
        "warnings",
    )

    def __init__(
        self, ib_admission: Admission | None = None, hca_admission: Admission | None = None
    ) -> None:
        """``ib_admission`` and ``hca_admission``: the node's caps (see the module docstring),
        shared with the other streams; None: this stream's own caps only."""
        self._ib_admission = ib_admission
        self._hca_admission = hca_admission
        self.version: str | None = None
        self.channels: Counter[tuple[str, bool]] = Counter()
        self.hca_channels: Counter[str] = Counter()
        self.warnings: Counter[str] = Counter()
        self.ib_errors: Counter[tuple[str, str]] = Counter()
        self.inits = 0
        self.aborts = 0
        self.last_init_ts: float | None = None
        self.lines = 0
        #: any NCCL line was fed (``lines`` counts only those read as they came)
        self.heard = False
        self.gpu_hca_channels: Counter[tuple[str, str]] = Counter()
        self._lists: OrderedDict[int, tuple[str, ...]] = OrderedDict()
        self._last_list: tuple[str, ...] | None = None
        self._gpus: OrderedDict[Process, str] = OrderedDict()
        self._pending: OrderedDict[Process, Counter[str]] = OrderedDict()
        #: the communicator each process (thread) is setting up: its last ``Init START``
        self._comms: OrderedDict[Process, str] = OrderedDict()
        #: (communicator id, rank) -> (the PCI address of that rank's GPU, the host its line
        #: named), from ``Init START``
        self.comm_gpus: OrderedDict[tuple[str, int], tuple[str, str]] = OrderedDict()
        #: channel connections by (communicator id, lower rank, higher rank, transport)
        self.rank_channels: Counter[tuple[str, int, int, str]] = Counter()

    def new_run(self) -> None:
        """The stream's next run began (its container restarted): forget what the previous
        run chose, keep the counters."""
        self.version = None
        self.channels.clear()
        if self._hca_admission is not None:
            self._hca_admission.give_back(_own(self.hca_channels, OTHER))
        self.hca_channels.clear()
        self.gpu_hca_channels.clear()
        self._lists.clear()
        self._last_list = None
        self._gpus.clear()
        self._pending.clear()
        self._comms.clear()
        self.comm_gpus.clear()
        self.rank_channels.clear()

    def __getstate__(self) -> dict[str, object]:
        """Pickled without the node's admissions (a replacing child has its own)."""
        return {k: getattr(self, k) for k in self.__slots__ if not k.endswith("_admission")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._ib_admission = None
        self._hca_admission = None
        for k, v in state.items():
            setattr(self, k, v)

    def attach(self, ib_admission: Admission | None, hca_admission: Admission | None) -> None:
        """Join the node's caps (a stream resumed from another process): the values this
        stream already counts hold their places."""
        self._ib_admission = ib_admission
        self._hca_admission = hca_admission
        if ib_admission is not None:
            ib_admission.take(_own(self.ib_errors, OVERFLOW))
        if hca_admission is not None:
            hca_admission.take(_own(self.hca_channels, OTHER))

    def release(self) -> None:
        """The stream went: give back its places under the node's caps."""
        if self._ib_admission is not None:
            self._ib_admission.give_back(_own(self.ib_errors, OVERFLOW))
        if self._hca_admission is not None:
            self._hca_admission.give_back(_own(self.hca_channels, OTHER))

    def feed(self, parsed: NcclLine, ts: float | None, *, history: bool = False) -> None:
        """Account one recognised line; ``ts`` is its wall time (CRI timestamp) or None.
        ``history``: a line from before where counting began (the log's head, read once; a
        line written before the agent started): it says what NCCL chose and when a
        communicator last initialised, but no counter (lines, warnings, inits, aborts)
        moves."""
        ev = parsed.event
        self.heard = True
        if history:
            if isinstance(ev, NcclWarning):
                return
            if isinstance(ev, InitComplete | Abort):
                if isinstance(ev, InitComplete):
                    self._init_at(ts)
                self._gpu_of(parsed.process, ev.bus_id)
                return
        else:
            self.lines += 1
        if isinstance(ev, Channel):
            self.channels[(ev.transport, ev.gdr)] += 1
            self._rank_channel(parsed.process, ev)
            if ev.transport == "NET/IB" and ev.net_index is not None:
                listed = self._list_of(parsed.pid)
                if listed is not None and ev.net_index < len(listed):
                    name = listed[ev.net_index]
                    counted = _capped(self.hca_channels, name, OTHER, MAX_HCAS, self._hca_admission)
                    self.hca_channels[counted] += 1
                    if counted == name:
                        self._pair(parsed.process, name)
        elif isinstance(ev, IbDevices):
            self._last_list = ev.devices
            if parsed.pid is not None:
                self._lists[parsed.pid] = ev.devices
                self._lists.move_to_end(parsed.pid)
                while len(self._lists) > MAX_PIDS:
                    self._lists.popitem(last=False)
        elif isinstance(ev, NcclWarning):
            self.warnings[ev.kind] += 1
            if ev.ib_status is not None:
                pair = (ev.ib_status, ev.vendor_error or OTHER)
                key = _capped(
                    self.ib_errors, pair, OVERFLOW, MAX_IB_ERROR_PAIRS, self._ib_admission
                )
                self.ib_errors[key] += 1
        elif isinstance(ev, Version):
            self.version = ev.version
        elif isinstance(ev, InitComplete):
            self.inits += 1
            self._init_at(ts)
            self._gpu_of(parsed.process, ev.bus_id)
        elif isinstance(ev, Abort):
            self.aborts += 1
            self._gpu_of(parsed.process, ev.bus_id)
        elif isinstance(ev, CommDevice):
            self._gpu_of(parsed.process, ev.bus_id)
            if ev.comm_id is not None and ev.rank is not None:
                self._comm_rank(parsed.process, ev.comm_id, ev.rank, (ev.bus_id, ev.host or ""))

    def _comm_rank(
        self, proc: Process | None, comm_id: str, rank: int, where: tuple[str, str]
    ) -> None:
        """``proc`` sets up ``comm_id`` as ``rank`` on the GPU and host ``where``."""
        key = (comm_id, rank)
        if key in self.comm_gpus or len(self.comm_gpus) < MAX_COMM_RANKS:
            self.comm_gpus[key] = where
        if proc is not None:
            self._comms[proc] = comm_id
            self._comms.move_to_end(proc)
            while len(self._comms) > MAX_PIDS:
                self._comms.popitem(last=False)

    def _rank_channel(self, proc: Process | None, ch: Channel) -> None:
        """Count a channel under the communicator its process is setting up (2.17+: the
        channels of a communicator follow its ``Init START``)."""
        if ch.ranks is None or proc is None:
            return
        comm = self._comms.get(proc)
        if comm is None:
            return
        a, b = ch.ranks
        key = (comm, min(a, b), max(a, b), ch.transport)
        if key in self.rank_channels or len(self.rank_channels) < MAX_RANK_CHANNELS:
            self.rank_channels[key] += 1

    def _init_at(self, ts: float | None) -> None:
        if ts is not None:
            self.last_init_ts = ts if self.last_init_ts is None else max(ts, self.last_init_ts)

    def _pair(self, proc: Process | None, hca: str) -> None:
        """Count one NET/IB channel of ``proc`` through ``hca`` against its GPU, or keep it
        until the process names its GPU."""
        if proc is None:
            return
        gpu = self._gpus.get(proc)
        if gpu is not None:
            self._count_pair(gpu, hca, 1)
            return
        waiting = self._pending.get(proc)
        if waiting is None:
            waiting = self._pending[proc] = Counter()
            while len(self._pending) > MAX_PIDS:
                self._pending.popitem(last=False)
        if hca in waiting or len(waiting) < MAX_HCAS:
            waiting[hca] += 1

    def _count_pair(self, gpu: str, hca: str, n: int) -> None:
        key = (gpu, hca)
        if key in self.gpu_hca_channels or len(self.gpu_hca_channels) < MAX_PAIRS:
            self.gpu_hca_channels[key] += n

    def _gpu_of(self, proc: Process | None, bus_id: str | None) -> None:
        """``proc`` drives the GPU at ``bus_id``: its waiting channels are that GPU's."""
        if proc is None or bus_id is None:
            return
        self._gpus[proc] = bus_id
        self._gpus.move_to_end(proc)
        while len(self._gpus) > MAX_PIDS:
            self._gpus.popitem(last=False)
        waiting = self._pending.pop(proc, None)
        if waiting is not None:
            for hca, n in waiting.items():
                self._count_pair(bus_id, hca, n)

    def _list_of(self, pid: int | None) -> tuple[str, ...] | None:
        if pid is not None:
            listed = self._lists.get(pid)
            if listed is not None:
                return listed
        return self._last_list
