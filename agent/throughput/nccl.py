"""Pure parser of NCCL's own log lines: what NCCL chose (network, HCAs, the transport of every
channel connection, GPUDirect RDMA) and what it suffered (``NCCL WARN`` lines by kind, IB
completion errors by status and vendor error, communicator inits and aborts).

NCCL writes these lines into the job's own output when ``NCCL_DEBUG=INFO`` (``WARN``, the
default when NCCL_DEBUG is set at all, gives the warnings only). Formats seen from 2.4 to 2.28,
each with a real line in ``tests/fixtures/nccl-logs/`` (README there says where from)::

    NCCL version 2.4.7+cuda10.0                                  (up to 2.21: no prefix)
    host:pid:tid [0] NCCL INFO NCCL version 2.22.3+cuda12.4      (2.22+)
    host:pid:tid [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:..
    host:pid:tid [0] NCCL INFO NET/IB : No device found.
    host:pid:tid [3] NCCL INFO Ring 00 : 6 -> 2 [receive] via NET/IB/0           (2.4)
    host:pid:tid [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA
    host:pid:tid [4] NCCL INFO Channel 06/0 : 36[4] -> 20[4] [send] via NET/IBext_v8/3
    host:pid:tid [6] NCCL INFO Channel 09 : 6[6] -> 7[7] via SHM/direct/direct
    host:pid:tid [0] NCCL INFO Channel 04/0 : 0[0] -> 7[7] via P2P/CUMEM  (P2P/IPC[/read],
                                                               P2P/direct pointer)
    host:pid:tid [4] NCCL INFO comm 0x.. rank 36 nranks 64 cudaDev 4 ... - Init COMPLETE
    host:pid:tid [0] NCCL INFO comm 0x.. rank 0 nranks 4 cudaDev 0 busId 6000 - Abort COMPLETE
    host:pid:tid [1] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer
        <addr> with error 4, opcode 32564, len 32564, vendor err 81 (Send)       (2.7-2.19)
    host:pid:tid [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer <addr> with
        status=12 opcode=129 len=65536 vendor err 129 (Recv) localGid .. remoteGids ..  (2.20+)

Only numbers and bounded identifiers leave this module: the transport from a fixed
vocabulary (:data:`TRANSPORTS`), HCA names that look like RDMA device names (at most
:data:`MAX_NAME` characters), the version as digits, warning kinds from :data:`WARNING_KINDS`,
IB completion statuses as rdma-core's ``enum ibv_wc_status`` names and vendor errors as
numbers 0-255. Ranks, channels, peers, addresses, GIDs and free text are never kept.

Untrusted input: at most :data:`MAX_LINE` characters of a line are looked at, every pattern
is RE2 (linear time, :mod:`agent.throughput.linear`), every repetition is bounded, and
:class:`NcclRun` keeps bounded state (at most :data:`MAX_PIDS` processes' HCA lists and
:data:`MAX_HCAS` HCA names per stream).

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
from dataclasses import dataclass
from typing import TypeVar

from agent.throughput.linear import compile_linear

T = TypeVar("T")

#: characters of a line looked at (NCCL's longest lines, a NET/IB list of 32 HCAs, are < 1 KiB)
MAX_LINE = 4096
#: longest HCA name kept (mlx5_bond_12 is 12)
MAX_NAME = 64
#: HCAs one NET/IB list may name (more are ignored)
MAX_LIST = 64
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

#: the ``transport`` label: how a channel connection moves data, as NCCL names it
TRANSPORTS = (
    "NET/IB",  # NCCL's own IB verbs transport, or an IB plugin (IBext, IBext_v8 ...)
    "NET/Socket",
    "NET/other",  # another network plugin (AWS Libfabric, gIB ...)
    "P2P/CUMEM",
    "P2P/IPC",
    "P2P/direct",  # same process: "P2P/direct pointer"
    "SHM",
    "other",
)
#: network transports: the connections that leave the node
NET_TRANSPORTS = ("NET/IB", "NET/Socket", "NET/other")
#: the ``kind`` of an ``NCCL WARN`` line, in the order the kinds are tried
WARNING_KINDS = (
    "ib_completion",  # Got completion ... with error/status (a failed IB work request)
    "ib_async_event",  # NET/IB : mlx5_0:1 Got async event : ...
    "ibv_call",  # Call to ibv_... failed
    "proxy",  # [Proxy Service N] / [Service thread] failures
    "socket",  # socketProgress, Connection closed/refused, socket recv failures
    "timeout",
    "cuda",  # Cuda failure 'out of memory', Failed to CUDA calloc
    "other",
)
#: the kinds that say the network itself failed a transfer
NETWORK_WARNING_KINDS = ("ib_completion", "ib_async_event", "ibv_call", "socket", "timeout")
#: rdma-core's ``enum ibv_wc_status`` (verbs.h), lower case without the prefix, by value
IB_WC_STATUSES = (
    "success",
    "loc_len_err",
    "loc_qp_op_err",
    "loc_eec_op_err",
    "loc_prot_err",
    "wr_flush_err",
    "mw_bind_err",
    "bad_resp_err",
    "loc_access_err",
    "rem_inv_req_err",
    "rem_access_err",
    "rem_op_err",
    "retry_exc_err",
    "rnr_retry_exc_err",
    "loc_rdd_viol_err",
    "rem_inv_rd_req_err",
    "rem_abort_err",
    "inv_eecn_err",
    "inv_eec_state_err",
    "fatal_err",
    "resp_timeout_err",
    "general_err",
    "tm_err",
    "tm_rndv_incomplete",
)

# --- the lines ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Version:
    """``NCCL version 2.18.3+cuda12.2``: ``version`` is ``2.18.3``."""

    version: str


@dataclass(frozen=True, slots=True)
class IbDevices:
    """``NET/IB : Using [0]mlx5_0:1/IB ...``: the HCAs NCCL's IB transport will use, in the
    order channel lines index them (``NET/IB/<index>``); empty for ``No device found``."""

    devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel connection: its transport, GPUDirect RDMA (``/GDRDMA``), for a network
    transport the index of the NIC in the process's NET list, and the ranks it joins
    (``ranks``: sender, receiver, as the line prints them; None for 2.4's ``Ring`` lines,
    whose numbers are not always ranks)."""

    transport: str
    gdr: bool
    net_index: int | None = None
    ranks: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class NcclWarning:
    """An ``NCCL WARN`` line: its kind and, for an IB completion error, the work completion's
    status name and vendor error (None when the line is another kind)."""

    kind: str
    ib_status: str | None = None
    vendor_error: str | None = None


@dataclass(frozen=True, slots=True)
class InitComplete:
    """A communicator finished initialising (``... - Init COMPLETE``); ``bus_id``: the PCI
    address of its GPU when the line names it (``busId 18000``, 2.7+), else None."""

    bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    """A communicator was aborted (``... - Abort COMPLETE``); ``bus_id`` as for an init."""

    bus_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommDevice:
    """Another line of a communicator that names its GPU (``ncclCommInitRank comm ... cudaDev
    6 nvmlDev 6 busId 90000 ... - Init START``, ``... - Destroy COMPLETE``): which GPU the
    printing process drives, as a PCI address. ``Init START`` (2.17+) also names the
    communicator (``commId 0x...``, the same on every rank of it) and the process's rank in
    it: ``comm_id`` and ``rank`` (None on other lines)."""

    bus_id: str
    comm_id: str | None = None
    rank: int | None = None
    #: the host name of the line's ``host:pid:tid`` prefix (at most :data:`MAX_NAME`
    #: characters), on ``Init START`` lines only
    host: str | None = None


Event = Version | IbDevices | Channel | NcclWarning | InitComplete | Abort | CommDevice
#: a process and the CUDA device of the printing thread (:attr:`NcclLine.process`)
Process = tuple[int, int | None]


@dataclass(frozen=True, slots=True)
class NcclLine:
    """A recognised line: its event, the printing process's pid and the CUDA device its
    thread was on (``host:pid:tid [dev]``; both None without a prefix)."""

    event: Event
    pid: int | None = None
    dev: int | None = None

    @property
    def process(self) -> tuple[int, int | None] | None:
        """The (pid, CUDA device) a channel or communicator line belongs to: one process may
        drive several GPUs (nccl-tests ``-g 8``), each thread on one device."""
        return None if self.pid is None else (self.pid, self.dev)


# RE2 patterns: every repetition bounded, nothing that can backtrack (RE2 cannot anyway)
_MARK = compile_linear(r"NCCL (INFO|WARN) |NCCL version ")
#: the prefix before the marker: host:pid:tid [dev] and, for WARN, the source file:line
_PREFIX = compile_linear(r":(\d{1,10}):\d{1,10} \[(\d{1,4})\] (?:[\w./-]{1,128}:\d{1,6} )?$")
_VERSION = compile_linear(r"^NCCL version (\d{1,2}\.\d{1,3}\.\d{1,3})(?:[+.\s]|$)")
_VERSION_BARE = compile_linear(r"^(\d{1,2}\.\d{1,3}\.\d{1,3})(?:[+.\s]|$)")
_IB_LIST = compile_linear(r"^NET/IB ?: ?(Using|No device found)")
_IB_DEV = compile_linear(r"\[(\d{1,3})\]([A-Za-z0-9][A-Za-z0-9_.-]{0,63}):\d{1,3}/(?:IB|RoCE)")
_CHANNEL = compile_linear(
    r"^(Channel|Ring) \d{1,3}(?:/\d{1,3})? : +(\d{1,7})(?:\[[0-9a-fA-Fx]{1,18}\])? -> "
    r"(\d{1,7})(?:\[[0-9a-fA-Fx]{1,18}\])?(?: \[(?:send|receive)\])? via ([^\r\n]{1,96})"
)
_NET_VIA = compile_linear(
    r"^NET/([A-Za-z][A-Za-z0-9_ ]{0,31}?)/(\d{1,3})(?:\(\d{1,7}\))?((?:/[A-Za-z]{1,16}){0,4})"
)
_IBEXT = compile_linear(r"^IB(?:ext(?:_v\d{1,3})?)?$")
_COMPLETION = compile_linear(
    r"Got completion (?:from peer (?:[^\s]{1,160} )?)?with "
    r"(?:error (\d{1,3}), opcode \d{1,10}, len \d{1,10}, vendor err (\d{1,10})"
    r"|status=(\d{1,3}) opcode=\d{1,10} len=\d{1,10} vendor err (\d{1,10}))"
)
_IBV_CALL = compile_linear(r"Call to ibv_[a-z_]{1,40} failed")
#: the GPU of a communicator line: NCCL prints its PCI address packed into hex digits
_BUS_ID = compile_linear(r" cudaDev \d{1,4} (?:nvmlDev \d{1,4} )?busId ([0-9a-fA-F]{1,12})(?: |$)")
#: ``Init START`` (2.17+): ``comm 0x.. rank R nranks N cudaDev D [nvmlDev D ]busId B commId 0x..``
_COMM_RANK = compile_linear(r" rank (\d{1,7}) nranks \d{1,7} cudaDev ")
_COMM_ID = compile_linear(r" commId (0x[0-9a-fA-F]{1,16}) ")


def parse_nccl_line(line: str) -> NcclLine | None:
    """What one line of a job's output says about NCCL, or None when it is not one of the
    lines above (most lines: a line without ``NCCL`` in its first :data:`MAX_LINE`
    characters costs one substring search)."""
    window = line[:MAX_LINE]
    if "NCCL" not in window:
        return None
    m = _MARK.search(window)
    if m is None:
        return None
    head, msg = window[: m.start()], window[m.end() :]
    pm = _PREFIX.search(head) if head else None
    pid = int(pm.group(1) or "0") if pm is not None else None
    dev = int(pm.group(2) or "0") if pm is not None else None
    level = m.group(1)
    if level is None:  # "NCCL version ..." without the INFO prefix (up to 2.21)
        if " " in head.strip():  # quoted inside another line (a PyTorch error, say)
            return None
        vm = _VERSION_BARE.search(msg)
        return NcclLine(Version(vm.group(1) or ""), pid, dev) if vm is not None else None
    event = _info(msg) if level == "INFO" else _warning(msg)
    if isinstance(event, CommDevice) and event.comm_id is not None and pm is not None:
        words = head[: pm.start()].split()
        host = words[-1][-MAX_NAME:] if words else ""
        event = CommDevice(event.bus_id, event.comm_id, event.rank, host)
    return NcclLine(event, pid, dev) if event is not None else None


def _info(msg: str) -> Event | None:
    if msg.startswith("NCCL version"):
        vm = _VERSION.search(msg)
        return Version(vm.group(1) or "") if vm is not None else None
    if msg.startswith("NET/IB"):
        lm = _IB_LIST.search(msg)
        if lm is None:
            return None
        if lm.group(1) != "Using":
            return IbDevices(())
        listed = msg[lm.end() :]
        oob = listed.find("OOB")
        if oob >= 0:
            listed = listed[:oob]
        devices: list[str] = []
        for dm in _IB_DEV.finditer(listed):
            if len(devices) >= MAX_LIST or int(dm.group(1) or "-1") != len(devices):
                break  # NCCL numbers its list 0, 1, 2 ...: anything else is not its list
            devices.append(dm.group(2) or "")
        return IbDevices(tuple(devices))
    if msg.startswith(("Channel ", "Ring ")):
        cm = _CHANNEL.search(msg)
        if cm is None:
            return None
        channel = _channel(cm.group(4) or "")
        if cm.group(1) == "Channel":
            ranks = (int(cm.group(2) or "0"), int(cm.group(3) or "0"))
            channel = Channel(channel.transport, channel.gdr, channel.net_index, ranks)
        return channel
    bus = _bus_id(msg) if "busId " in msg else None
    if msg.endswith(("- Init COMPLETE", "- Init COMPLETE\r")):
        return InitComplete(bus)
    if msg.endswith(("- Abort COMPLETE", "- Abort COMPLETE\r")):
        return Abort(bus)
    if bus is None:
        return None
    if msg.endswith(("- Init START", "- Init START\r")):
        rm, im = _COMM_RANK.search(msg), _COMM_ID.search(msg)
        if rm is not None and im is not None:
            return CommDevice(bus, (im.group(1) or "").lower(), int(rm.group(1) or "0"))
    return CommDevice(bus)


def bus_id_address(packed: int) -> str:
    """NCCL's packed bus id (``busIdToInt64`` of ``0000:18:00.0`` is 0x18000) as the PCI
    address sysfs names the device by: domain, bus, device and function, as NCCL's own
    ``int64ToBusId`` unpacks it."""
    return (
        f"{packed >> 20:04x}:{(packed >> 12) & 0xFF:02x}:{(packed >> 4) & 0xFF:02x}."
        f"{packed & 0xF:01x}"
    )


def _bus_id(msg: str) -> str | None:
    bm = _BUS_ID.search(msg)
    return bus_id_address(int(bm.group(1) or "0", 16)) if bm is not None else None


def _channel(via: str) -> Channel:
    if via.startswith("NET/"):
        nm = _NET_VIA.search(via)
        if nm is None:
            return Channel("NET/other", False)
        plugin = nm.group(1) or ""
        flags = (nm.group(3) or "").split("/")
        if _IBEXT.search(plugin) is not None:
            transport = "NET/IB"
        elif plugin == "Socket":
            transport = "NET/Socket"
        else:
            transport = "NET/other"
        return Channel(transport, "GDRDMA" in flags, int(nm.group(2) or "0"))
    if via.startswith("P2P/"):
        kind = via[4:].split("/", 1)[0].split(" ", 1)[0]
        transport = {"CUMEM": "P2P/CUMEM", "IPC": "P2P/IPC", "direct": "P2P/direct"}.get(
            kind, "other"
        )
        return Channel(transport, False)
    if via.startswith("SHM"):
        return Channel("SHM", False)
    return Channel("other", False)


def _warning(msg: str) -> NcclWarning:
    cm = _COMPLETION.search(msg)
    if cm is not None:
        status = cm.group(1) if cm.group(1) is not None else cm.group(3)
        vendor = cm.group(2) if cm.group(2) is not None else cm.group(4)
        return NcclWarning("ib_completion", _status_name(status), _vendor(vendor))
    if "Got async event" in msg:
        return NcclWarning("ib_async_event")
    if _IBV_CALL.search(msg) is not None:
        return NcclWarning("ibv_call")
    if "[Proxy Service" in msg or "[Service thread]" in msg:
        return NcclWarning("proxy")
    low = msg.lower()
    if "socket" in low or "connection closed" in low or "connection refused" in low:
        return NcclWarning("socket")
    if "timeout" in low or "timed out" in low:
        return NcclWarning("timeout")
    if "cuda failure" in low or "failed to cuda" in low:
        return NcclWarning("cuda")
    return NcclWarning("other")


def _status_name(raw: str | None) -> str:
    code = int(raw) if raw else -1
    return IB_WC_STATUSES[code] if 0 <= code < len(IB_WC_STATUSES) else "other"


def _vendor(raw: str | None) -> str:
    code = int(raw) if raw else -1
    return str(code) if 0 <= code <= 255 else "other"


# --- one stream's NCCL state ----------------------------------------------------------------


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
