"""Pod attribution: which pod and container holds each GPU and RDMA device of this node.

Two methods, each named in the snapshot's records:

``podresources``
    The kubelet's pod-resources ``List`` (:mod:`agent.kubernetes.podresources`) on the local
    socket: what every container was *allocated*. It is asked on a pass when the pod watch
    (below) has seen a pod of the node change since the last answer, when that answer is
    :data:`KUBELET_LIST_MAX_AGE_SECONDS` old, and on every pass while there is no healthy
    watch or the last ``List`` failed: the kubelet assigns devices when it starts a pod's
    containers, and the pod's status changes after that, so an answer stands until the
    node's pods change (each call costs the agent a gRPC channel and its threads, and the
    kubelet an answer). GPU device ids are GPU or MIG UUIDs
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

The module samples (the kubelet's ``List``, the host's CDI specs and procfs, cgroups); the
records it answers with are :mod:`agent.kubernetes.records`, the pure join of allocations to
hardware :mod:`agent.kubernetes.join` (both re-exported here for callers).

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
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from agent.cdi.nvidia import read_gpu_minors, read_mig_capabilities
from agent.cdi.registry import DEFAULT_CDI_ROOT, CdiIndex, CdiRegistry
from agent.core.errors import NoData
from agent.core.sysfs import Issues, ReadIssue, SysfsReader, classify_os_error
from agent.infiniband.records import InfinibandSnapshot
from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.cgroup import PodContainer, pod_container
from agent.kubernetes.claims import HostView, claim_devices
from agent.kubernetes.join import (
    RDMA_RESOURCE_PREFIXES,
    attribute_allocations,
    attribute_imex_channels,
    is_gpu_resource,
    is_rdma_resource,
    normalize_pci_address,
    resolve_gpu,
    resolve_rdma,
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
from agent.kubernetes.records import (
    ERROR_REASONS,
    METHODS,
    AttributionSnapshot,
    ContainerCpus,
    ErrorCounts,
    GpuAttribution,
    ImexChannelAttribution,
    RdmaAttribution,
)
from agent.nvml.snapshot import NvmlSnapshot

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

#: the names callers import from here (records and joins live in their own modules)
__all__ = [
    "ERROR_REASONS",
    "KUBELET_LIST_MAX_AGE_SECONDS",
    "METHODS",
    "RDMA_RESOURCE_PREFIXES",
    "AttributionSampler",
    "AttributionSnapshot",
    "ContainerCpus",
    "ErrorCounts",
    "GpuAttribution",
    "ImexChannelAttribution",
    "RdmaAttribution",
    "attribute_allocations",
    "attribute_imex_channels",
    "gpu_allocation",
    "is_gpu_resource",
    "is_rdma_resource",
    "normalize_pci_address",
    "resolve_gpu",
    "resolve_rdma",
]

log = logging.getLogger(__name__)

#: the longest the kubelet's last ``List`` answer stands while the pod watch sees no pod of
#: the node change (a missed event costs at most this long)
KUBELET_LIST_MAX_AGE_SECONDS = 300.0


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
    ``kubelet_max_age_seconds``: how long a ``List`` answer stands while the pod watch is
    healthy and sees no change (module doc; 0: ask every pass).
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
        kubelet_max_age_seconds: float = KUBELET_LIST_MAX_AGE_SECONDS,
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
        self._kubelet_max_age = kubelet_max_age_seconds
        # the last List's answer, the pod index it was asked under, and when
        self._listed: tuple[tuple[PodAllocation, ...], PodIndex, float] | None = None

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

        allocations = self._list_kubelet(socket)
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

    def _list_kubelet(self, socket: bool) -> tuple[PodAllocation, ...] | None:
        """The kubelet's allocations: its last answer while it stands (module doc), else a
        new ``List``; None when the socket is absent or the call failed."""
        if self._kubelet is None:
            return None
        # read before the call: a pod that changes while it runs is asked about next pass
        index = self.watcher.index if self.watcher is not None and self.watcher.healthy else None
        now = time.monotonic()
        last = self._listed
        if (
            socket
            and index is not None
            and last is not None
            and last[1] is index
            and now - last[2] < self._kubelet_max_age
        ):
            return last[0]
        self._listed = None
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
        if index is not None:
            self._listed = (pods, index, now)
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
