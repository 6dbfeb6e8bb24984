"""What is read of one GPU compute process below ``--path.procfs``, and how.

``<pid>/status``
    ``Cpus_allowed_list``: the CPUs the scheduler may run the process on (its affinity mask,
    already narrowed by the container's cpuset). ``NSpid``: the pid the process sees itself
    as (what NCCL reports of it, :mod:`agent.ras`).
``<pid>/environ``
    The environment the process was *started* with. Environments hold secrets, so the buffer
    is parsed at once and every entry whose name is not in :data:`NCCL_ENV_ALLOWLIST` is
    dropped without being decoded, kept, logged or counted; an allowlisted value is kept only
    if it is at most :data:`MAX_VALUE_LENGTH` characters of :data:`SAFE_VALUE_CHARS`, else it
    becomes :data:`REDACTED`. One number more is kept: the process's rank in the whole job
    as its launcher set it (:data:`LAUNCH_RANK_VARIABLES`). The buffer itself lives only for
    that parse.
``<pid>/ns/net``
    Which network namespace the process runs in (:func:`read_netns`), compared with the ones
    whose loopback the agent reaches (:func:`loopback_netns`).

``parse_*`` are pure; ``read_*`` touch the procfs reader. The whole story, the privileges
and the errors: :mod:`agent.workload.sampler`.
"""

from __future__ import annotations

import errno
import logging
import re

from agent.core.sysfs import Issues, SysfsReader, classify_os_error
from agent.pci.sampler import parse_cpulist
from agent.workload.records import NcclSetting

log = logging.getLogger(__name__)

#: The NCCL variables read from a process's environment, and why each matters to the
#: fabric. Nothing else is ever kept. Ordered by name.
NCCL_ENV_ALLOWLIST: tuple[tuple[str, str], ...] = (
    ("NCCL_ALGO", "collective algorithms allowed (Ring, Tree, NVLS, CollNet ...)"),
    ("NCCL_COLLNET_ENABLE", "in-network reduction (SHARP) on or off"),
    ("NCCL_CROSS_NIC", "whether rings/trees may use different NICs on different nodes"),
    ("NCCL_DEBUG", "NCCL log level (what the job's logs will show)"),
    ("NCCL_DMABUF_ENABLE", "GPUDirect RDMA through DMA-BUF on or off"),
    ("NCCL_IB_DISABLE", "non-zero: no InfiniBand/RoCE, inter-node traffic over TCP"),
    ("NCCL_IB_GID_INDEX", "RoCE GID index (RoCE v1/v2, IPv4/IPv6 address)"),
    ("NCCL_IB_HCA", "which RDMA devices and ports NCCL may use"),
    ("NCCL_IB_RETRY_CNT", "InfiniBand retry count before a QP errors out"),
    ("NCCL_IB_SL", "InfiniBand service level (QoS lane)"),
    ("NCCL_IB_TC", "RoCE traffic class (DSCP/PFC priority)"),
    ("NCCL_IB_TIMEOUT", "InfiniBand ACK timeout exponent"),
    ("NCCL_NET", "network transport forced by name (IB, Socket, a plugin's name)"),
    ("NCCL_NET_GDR_LEVEL", "up to which GPU-NIC path type GPUDirect RDMA is used"),
    ("NCCL_NET_GDR_READ", "GPUDirect RDMA for sends (reads from GPU memory)"),
    ("NCCL_NET_PLUGIN", "which network plugin library NCCL loads"),
    ("NCCL_NVLS_ENABLE", "NVLink SHARP (NVSwitch reductions) on or off"),
    ("NCCL_P2P_DISABLE", "GPU peer-to-peer (NVLink/PCIe) transport off"),
    ("NCCL_P2P_LEVEL", "up to which GPU-GPU path type peer-to-peer is used"),
    ("NCCL_PROTO", "protocols allowed (LL, LL128, Simple)"),
    ("NCCL_RAS_ADDR", "where the job's RAS service answers queries (default localhost:28028)"),
    ("NCCL_RAS_ENABLE", "0: no RAS service (no job-wide health queries, no hang detection)"),
    ("NCCL_SHM_DISABLE", "shared-memory transport off"),
    ("NCCL_SOCKET_IFNAME", "interfaces for bootstrap and the socket transport"),
    ("NCCL_TOPO_FILE", "topology XML that overrides NCCL's own detection"),
)
ALLOWED_NAMES: frozenset[str] = frozenset(name for name, _ in NCCL_ENV_ALLOWLIST)
_ALLOWED_BYTES: frozenset[bytes] = frozenset(name.encode("ascii") for name in ALLOWED_NAMES)

#: what an allowlisted value becomes when it is too long or has other characters
REDACTED = "<redacted>"
MAX_VALUE_LENGTH = 256
#: every character NCCL's own syntax needs (``^=mlx5_0:1,mlx5_1:1``, ``allreduce:tree;...``,
#: paths, plugin names with spaces), and nothing that quotes, escapes or expands
SAFE_VALUE_CHARS = "A-Za-z0-9 _.,:;=^/+@-"
_SAFE_VALUE = re.compile(f"[{SAFE_VALUE_CHARS}]{{0,{MAX_VALUE_LENGTH}}}")

#: The variables launchers set to a process's rank in the whole job, in the order they are
#: believed: torchrun / torch.distributed, Open MPI, PMIx, MPICH/PMI, Slurm. Only the number is
#: kept (:func:`parse_launch_rank`); the variable itself is not exported.
LAUNCH_RANK_VARIABLES: tuple[str, ...] = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMIX_RANK",
    "PMI_RANK",
    "SLURM_PROCID",
)
_RANK_BYTES = tuple(name.encode("ascii") for name in LAUNCH_RANK_VARIABLES)
_RANK_VALUE = re.compile(rb"[0-9]{1,7}")


def safe_value(raw: bytes) -> str:
    """An allowlisted variable's value as exported: itself when short and made of
    :data:`SAFE_VALUE_CHARS`, else :data:`REDACTED`."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return REDACTED
    return text if _SAFE_VALUE.fullmatch(text) else REDACTED


def parse_nccl_environ(raw: bytes) -> tuple[NcclSetting, ...]:
    """The allowlisted NCCL settings of a ``/proc/<pid>/environ`` buffer (NUL-separated
    ``NAME=value`` entries), sorted by name. Every other entry is skipped as raw bytes,
    never decoded. A name set twice keeps its first value, as ``getenv`` does. Never raises."""
    found: dict[str, NcclSetting] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if not sep or name not in _ALLOWED_BYTES:
            continue
        key = name.decode("ascii")
        if key not in found:
            found[key] = NcclSetting(key, safe_value(value))
    return tuple(sorted(found.values()))


def parse_launch_rank(raw: bytes) -> int | None:
    """The job rank a launcher gave the process, from a ``/proc/<pid>/environ`` buffer: the
    first of :data:`LAUNCH_RANK_VARIABLES` set to a plain number. Never raises; every other
    entry is skipped as raw bytes."""
    found: dict[bytes, bytes] = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in _RANK_BYTES and name not in found:
            found[name] = value
    for name in _RANK_BYTES:
        got = found.get(name)
        if got is not None and _RANK_VALUE.fullmatch(got):
            return int(got)
    return None


def parse_ns_pid(status: str) -> int | None:
    """The pid in the process's own PID namespace: the last field of ``NSpid`` in a
    ``/proc/<pid>/status`` text (None: no such line, a kernel before 4.1)."""
    for line in status.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == "NSpid":
            fields = value.split()
            if fields and fields[-1].isdigit():
                return int(fields[-1])
            return None
    return None


def _status_facts(status: str) -> tuple[tuple[int, ...], int | None]:
    return parse_cpus_allowed(status), parse_ns_pid(status)


def parse_cpus_allowed(status: str) -> tuple[int, ...]:
    """``Cpus_allowed_list`` of a ``/proc/<pid>/status`` text as sorted CPU numbers."""
    for line in status.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == "Cpus_allowed_list":
            cpus = parse_cpulist(value)
            if not cpus:
                raise ValueError("empty Cpus_allowed_list")
            return cpus
    raise ValueError("no Cpus_allowed_list line")


def _reason(exc: OSError) -> str:
    return "vanished" if exc.errno == errno.ESRCH else classify_os_error(exc)


def read_environ(
    proc: SysfsReader, pid: int, issues: Issues
) -> tuple[tuple[NcclSetting, ...], int | None] | None:
    """The allowlisted NCCL settings and the launcher's rank of ``pid``, or None (and an
    issue) when its environ cannot be read. The raw buffer never leaves this function."""
    rel = f"{pid}/environ"
    try:
        raw = proc.read_bytes(rel)
    except OSError as exc:
        issues.add(rel, _reason(exc), exc.strerror or type(exc).__name__)
        return None
    settings = parse_nccl_environ(raw)
    rank = parse_launch_rank(raw)
    del raw
    return settings, rank


def read_netns(proc: SysfsReader, pid: int | str) -> str | None:
    """The ``ns/net`` link of a process (``net:[4026531840]``): which network namespace it
    runs in. None when it cannot be read: reading another user's link needs the privilege
    its environ needs (``CAP_SYS_PTRACE``), and a missing privilege is an expected state
    here, not a file error (its environ read already says so)."""
    try:
        return proc.readlink(f"{pid}/ns/net")
    except OSError as exc:
        log.debug("workload: cannot read %s/ns/net: %s", pid, exc.strerror or exc)
        return None


def loopback_netns(proc: SysfsReader) -> frozenset[str]:
    """The network namespaces whose loopback is the one the agent reaches: the host init
    process's (``1/ns/net``; the DaemonSet's agent runs in the host's) and the agent's own
    (``self/ns/net``: on a machine whose shells run in a namespace of their own, a job started
    beside the agent shares the agent's, not init's). Unreadable links are left out."""
    return frozenset(n for n in (read_netns(proc, 1), read_netns(proc, "self")) if n)


class ProcessFacts:
    """One process's facts read this pass (before placement)."""

    __slots__ = ("allowed", "env", "netns", "ns_pid", "pid", "rank")

    def __init__(
        self,
        pid: int,
        allowed: tuple[int, ...],
        env: tuple[NcclSetting, ...] | None,
        *,
        ns_pid: int | None = None,
        rank: int | None = None,
        netns: str | None = None,
    ) -> None:
        self.pid = pid
        self.allowed = allowed
        self.env = env
        self.ns_pid = ns_pid
        self.rank = rank
        self.netns = netns


def read_process(proc: SysfsReader, pid: int, issues: Issues) -> ProcessFacts | None:
    """Read ``pid``'s status and environ; None when it is gone (or its status
    unreadable). A process that exits after its status was read is dropped too: its
    remaining files name a process that no longer runs."""
    before = len(issues.items)
    facts = issues.read(f"{pid}/status", _status_facts)
    if facts is None:
        return None
    allowed, ns_pid = facts
    env = read_environ(proc, pid, issues)
    netns = read_netns(proc, pid)
    if any(i.reason == "vanished" for i in issues.items[before:]):
        return None
    settings, rank = env if env is not None else (None, None)
    return ProcessFacts(pid, allowed, settings, ns_pid=ns_pid, rank=rank, netns=netns)
