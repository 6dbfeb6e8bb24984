"""What the workload sampler gives: each GPU compute process with its placement relative to
its GPUs and their NICs and its allowlisted NCCL settings, the node's RDMA devices and its
GPUDirect RDMA state (see :mod:`agent.workload.sampler`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.core.sysfs import ReadIssue
from agent.pci.sampler import NumaNode

#: the first kernel with DMA-BUF support in RDMA memory registration
DMABUF_MIN_KERNEL = (5, 12)


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
    value itself or :data:`~agent.workload.process.REDACTED`."""

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
    rank in the whole job as its launcher set it
    (:data:`~agent.workload.process.LAUNCH_RANK_VARIABLES`; None: none set, or environ
    unreadable). ``host_network``: whether it runs in the network namespace
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
