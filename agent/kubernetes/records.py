"""What pod attribution answers: the records of one pass (which container holds which GPU,
MIG slice, RDMA device, IMEX channel and exclusive CPUs), the snapshot that carries them, and
the error counters the sampler and its watch thread share.

Records only: no reading, no joining (:mod:`agent.kubernetes.join` makes them from the
kubelet's allocations, :mod:`agent.kubernetes.attribution` samples).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from agent.core.sysfs import ReadIssue

#: how an attribution was obtained
METHODS = ("cgroup", "podresources")
#: reasons counted in ``AttributionSnapshot.errors_total``
ERROR_REASONS = ("api_error", "api_forbidden", "cgroup_parse", "kubelet_unavailable")


@dataclass(frozen=True, slots=True)
class GpuAttribution:
    """A GPU allocated to (``podresources``) or used by (``cgroup``) a container.

    ``uuid`` is the GPU's UUID, a MIG device's own UUID, or the device plugin's id as it was
    when it is neither; ``gpu`` is NVML's index of the GPU (a MIG device's parent), None when
    the NVML snapshot does not know it. ``claim``: the ResourceClaim it came with (Dynamic
    Resource Allocation), empty for a device plugin's. ``mig``: which MIG slice of the GPU
    (``gi11/ci0``, the DRA driver's ``mig-1g.18gb-19-0``, or ``unknown``), empty for a
    whole GPU.
    """

    namespace: str
    pod: str
    container: str
    uuid: str
    gpu: int | None
    pci_bus_id: str | None
    method: str
    claim: str = ""
    mig: str = ""


@dataclass(frozen=True, slots=True)
class RdmaAttribution:
    """An RDMA or SR-IOV device allocated to a container (``podresources`` only).

    ``device_id`` is the device plugin's id as it is; ``device`` the RDMA device it resolves
    to in the InfiniBand snapshot and ``pci_bus_id`` its PCI address (a VF's own address even
    when its RDMA device is not visible on the host), each None when unknown. For a claim
    (Dynamic Resource Allocation) ``resource`` is the driver's name and ``device_id`` the
    driver's device name (else its CDI device name). ``pf_pci_bus_id`` and ``pf_device``:
    the physical function a virtual function rides on and its RDMA device, whose port is
    the cable to the switch; None for a physical function.
    """

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str
    device: str | None
    pci_bus_id: str | None
    claim: str = ""
    pf_pci_bus_id: str | None = None
    pf_device: str | None = None


@dataclass(frozen=True, slots=True, order=True)
class ImexChannelAttribution:
    """An IMEX channel a container holds through a ComputeDomain claim (NVIDIA's DRA
    driver, ``compute-domain.nvidia.com``): the container is in a multi-node NVLink domain.
    No GPU: the pod's GPUs come with its other claims (or a device plugin)."""

    namespace: str
    pod: str
    container: str
    claim: str
    channel: int


@dataclass(frozen=True, slots=True)
class ContainerCpus:
    """The exclusive CPUs of a container (static CPU manager policy)."""

    namespace: str
    pod: str
    container: str
    cpu_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AttributionSnapshot:
    """One pass: attributions sorted, the methods that worked, errors counted since start."""

    gpus: tuple[GpuAttribution, ...] = ()
    rdma: tuple[RdmaAttribution, ...] = ()
    cpus: tuple[ContainerCpus, ...] = ()
    imex_channels: tuple[ImexChannelAttribution, ...] = ()
    #: (method, worked this pass) for every method in :data:`METHODS`
    methods_up: tuple[tuple[str, bool], ...] = tuple((m, False) for m in METHODS)
    #: (reason, count since the agent started) for every reason in :data:`ERROR_REASONS`
    errors_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in ERROR_REASONS)
    issues: tuple[ReadIssue, ...] = ()
    #: None when this pass established which GPUs pods hold, else why not (a reason of
    #: :data:`agent.kubernetes.allocation.UNKNOWN_REASONS`)
    allocation_unknown: str | None = None
    #: NVML had not answered yet when this pass ran: the GPU rows lack their index and PCI
    #: address and would gain them a pass later (a second identity for each series), so they
    #: are not exported this pass; they still count for the allocation above
    gpus_pending: bool = False

    @property
    def pods(self) -> int:
        """Distinct pods holding at least one attributed GPU or RDMA device."""
        gpu_pods = {(a.namespace, a.pod) for a in self.gpus}
        return len(gpu_pods | {(a.namespace, a.pod) for a in self.rdma})


class ErrorCounts:
    """Thread-safe error counters (the watch thread and sampling passes both count)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(ERROR_REASONS, 0)

    def add(self, reason: str, n: int = 1) -> None:
        if reason not in self._counts:
            raise ValueError(f"unknown attribution error reason {reason}")
        with self._lock:
            self._counts[reason] += n

    def totals(self) -> tuple[tuple[str, int], ...]:
        with self._lock:
            return tuple(sorted(self._counts.items()))
