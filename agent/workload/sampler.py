"""The workload sampler: how the processes using the GPUs are placed and configured.

For every GPU compute process NVML lists, it reads two files below ``--path.procfs`` and
judges them against the PCI topology:

``<pid>/status``
    ``Cpus_allowed_list``: the CPUs the scheduler may run the process on (its affinity mask,
    already narrowed by the container's cpuset). Judged against the NUMA node of each of
    its GPUs and of that GPU's nearest NICs (:func:`cpus_outside`): the fraction of allowed
    CPUs outside that node, 0 when all are local. ``NSpid``: the pid the process sees
    itself as (what NCCL reports of it, :mod:`agent.ras`).
``<pid>/environ``
    The environment the process was *started* with (a later ``setenv``, e.g. Python's
    ``os.environ[...] = ...`` before ``init_process_group``, does not show there; nor do
    ``/etc/nccl.conf`` and ``NCCL_CONF_FILE``). Environments hold secrets, so the buffer is
    parsed at once and every entry whose name is not in :data:`NCCL_ENV_ALLOWLIST` is
    dropped without being decoded, kept, logged or counted; an allowlisted value is kept only
    if it is at most :data:`MAX_VALUE_LENGTH` characters of :data:`SAFE_VALUE_CHARS`, else it
    becomes :data:`REDACTED`. One number more is kept: the process's rank in the whole job
    as its launcher set it (:data:`LAUNCH_RANK_VARIABLES`), which says which node asks the
    job's NCCL RAS service. The buffer itself lives only for that parse. Never read
    environ through a :class:`~agent.core.sysfs.RecordingReader` (``fabricscope snapshot`` would
    archive every file it read): :class:`WorkloadSampler` refuses one.
``<pid>/ns/net``
    Which network namespace the process runs in, compared with the host init process's
    (``1/ns/net``) and the agent's own (``self/ns/net``): a process in either shares the
    loopback the agent sees (the DaemonSet's agent runs in the host's; on a machine whose
    shell is itself in a namespace of its own, a job started beside the agent shares the
    agent's, not init's). Read with the same privilege as environ; unreadable, it is unknown
    (no issue counted).

Pod identity (namespace, pod, container and, under the static CPU manager, the container's
``cpu_ids`` from kubelet's pod-resources API) is not read here (``agent.kubernetes.attribution`` and
``agent.kubernetes.cgroup`` own that): an injected callable maps PIDs to it, and when it fails the
hardware judgements are still exported.

GPUDirect RDMA
    A kernel path lets RDMA NICs read and write GPU memory when ``nvidia_peermem`` (or the
    legacy ``nv_peer_mem``) is loaded (``module/<name>`` in sysfs; ``/proc/modules`` when
    sysfs has no ``module`` directory), or through DMA-BUF when the NVIDIA *open* GPU kernel
    module is loaded (``/proc/driver/nvidia/version``) on Linux 5.12 or later
    (``/proc/sys/kernel/osrelease``). DMA-BUF also needs NIC driver and rdma-core support
    and an NCCL that uses it (2.19+); those are not checked.

Findings (each counted per GPU by ``fabricscope_workload_finding_processes``)
    ``process_cpus_off_gpu_numa``: none of the process's allowed CPUs is on a GPU's NUMA
    node, or the process is pinned (its allowed CPUs miss some CPU of the host) and some of
    them lie outside the NUMA nodes of all its GPUs. An unpinned process is not a finding:
    NCCL pins its own threads next to the GPU within the allowed set.
    ``nccl_ib_disabled``: ``NCCL_IB_DISABLE`` non-zero, or ``NCCL_NET=Socket``, on a node
    with RDMA NICs: NCCL sends inter-node traffic over TCP sockets.
    ``nccl_ib_hca_no_match``: ``NCCL_IB_HCA`` selects none of the node's RDMA devices.
    ``nccl_ib_hca_wrong_numa``: ``NCCL_IB_HCA`` selects RDMA devices, none of them on the
    NUMA node of one of the process's GPUs.
    ``gpudirect_rdma_unavailable`` (node): GPUs and RDMA NICs, but no GPUDirect RDMA path.

Errors
    PIDs are NVML's, the host's: read them through the host's /proc mounted at
    ``--path.procfs`` (no ``hostPID`` needed; docs/install.md), with ``CAP_SYS_PTRACE`` to read
    the environ of other users' processes (the optional ``workload-environ`` component).
    A process that exits mid-scan costs itself: an issue with reason ``vanished`` and it is
    left out. An unreadable environ (``permission``) leaves that process's NCCL settings
    unknown (``None``), the rest of it is kept. Issue details carry only the OS error text,
    never file contents. ``NoData`` when there is no
    GPU compute process and no RDMA NIC.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.core.errors import NoData
from agent.core.sysfs import Issues, ReadIssue, RecordingReader, SysfsReader, classify_os_error
from agent.kubernetes.attribution import AttributionSnapshot
from agent.nvml.snapshot import NvmlGpu, NvmlSnapshot
from agent.pci.sampler import NumaNode, PciSnapshot, parse_cpulist
from agent.pci.topology import Topology, analyse

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

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
#: the first kernel with DMA-BUF support in RDMA memory registration
DMABUF_MIN_KERNEL = (5, 12)


# -- samples -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who a process belongs to, from kubelet's pod-resources API (via the injected
    mapping). ``cpu_ids`` are the container's exclusive CPUs under the static CPU manager,
    ``None`` otherwise."""

    namespace: str
    pod: str
    container: str
    cpu_ids: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True, order=True)
class NcclSetting:
    """One allowlisted NCCL variable as the process was started with it; ``value`` is the
    value itself or :data:`REDACTED`."""

    name: str
    value: str


@dataclass(frozen=True, slots=True)
class GpuPlacement:
    """One of a process's GPUs and where the process may run relative to it.

    Mismatch values are fractions of the allowed CPUs outside a NUMA node (0 all local,
    1 none local), ``None`` when a NUMA node or CPU list is unknown. ``nic_numa_nodes`` are
    the known NUMA nodes of the GPU's nearest NICs.
    """

    gpu: int
    pci_bus_id: str | None
    uuid: str | None
    numa_node: int | None
    nearest_rdma_devices: tuple[str, ...] = ()
    nic_numa_nodes: tuple[int, ...] = ()
    cpu_gpu_numa_mismatch: float | None = None
    cpu_nic_numa_mismatch: float | None = None
    #: the same judgement for the container's kubelet-assigned ``cpu_ids``, when given
    container_cpu_gpu_numa_mismatch: float | None = None


@dataclass(frozen=True, slots=True)
class WorkloadProcess:
    """One GPU compute process. ``nccl_env`` is ``None`` when its environ could not be read
    (``()``: read, no allowlisted variable set). ``pinned`` is True when its allowed CPUs
    miss some CPU of the host, ``None`` when the host's CPUs are unknown.

    ``ns_pid``: the pid as the process sees itself, in its own PID namespace (the last
    ``NSpid`` of its status; the host pid when it runs in the host's). ``launch_rank``: its
    rank in the whole job as its launcher set it (:data:`LAUNCH_RANK_VARIABLES`; None: none
    set, or environ unreadable). ``host_network``: whether it runs in the network namespace
    of the host's init process or of the agent itself, whose loopback the agent reaches
    (None: its ``ns/net`` link could not be read, which needs the same privilege as its
    environ)."""

    pid: int
    gpus: tuple[GpuPlacement, ...]
    allowed_cpus: tuple[int, ...]
    pinned: bool | None
    nccl_env: tuple[NcclSetting, ...] | None
    pod: PodIdentity | None = None
    ns_pid: int | None = None
    launch_rank: int | None = None
    host_network: bool | None = None

    def setting(self, name: str) -> str | None:
        for s in self.nccl_env or ():
            if s.name == name:
                return s.value
        return None


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    """An RDMA device of the node (``mlx5_0``), its PCI function and NUMA node."""

    name: str
    pci_bus_id: str
    numa_node: int | None


NvidiaModule = Literal["open", "proprietary", "absent"]


@dataclass(frozen=True, slots=True)
class GpuDirect:
    """Whether a kernel path for GPUDirect RDMA exists. ``None`` = could not be told.

    ``peermem_module`` names the loaded peer-memory module (``nvidia_peermem``,
    ``nv_peer_mem``); ``nvidia_module`` is the NVIDIA GPU kernel module's flavour
    (``absent``: no NVIDIA driver loaded); ``kernel`` is the running kernel's (major, minor).
    """

    peermem_loaded: bool | None = None
    peermem_module: str | None = None
    nvidia_module: NvidiaModule | None = None
    kernel: tuple[int, int] | None = None

    @property
    def dmabuf_capable(self) -> bool | None:
        """The open GPU kernel module on a kernel with DMA-BUF memory registration."""
        if self.nvidia_module is None:
            return None
        if self.nvidia_module != "open":
            return False
        return None if self.kernel is None else self.kernel >= DMABUF_MIN_KERNEL

    @property
    def available(self) -> bool | None:
        dmabuf = self.dmabuf_capable
        if self.peermem_loaded or dmabuf:
            return True
        if self.peermem_loaded is None or dmabuf is None:
            return None
        return False


@dataclass(frozen=True, slots=True)
class WorkloadSnapshot:
    """GPU compute processes (by PID), the node's RDMA devices (in PCI order) and its
    GPUDirect state."""

    processes: tuple[WorkloadProcess, ...] = ()
    rdma_devices: tuple[RdmaDevice, ...] = ()
    has_gpus: bool = False
    #: the NUMA nodes and their CPUs, from the PCI snapshot the judgements used
    numa_nodes: tuple[NumaNode, ...] = ()
    gpudirect: GpuDirect = GpuDirect()
    issues: tuple[ReadIssue, ...] = ()


# -- parsers (pure) ----------------------------------------------------------------------


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


def parse_modules(text: str) -> frozenset[str]:
    """Names of the modules ``/proc/modules`` lists as ``Live`` (lines ``name size refcount
    deps state address``; kernels without the state column count as live)."""
    out = set()
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) >= 5 and fields[4] != "Live":
            continue
        out.add(fields[0])
    return frozenset(out)


def parse_nvidia_version(text: str) -> bool:
    """Whether ``/proc/driver/nvidia/version`` is the open GPU kernel module's
    (``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05 ...``) rather than
    the proprietary one's (``NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.76 ...``)."""
    first = text.splitlines()[0] if text.strip() else ""
    if not first.startswith("NVRM version:"):
        raise ValueError("no NVRM version line")
    return "Open Kernel Module" in first


def parse_kernel_release(text: str) -> tuple[int, int]:
    """``"6.8.0-45-generic"`` -> (6, 8)."""
    m = re.match(r"\s*([0-9]+)\.([0-9]+)", text)
    if m is None:
        raise ValueError("not a kernel release")
    return int(m.group(1)), int(m.group(2))


def cpus_outside(allowed: Iterable[int], local: Iterable[int]) -> float | None:
    """The fraction of ``allowed`` CPUs not in ``local``; ``None`` when ``allowed`` is
    empty."""
    allowed_set = set(allowed)
    if not allowed_set:
        return None
    return len(allowed_set - set(local)) / len(allowed_set)


# -- reading -----------------------------------------------------------------------------


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


def _peermem_from_sysfs(issues: Issues) -> tuple[bool, str | None]:
    sys = issues.reader
    live = [
        m
        for m in PEERMEM_MODULES
        if sys.is_dir(f"module/{m}")
        # a module still loading ("coming") or unloading ("going") serves no one
        and issues.read_optional(f"module/{m}/initstate", str.strip) in (None, "live")
    ]
    return bool(live), (live[0] if live else None)


def read_gpudirect(proc_issues: Issues, sys_issues: Issues) -> GpuDirect:
    """The node's GPUDirect RDMA state (see the module docstring). ``proc_issues`` reads
    through the procfs reader, ``sys_issues`` through the sysfs one."""
    proc = proc_issues.reader
    loaded: bool | None
    module: str | None = None
    if sys_issues.reader.is_dir("module"):
        loaded, module = _peermem_from_sysfs(sys_issues)
    elif proc.exists("modules"):
        names = proc_issues.read("modules", parse_modules)
        if names is None:
            loaded = None
        else:
            live = [m for m in PEERMEM_MODULES if m in names]
            loaded, module = bool(live), (live[0] if live else None)
    else:
        loaded = False  # no loadable modules at all (CONFIG_MODULES=n): no peer-memory client
    flavour: NvidiaModule | None = "absent"
    if proc.exists("driver/nvidia/version"):
        is_open = proc_issues.read("driver/nvidia/version", parse_nvidia_version)
        flavour = None if is_open is None else "open" if is_open else "proprietary"
    kernel = proc_issues.read_optional("sys/kernel/osrelease", parse_kernel_release)
    return GpuDirect(loaded, module, flavour, kernel)


class _Process:
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


def read_process(proc: SysfsReader, pid: int, issues: Issues) -> _Process | None:
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
    return _Process(pid, allowed, settings, ns_pid=ns_pid, rank=rank, netns=netns)


# -- the sampler --------------------------------------------------------------------------

NvmlSource = Callable[[], NvmlSnapshot | None]
PciSource = Callable[[], PciSnapshot | None]
PodSource = Callable[[], Mapping[int, PodIdentity]]


class WorkloadSampler:
    """Judges the GPU compute processes of the latest NVML snapshot against the latest PCI
    snapshot. ``proc`` is rooted at ``--path.procfs``, ``sys`` at ``--path.sysfs``; ``nvml``
    and ``pci`` return the runner's latest snapshots (``None`` when there is none); ``pods``
    maps host PIDs to pod identity (optional; a failure costs only the pod labels)."""

    name = "workload"

    def __init__(
        self,
        proc: SysfsReader,
        sys: SysfsReader,
        nvml: NvmlSource,
        pci: PciSource,
        pods: PodSource | None = None,
    ) -> None:
        if isinstance(proc, RecordingReader):
            raise ValueError(
                "the workload sampler reads /proc/<pid>/environ: a recording reader would "
                "archive whole environments (secrets) into a snapshot"
            )
        self.proc = proc
        self.sys = sys
        self._nvml = nvml
        self._pci = pci
        self._pods = pods
        self._topo: tuple[PciSnapshot, Topology] | None = None
        self._gpudirect_logged: tuple[bool | None] | None = None  # (available,) once logged
        self._pods_failing = False

    def _topology(self, pci: PciSnapshot) -> Topology:
        if self._topo is None or self._topo[0] is not pci:
            self._topo = (pci, analyse(pci))
        return self._topo[1]

    def _pod_map(self, issues: Issues) -> Mapping[int, PodIdentity]:
        if self._pods is None:
            return {}
        try:
            mapping = self._pods()
        except Exception as exc:  # injected enrichment: its failure must not cost the pass
            issues.add("pods", "io", type(exc).__name__)
            if not self._pods_failing:
                log.warning("workload: pod mapping failed (%s); pod labels absent", exc)
            self._pods_failing = True
            return {}
        if self._pods_failing:
            log.info("workload: pod mapping works again")
        self._pods_failing = False
        return mapping

    def sample(self) -> WorkloadSnapshot:
        nvml = self._nvml()
        pci = self._pci()
        topo = self._topology(pci) if pci is not None else None
        rdma = _rdma_devices(pci)
        gpus_by_pid = _gpus_by_pid(nvml)
        if not gpus_by_pid and not rdma:
            raise NoData("no GPU compute process and no RDMA device")
        issues = Issues(self.proc)
        sys_issues = Issues(self.sys)
        gpudirect = read_gpudirect(issues, sys_issues)
        if (gpudirect.available,) != self._gpudirect_logged:
            log.info(
                "workload: GPUDirect RDMA available: %s (peer-memory module %s)",
                gpudirect.available,
                gpudirect.peermem_module or "not loaded",
            )
            self._gpudirect_logged = (gpudirect.available,)
        pods = self._pod_map(issues) if gpus_by_pid else {}
        host_netns = loopback_netns(self.proc) if gpus_by_pid else frozenset()
        processes = []
        for pid in sorted(gpus_by_pid):
            facts = read_process(self.proc, pid, issues)
            if facts is None:
                continue
            processes.append(
                _judge(facts, gpus_by_pid[pid], pci, topo, pods.get(pid), host_netns=host_netns)
            )
        has_gpus = bool(nvml is not None and nvml.gpus) or bool(pci and pci.by_role("gpu"))
        return WorkloadSnapshot(
            processes=tuple(processes),
            rdma_devices=rdma,
            has_gpus=has_gpus,
            numa_nodes=pci.numa_nodes if pci is not None else (),
            gpudirect=gpudirect,
            issues=(*issues.freeze(), *sys_issues.freeze()),
        )


# -- placement ---------------------------------------------------------------------------


def _known(node: int | None) -> int | None:
    return node if node is not None and node >= 0 else None


def _rdma_devices(pci: PciSnapshot | None) -> tuple[RdmaDevice, ...]:
    if pci is None:
        return ()
    found = [
        RdmaDevice(name, nic.address, _known(nic.numa_node))
        for nic in pci.by_role("nic")
        for name in nic.rdma_devices
    ]
    return tuple(sorted(found, key=lambda d: (d.pci_bus_id, d.name)))


def _gpus_by_pid(nvml: NvmlSnapshot | None) -> dict[int, list[NvmlGpu]]:
    out: dict[int, list[NvmlGpu]] = {}
    for gpu in nvml.gpus if nvml is not None else ():
        for p in gpu.compute_processes or ():
            out.setdefault(p.pid, []).append(gpu)
    return out


def _node_cpus(pci: PciSnapshot | None) -> dict[int, tuple[int, ...]]:
    if pci is None:
        return {}
    return {n.node: n.cpus for n in pci.numa_nodes if n.cpus is not None}


def _host_cpus(pci: PciSnapshot | None) -> frozenset[int] | None:
    """Every CPU of the host's NUMA nodes; None when a node's CPU list is unknown."""
    if pci is None or not pci.numa_nodes or any(n.cpus is None for n in pci.numa_nodes):
        return None
    return frozenset(c for n in pci.numa_nodes for c in n.cpus or ())


def _place(
    gpu: NvmlGpu,
    allowed: tuple[int, ...],
    container_cpus: tuple[int, ...] | None,
    pci: PciSnapshot | None,
    topo: Topology | None,
) -> GpuPlacement:
    dev = pci.get(gpu.pci_bus_id) if pci is not None and gpu.pci_bus_id else None
    if dev is None or pci is None:
        return GpuPlacement(gpu.index, gpu.pci_bus_id, gpu.uuid, None)
    nodes = _node_cpus(pci)
    numa = _known(dev.numa_node)
    local = nodes.get(numa) if numa is not None else None
    aff = next((a for a in topo.affinity if a.address == dev.address), None) if topo else None
    nics = [n for a in (aff.nearest_nics if aff else ()) if (n := pci.get(a)) is not None]
    nic_nodes = sorted({k for n in nics if (k := _known(n.numa_node)) is not None})
    nic_local: set[int] | None = None
    if nic_nodes and all(k in nodes for k in nic_nodes):
        nic_local = {c for k in nic_nodes for c in nodes[k]}
    return GpuPlacement(
        gpu=gpu.index,
        pci_bus_id=dev.address,
        uuid=gpu.uuid,
        numa_node=numa,
        nearest_rdma_devices=tuple(r for n in nics for r in n.rdma_devices),
        nic_numa_nodes=tuple(nic_nodes),
        cpu_gpu_numa_mismatch=cpus_outside(allowed, local) if local is not None else None,
        cpu_nic_numa_mismatch=cpus_outside(allowed, nic_local) if nic_local is not None else None,
        container_cpu_gpu_numa_mismatch=(
            cpus_outside(container_cpus, local) if container_cpus and local is not None else None
        ),
    )


def _judge(
    facts: _Process,
    gpus: Sequence[NvmlGpu],
    pci: PciSnapshot | None,
    topo: Topology | None,
    pod: PodIdentity | None,
    *,
    host_netns: frozenset[str] = frozenset(),
) -> WorkloadProcess:
    host = _host_cpus(pci)
    pinned = None if host is None else not host <= set(facts.allowed)
    container_cpus = pod.cpu_ids if pod is not None else None
    placements = tuple(
        _place(g, facts.allowed, container_cpus, pci, topo)
        for g in sorted(gpus, key=lambda g: g.index)
    )
    return WorkloadProcess(
        pid=facts.pid,
        gpus=placements,
        allowed_cpus=facts.allowed,
        pinned=pinned,
        nccl_env=facts.env,
        pod=pod,
        ns_pid=facts.ns_pid,
        launch_rank=facts.rank,
        host_network=(None if facts.netns is None or not host_netns else facts.netns in host_netns),
    )


def pod_identities(
    nvml: NvmlSnapshot | None, pods: AttributionSnapshot | None
) -> dict[int, PodIdentity]:
    """Which pod each GPU compute process belongs to: a process on GPUs that all belong to
    one container gets that container's identity (and its exclusive CPUs, if any); a process
    on a GPU shared by several containers, or on GPUs of different containers, gets none
    (guessing would blame the wrong pod)."""
    if nvml is None or pods is None:
        return {}
    owners: dict[int, set[tuple[str, str, str]]] = {}
    for a in pods.gpus:
        if a.gpu is not None:
            owners.setdefault(a.gpu, set()).add((a.namespace, a.pod, a.container))
    cpus = {(c.namespace, c.pod, c.container): c.cpu_ids for c in pods.cpus}
    per_pid: dict[int, set[tuple[str, str, str]]] = {}
    for gpu in nvml.gpus:
        for proc in gpu.compute_processes or ():
            per_pid.setdefault(proc.pid, set()).update(owners.get(gpu.index, {("", "", "")}))
    out: dict[int, PodIdentity] = {}
    for pid, who in per_pid.items():
        if len(who) == 1:
            ns, pod, container = next(iter(who))
            if pod:
                out[pid] = PodIdentity(ns, pod, container, cpus.get((ns, pod, container)) or None)
    return out
