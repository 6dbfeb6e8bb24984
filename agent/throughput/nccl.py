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
vocabulary (``TRANSPORTS``, with the series' other label vocabularies in
:mod:`agent.throughput.records`), HCA names that look like RDMA device names (at most
:data:`MAX_NAME` characters), the version as digits, warning kinds from ``WARNING_KINDS``,
IB completion statuses as rdma-core's ``enum ibv_wc_status`` names and vendor errors as
numbers 0-255. Ranks, channels, peers, addresses, GIDs and free text are never kept.

Untrusted input: at most :data:`MAX_LINE` characters of a line are looked at, every pattern
is RE2 (linear time, :mod:`agent.throughput.linear`) and every repetition is bounded. What
a stream's lines add up to, in bounded state and bounded series, is
:class:`agent.throughput.nccl_run.NcclRun`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.throughput.linear import compile_linear
from agent.throughput.records import IB_WC_STATUSES

#: characters of a line looked at (NCCL's longest lines, a NET/IB list of 32 HCAs, are < 1 KiB)
MAX_LINE = 4096
#: longest HCA name kept (mlx5_bond_12 is 12)
MAX_NAME = 64
#: HCAs one NET/IB list may name (more are ignored)
MAX_LIST = 64

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
