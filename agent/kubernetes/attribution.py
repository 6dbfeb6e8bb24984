"""Pod attribution: which pod and container holds each GPU and RDMA device of this node.

Two methods, each named in the snapshot's records:

``podresources``
    The kubelet's pod-resources ``List`` (:mod:`agent.kubernetes.podresources`), called once per
    pass on
    the local socket: what every container was *allocated*. GPU device ids are GPU or MIG UUIDs
    (index ids and time-slicing's ``<id>::<replica>`` are understood too) and are joined to
    the NVML snapshot for the GPU's index and PCI address; RDMA / SR-IOV device ids are VF PCI
    addresses or RDMA device names and are joined to the InfiniBand snapshot. An id in another
    format is kept as it is, never dropped. The container's exclusive CPUs (static CPU manager)
    come along for the workload checks. Devices allocated through Dynamic Resource
    Allocation come in the same answer, per ResourceClaim: they are resolved through the
    node's CDI specs and the NVIDIA driver's procfs files (:mod:`agent.kubernetes.claims`)
    and carry the claim's name. A GPU several pods share (time-slicing, MPS, one claim
    shared by several pods) is attributed to every one of them; a MIG slice to its parent
    GPU (its NVLinks and PCIe link are the slice's). An SR-IOV virtual function is
    attributed with the physical function it rides on (sysfs ``physfn``), whose port is the
    cable to the switch.

``cgroup``
    For nodes without the socket (or GPUs a pod uses without having been allocated them):
    every GPU process NVML reports -> ``<procfs>/<pid>/cgroup`` -> pod UID and container id
    (:mod:`agent.kubernetes.cgroup`) -> namespace, pod and container name from an in-memory index
    of the
    node's pods, which :class:`~agent.kubernetes.podwatch.PodWatcher` keeps current from the API
    server
    in its own thread, so a pass never waits on the network.

Failures degrade: a failing kubelet or API server leaves devices unattributed and counts an
error (``kubelet_unavailable``, ``api_forbidden``, ``api_error``, ``cgroup_parse``); only a
node with neither a socket nor a node name to watch is :class:`~agent.core.errors.NoData`.
Each pass also says whether it established which GPUs pods hold
(``AttributionSnapshot.allocation_unknown``; :mod:`agent.kubernetes.allocation`): the probe
takes no GPU while it did not.
"""

from __future__ import annotations

import errno
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.cdi.nvidia import read_gpu_minors, read_mig_capabilities
from agent.cdi.registry import DEFAULT_CDI_ROOT, CdiIndex, CdiRegistry
from agent.core.errors import NoData
from agent.core.sysfs import Issues, ReadIssue, SysfsReader, classify_os_error
from agent.infiniband.records import InfinibandSnapshot
from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.cgroup import PodContainer, pod_container
from agent.kubernetes.claims import (
    HostView,
    claim_devices,
    claimed_imex_channels,
    resolve_claim_device,
)
from agent.kubernetes.podresources import (
    DEFAULT_SOCKET,
    KubeletUnavailable,
    PodAllocation,
    PodResourcesClient,
    SocketAbsent,
)
from agent.kubernetes.pods import PodIndex
from agent.kubernetes.podwatch import PodWatcher, WatchSettings, default_api_client
from agent.nvml.mig import MigDevice
from agent.nvml.snapshot import NvmlGpu, NvmlSnapshot

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

#: how an attribution was obtained
METHODS = ("cgroup", "podresources")
#: reasons counted in ``AttributionSnapshot.errors_total``
ERROR_REASONS = ("api_error", "api_forbidden", "cgroup_parse", "kubelet_unavailable")


# --- records ------------------------------------------------------------------------------


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


# --- device ids -> hardware ---------------------------------------------------------------

_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_INDEX = re.compile(r"^(\d+)(?::\d+)?$")  # device-id-strategy=index: "3", MIG "3:1"
_MIG_INDEX = re.compile(r"^(\d{1,4}):(\d{1,4})$")
#: resource-name prefixes of the SR-IOV / RDMA device plugins' usual resource pools
RDMA_RESOURCE_PREFIXES = ("rdma/", "openshift.io/", "intel.com/", "mellanox.com/")


def normalize_pci_address(text: str) -> str | None:
    """``0000:1a:00.2`` for ``0000:1A:00.2`` or ``1a:00.2``; None when not a PCI address."""
    m = _PCI.match(text.strip())
    if not m:
        return None
    domain = (m.group(1) or "0000").lower()
    return f"{domain.zfill(4)}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def is_gpu_resource(resource: str, device_ids: Iterable[str]) -> bool:
    """NVIDIA GPU resources: ``nvidia.com/gpu`` (and renamed shared pools such as
    ``nvidia.com/gpu.shared``), ``nvidia.com/mig-*``, or any ``nvidia.com/`` resource whose
    ids are GPU or MIG UUIDs."""
    if not resource.startswith("nvidia.com/"):
        return False
    kind = resource[len("nvidia.com/") :]
    if kind.startswith(("gpu", "mig-")):
        return True
    return any(i.startswith(("GPU-", "MIG-")) for i in device_ids)


def is_rdma_resource(resource: str) -> bool:
    """SR-IOV and RDMA device-plugin pools by their usual names: ``rdma/*``,
    ``openshift.io/*``, ``intel.com/*``, ``mellanox.com/*``, and any name mentioning rdma,
    sriov or hostdev (``nvidia.com/rdma_shared_device_a``, ``nvidia.com/hostdev``)."""
    low = resource.lower()
    return low.startswith(RDMA_RESOURCE_PREFIXES) or any(
        word in low for word in ("rdma", "sriov", "hostdev")
    )


def resolve_gpu(device_id: str, nvml: NvmlSnapshot | None) -> tuple[str, NvmlGpu | None]:
    """(uuid, NVML GPU) for one ``nvidia.com`` device id.

    ``GPU-<uuid>`` is looked up by UUID; ``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470)
    names its parent; ``MIG-<uuid>`` (R470 on) does not, and is looked up among the MIG
    devices NVML enumerated (:mod:`agent.nvml.mig`) for its parent (None when NVML knows no
    such MIG device); ``3`` or ``3:1`` (device-id-strategy=index) is looked up by index and
    reports the GPU's UUID; time-slicing's ``<id>::<replica>`` is the device ``<id>``.
    """
    raw = device_id.split("::", 1)[0]
    gpus = nvml.gpus if nvml is not None else ()
    by_uuid = {g.uuid.lower(): g for g in gpus if g.uuid}
    if raw.startswith("GPU-"):
        return raw, by_uuid.get(raw.lower())
    if raw.startswith("MIG-GPU-"):
        return raw, by_uuid.get(raw[len("MIG-") :].split("/", 1)[0].lower())
    if raw.startswith("MIG-"):
        mig = _mig_device(raw, nvml)
        return raw, next((g for g in gpus if mig is not None and g.index == mig.gpu), None)
    m = _INDEX.match(raw)
    if m:
        index = int(m.group(1))
        gpu = next((g for g in gpus if g.index == index), None)
        whole = ":" not in raw
        return (gpu.uuid if whole and gpu is not None and gpu.uuid else raw), gpu
    return raw, None


def resolve_rdma(device_id: str, ib: InfinibandSnapshot | None) -> tuple[str | None, str | None]:
    """(RDMA device, PCI address) for one RDMA / SR-IOV device id: a PCI address is matched
    against the RDMA devices' PCI addresses (and kept as the address when none matches), a
    name against their names; anything else resolves to (None, None)."""
    devices = ib.devices if ib is not None else ()
    pci = normalize_pci_address(device_id)
    if pci is not None:
        dev = next((d for d in devices if d.pci_bus_id == pci), None)
        return (dev.name if dev is not None else None), pci
    dev = next((d for d in devices if d.name == device_id), None)
    if dev is not None:
        return dev.name, dev.pci_bus_id
    return None, None


#: (resource, device id, RDMA device, PCI address) of one RDMA allocation
RdmaFound = tuple[str, str, str | None, str | None]


def _no_physfn(_pci: str) -> str | None:
    return None


def attribute_allocations(
    pods: Iterable[PodAllocation],
    nvml: NvmlSnapshot | None,
    ib: InfinibandSnapshot | None,
    host: HostView | None = None,
    physfn: Callable[[str], str | None] = _no_physfn,
) -> tuple[list[GpuAttribution], list[RdmaAttribution], list[ContainerCpus]]:
    """Join the kubelet's allocations (device plugins' and ResourceClaims') to the hardware
    snapshots; ``host`` resolves claims' devices, ``physfn`` gives a VF's physical function
    (pure but for those two). A device given twice to one container (two time-slicing
    replicas of one GPU) is one attribution."""
    gpus: dict[GpuAttribution, None] = {}
    rdma: dict[RdmaAttribution, None] = {}
    cpus: list[ContainerCpus] = []
    host = host or HostView()
    ib_devices = ib.devices if ib is not None else ()

    def rdma_row(where: tuple[PodAllocation, str, str], found: RdmaFound) -> RdmaAttribution:
        p, container, claim = where
        resource, device_id, dev, pci = found
        pf = physfn(pci) if pci is not None else None
        pf_dev = next((d.name for d in ib_devices if pf is not None and d.pci_bus_id == pf), None)
        return RdmaAttribution(
            p.namespace, p.name, container, resource, device_id, dev, pci, claim, pf, pf_dev
        )

    for p in pods:
        for c in p.containers:
            if c.cpu_ids:
                cpus.append(ContainerCpus(p.namespace, p.name, c.name, c.cpu_ids))
            for claim in c.claims:
                for cd in claim.devices:
                    r = resolve_claim_device(claim, cd, host, nvml, ib)
                    for cg in r.gpus:
                        gpus[
                            GpuAttribution(
                                p.namespace,
                                p.name,
                                c.name,
                                cg.uuid,
                                cg.gpu,
                                cg.pci_bus_id,
                                "podresources",
                                claim.name,
                                cg.mig,
                            )
                        ] = None
                    for x in r.rdma:
                        found = (cd.driver, r.device_id, x.device, x.pci_bus_id)
                        rdma[rdma_row((p, c.name, claim.name), found)] = None
            for d in c.devices:
                if is_gpu_resource(d.resource_name, d.device_ids):
                    for device_id in d.device_ids:
                        uuid, g = resolve_gpu(device_id, nvml)
                        mig = uuid.startswith("MIG-") or ":" in uuid
                        gpus[
                            GpuAttribution(
                                p.namespace,
                                p.name,
                                c.name,
                                uuid,
                                g.index if g is not None else None,
                                g.pci_bus_id if g is not None else None,
                                "podresources",
                                mig=_mig_label(uuid, nvml) if mig else "",
                            )
                        ] = None
                    continue
                resolved = {i: resolve_rdma(i, ib) for i in d.device_ids}
                if not is_rdma_resource(d.resource_name) and not any(
                    dev is not None for dev, _ in resolved.values()
                ):
                    continue  # another kind of device (FPGA, a non-NVIDIA GPU ...)
                for device_id, (dev, pci) in resolved.items():
                    found = (d.resource_name, device_id, dev, pci)
                    rdma[rdma_row((p, c.name, ""), found)] = None
    return list(gpus), list(rdma), cpus


def attribute_imex_channels(
    pods: Iterable[PodAllocation], host: HostView | None = None
) -> list[ImexChannelAttribution]:
    """The IMEX channels containers hold through ComputeDomain claims (pure but for
    ``host``'s CDI specs); one per (container, claim, channel)."""
    host = host or HostView()
    out: dict[ImexChannelAttribution, None] = {}
    for p in pods:
        for c in p.containers:
            for claim in c.claims:
                for cd in claim.devices:
                    for ch in claimed_imex_channels(cd, host):
                        out[ImexChannelAttribution(p.namespace, p.name, c.name, claim.name, ch)] = (
                            None
                        )
    return sorted(out)


def _mig_device(uuid: str, nvml: NvmlSnapshot | None) -> MigDevice | None:
    """The MIG device NVML enumerated under ``uuid`` (case-insensitive), or None."""
    want = uuid.lower()
    devices = nvml.mig_devices if nvml is not None else ()
    return next((d for d in devices if d.uuid.lower() == want), None)


def _mig_label(device_id: str, nvml: NvmlSnapshot | None) -> str:
    """The ``mig`` of a device plugin's MIG id: ``gi/ci`` from ``MIG-GPU-<uuid>/<gi>/<ci>``,
    from NVML's MIG device for ``MIG-<uuid>``, or index ``3:1``; else ``unknown``."""
    if device_id.startswith("MIG-GPU-"):
        parts = device_id.split("/")
        if len(parts) == 3:
            return f"gi{parts[1]}/ci{parts[2]}"
    mig = _mig_device(device_id, nvml) if device_id.startswith("MIG-") else None
    slot = _MIG_INDEX.match(device_id)
    if slot is not None and nvml is not None:
        # device-id-strategy=index: "<GPU index>:<MIG device slot>", the slot NVML's
        # nvmlDeviceGetMigDeviceHandleByIndex is asked with
        gpu, n = int(slot.group(1)), int(slot.group(2))
        mig = next((d for d in nvml.mig_devices if d.gpu == gpu and d.slot == n), None)
    return mig.instance if mig is not None else "unknown"


# --- the sampler --------------------------------------------------------------------------


class AttributionSampler:
    """Samples pod attribution; needs the latest NVML and InfiniBand snapshots.

    ``gpus`` and ``rdma`` return the runner's latest snapshots (None when absent or failed).
    ``socket_path``: the kubelet's pod-resources socket (None: don't use it). ``node_name``:
    this node's name, which turns on the cgroup method and its API watch; ``api_client``
    builds the API client (default: in-cluster config, else kubeconfig). ``procfs`` reads
    ``<pid>/cgroup`` below ``--path.procfs``. ``first_sync_wait_seconds``: how long the first
    pass may wait for the pod index (0: never wait; useful for one-shot runs). ``sysfs``
    reads a VF's ``physfn`` link and a ``uverbs`` node's RDMA device (None: not resolved);
    ``cdi_root``: the CDI spec directory claims' devices are looked up in (None: claims are
    resolved by device name only).
    ``rdma_unanswered``: True while the InfiniBand sampler has no current answer (no pass
    yet, or its last one failed): RDMA attributions keep its last answer, or wait for its
    first, rather than appear once without their device. ``gpus_unanswered``: the same for
    NVML; GPU rows are kept for the allocation but not exported until NVML first answers.
    """

    name = "attribution"

    def __init__(
        self,
        *,
        gpus: Callable[[], NvmlSnapshot | None],
        rdma: Callable[[], InfinibandSnapshot | None],
        procfs: SysfsReader,
        socket_path: str | None = DEFAULT_SOCKET,
        kubelet_timeout_seconds: float = 2.0,
        node_name: str | None = None,
        api_client: Callable[[], ApiClient] | None = None,
        watch: WatchSettings | None = None,
        first_sync_wait_seconds: float = 0.0,
        sysfs: SysfsReader | None = None,
        cdi_root: str | None = DEFAULT_CDI_ROOT,
        rdma_unanswered: Callable[[], bool] = lambda: False,
        gpus_unanswered: Callable[[], bool] = lambda: False,
    ) -> None:
        self._sysfs = sysfs
        self._cdi = CdiRegistry(cdi_root) if cdi_root else None
        self._gpus = gpus
        self._rdma = rdma
        self._rdma_unanswered = rdma_unanswered
        self._gpus_unanswered = gpus_unanswered
        self._last_ib: InfinibandSnapshot | None = None
        self._nvml_answered = False
        self._procfs = procfs
        self.errors = ErrorCounts()
        self._kubelet = (
            PodResourcesClient(socket_path, timeout_seconds=kubelet_timeout_seconds)
            if socket_path
            else None
        )
        self.watcher = (
            PodWatcher(
                node_name,
                api_client or default_api_client,
                self.errors.add,
                watch or WatchSettings(),
            )
            if node_name
            else None
        )
        self._first_wait = first_sync_wait_seconds
        self._kubelet_state = ""

    def sample(self) -> AttributionSnapshot:
        socket = self._kubelet is not None and self._kubelet.socket_exists()
        if not socket and self.watcher is None:
            where = self._kubelet.socket_path if self._kubelet is not None else "(not set)"
            raise NoData(f"no pod-resources socket at {where} and no node name to watch pods of")
        if self.watcher is not None:
            self.watcher.start()
            if self._first_wait > 0:
                self.watcher.wait_synced(self._first_wait)
                self._first_wait = 0.0
        # asked once, before the snapshot: InfiniBand may answer between the two reads
        rdma_waiting = self._rdma_unanswered()
        gpus_waiting = self._gpus_unanswered()
        nvml, ib = self._gpus(), self._rdma()
        if nvml is not None:
            self._nvml_answered = True
        if ib is not None:
            self._last_ib = ib
        elif rdma_waiting:
            # InfiniBand's last pass failed: its last answer stands, so the RDMA rows keep
            # their device and PCI address (None when it has never answered)
            ib = self._last_ib
        issues = Issues(self._procfs)

        allocations = self._list_kubelet()
        gpus: list[GpuAttribution] = []
        rdma: list[RdmaAttribution] = []
        cpus: list[ContainerCpus] = []
        channels: list[ImexChannelAttribution] = []
        if allocations is not None:
            sys_issues = Issues(self._sysfs) if self._sysfs is not None else None
            host = self._host_view(issues, sys_issues) if claim_devices(allocations) else None
            physfn = (
                (lambda pci: _physfn(pci, sys_issues))
                if sys_issues is not None
                else (lambda _pci: None)
            )
            gpus, rdma, cpus = attribute_allocations(allocations, nvml, ib, host, physfn)
            channels = attribute_imex_channels(allocations, host) if host is not None else []
            if sys_issues is not None:
                issues.items.extend(sys_issues.items)
            if ib is None and rdma_waiting:
                # InfiniBand has not answered yet (the two start together; its first pass
                # may also time out on a busy node): the RDMA rows would lack their device
                # and PCI address now and gain them a pass later, a second identity for each
                # series at every start. They wait for its answer.
                rdma = []

        index = self.watcher.index if self.watcher is not None else None
        if index is not None and nvml is not None:
            seen = {_gpu_key(a) for a in gpus}
            for a in self._by_cgroup(nvml, index, issues):
                if _gpu_key(a) not in seen:
                    seen.add(_gpu_key(a))
                    gpus.append(a)

        up = {
            "podresources": allocations is not None,
            "cgroup": self.watcher is not None and self.watcher.healthy,
        }
        unknown = self._allocation_unknown(allocations is not None, gpus, nvml)
        return AttributionSnapshot(
            gpus=tuple(sorted(gpus, key=_gpu_sort)),
            rdma=tuple(sorted(rdma, key=_rdma_sort)),
            cpus=tuple(sorted(cpus, key=lambda c: (c.namespace, c.pod, c.container))),
            imex_channels=tuple(channels),
            methods_up=tuple((m, up[m]) for m in METHODS),
            errors_total=self.errors.totals(),
            issues=issues.freeze(),
            allocation_unknown=unknown,
            gpus_pending=nvml is None and gpus_waiting and not self._nvml_answered,
        )

    def _host_view(self, issues: Issues, sys_issues: Issues | None) -> HostView:
        """The CDI specs, GPU minors and MIG capabilities, read when some container holds a
        claim (a node without DRA reads none of it)."""
        cdi = self._cdi.scan() if self._cdi is not None else CdiIndex(present=False)
        for i in cdi.issues:
            root = self._cdi.root if self._cdi is not None else ""
            issues.items.append(ReadIssue(f"{root}/{i.path}", i.reason, i.detail))

        def uverbs(n: int) -> str | None:
            if sys_issues is None:
                return None
            return sys_issues.read_optional(
                f"class/infiniband_verbs/uverbs{n}/ibdev", lambda t: t.strip() or None
            )

        return HostView(cdi, read_gpu_minors(issues), read_mig_capabilities(issues), uverbs)

    def _allocation_unknown(
        self, listed: bool, gpus: list[GpuAttribution], nvml: NvmlSnapshot | None
    ) -> str | None:
        """Why this pass cannot tell which GPUs pods hold (module doc of
        :mod:`agent.kubernetes.allocation`), or None."""
        if self._kubelet is not None and not listed:
            # the List failed, or the socket is absent on a Kubernetes node (sample() has
            # raised NoData where there is neither a socket nor a node name)
            return "kubelet_unavailable"
        if any(a.gpu is None and a.method == "podresources" for a in gpus):
            return "nvml_unavailable" if nvml is None else "unmapped_device"
        return None

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
        if self._kubelet is not None:
            self._kubelet.close()

    def _list_kubelet(self) -> tuple[PodAllocation, ...] | None:
        if self._kubelet is None:
            return None
        try:
            pods = self._kubelet.list()
        except SocketAbsent:
            self._kubelet_transition("absent", "")
            return None
        except KubeletUnavailable as exc:
            self.errors.add("kubelet_unavailable")
            self._kubelet_transition("failing", str(exc))
            return None
        self._kubelet_transition("ok", f"{len(pods)} pods")
        return pods

    def _kubelet_transition(self, state: str, detail: str) -> None:
        previous, self._kubelet_state = self._kubelet_state, state
        if state == previous:
            return
        path = self._kubelet.socket_path if self._kubelet is not None else ""
        if state == "ok":
            log.info("kubelet pod-resources at %s: answering (%s)", path, detail)
        elif state == "absent":
            log.info("kubelet pod-resources socket %s absent; GPUs attributed by cgroup", path)
        else:
            log.warning("kubelet pod-resources at %s failing: %s", path, detail)

    def _by_cgroup(
        self, nvml: NvmlSnapshot, index: PodIndex, issues: Issues
    ) -> Iterator[GpuAttribution]:
        where: dict[int, PodContainer | None] = {}
        for g in nvml.gpus:
            for proc in g.compute_processes or ():
                if proc.pid not in where:
                    where[proc.pid] = self._read_cgroup(proc.pid, issues)
                found = where[proc.pid]
                hit = index.lookup(found) if found is not None else None
                if hit is None:
                    continue
                pod, container = hit
                uuid = g.uuid or ""
                yield GpuAttribution(
                    pod.namespace, pod.name, container, uuid, g.index, g.pci_bus_id, "cgroup"
                )

    def _read_cgroup(self, pid: int, issues: Issues) -> PodContainer | None:
        rel = f"{pid}/cgroup"
        try:
            text = self._procfs.read_text(rel)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ESRCH):  # else: the process just exited
                issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
            return None
        try:
            return pod_container(text)
        except ValueError as exc:
            self.errors.add("cgroup_parse")
            issues.add(rel, "parse", str(exc))
            return None


def _physfn(pci: str, issues: Issues) -> str | None:
    """The PCI address of the physical function a VF rides on (``physfn`` link), None for a
    physical function or a VF seen inside a VM (which has no such link)."""
    rel = f"bus/pci/devices/{pci}/physfn"
    try:
        target = issues.reader.readlink(rel)
    except FileNotFoundError:
        return None
    except OSError as exc:
        issues.add(rel, classify_os_error(exc), exc.strerror or str(exc))
        return None
    return normalize_pci_address(target.rstrip("/").rsplit("/", 1)[-1])


def _gpu_key(a: GpuAttribution) -> tuple[str, str, str]:
    return a.namespace, a.pod, str(a.gpu) if a.gpu is not None else a.uuid


def _gpu_sort(a: GpuAttribution) -> tuple[str, str, str, int, str, str, str, str]:
    gpu = a.gpu if a.gpu is not None else -1
    return (a.namespace, a.pod, a.container, gpu, a.mig, a.uuid, a.claim, a.method)


def _rdma_sort(a: RdmaAttribution) -> tuple[str, str, str, str, str, str]:
    return a.namespace, a.pod, a.container, a.resource, a.device_id, a.claim


def gpu_allocation(snap: AttributionSnapshot | None, *, bare_metal: bool = False) -> GpuAllocation:
    """The GPUs pods hold (allocated by the kubelet, or seen using them), for the probe,
    which never runs on them, failing closed: unknown (``no_attribution``) without a
    snapshot, unless ``bare_metal`` (attribution is off on a node that is not a Kubernetes
    node, or found neither a kubelet socket nor a node name: no pod can hold a GPU here)."""
    if snap is None:
        return GpuAllocation() if bare_metal else GpuAllocation(unknown="no_attribution")
    held = frozenset(a.gpu for a in snap.gpus if a.gpu is not None)
    return GpuAllocation(held, snap.allocation_unknown)
