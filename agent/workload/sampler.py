"""The workload sampler: how the processes using the GPUs are placed and configured.

For every GPU compute process NVML lists, it reads files below ``--path.procfs``
(:mod:`agent.workload.process`) and judges them against the PCI topology
(:mod:`agent.workload.placement`); the snapshot's records are in
:mod:`agent.workload.records`:

``<pid>/status``
    ``Cpus_allowed_list``: the CPUs the scheduler may run the process on (its affinity mask,
    already narrowed by the container's cpuset). Judged against the NUMA node of each of
    its GPUs and of that GPU's nearest NICs
    (:func:`~agent.workload.placement.cpus_outside`): the fraction of allowed CPUs outside
    that node, 0 when all are local. ``NSpid``: the pid the process sees itself as (what
    NCCL reports of it, :mod:`agent.ras`).
``<pid>/environ``
    The environment the process was *started* with (a later ``setenv``, e.g. Python's
    ``os.environ[...] = ...`` before ``init_process_group``, does not show there; nor do
    ``/etc/nccl.conf`` and ``NCCL_CONF_FILE``). Environments hold secrets, so the buffer is
    parsed at once and every entry whose name is not in
    :data:`~agent.workload.process.NCCL_ENV_ALLOWLIST` is dropped without being decoded,
    kept, logged or counted; an allowlisted value is kept only if it is at most
    :data:`~agent.workload.process.MAX_VALUE_LENGTH` characters of
    :data:`~agent.workload.process.SAFE_VALUE_CHARS`, else it becomes
    :data:`~agent.workload.process.REDACTED`. One number more is kept: the process's rank
    in the whole job as its launcher set it
    (:data:`~agent.workload.process.LAUNCH_RANK_VARIABLES`), which says which node asks the
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

GPUDirect RDMA (:mod:`agent.workload.gpudirect`)
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

import logging
from collections.abc import Callable, Mapping

from agent.core.errors import NoData
from agent.core.sysfs import Issues, RecordingReader, SysfsReader
from agent.kubernetes.attribution import AttributionSnapshot
from agent.nvml.snapshot import NvmlSnapshot
from agent.pci.sampler import PciSnapshot
from agent.pci.topology import Topology, analyse
from agent.workload.gpudirect import read_gpudirect
from agent.workload.placement import gpus_by_pid, judge, rdma_devices
from agent.workload.process import loopback_netns, read_process
from agent.workload.records import PodIdentity, WorkloadSnapshot

log = logging.getLogger(__name__)

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
        rdma = rdma_devices(pci)
        by_pid = gpus_by_pid(nvml)
        if not by_pid and not rdma:
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
        pods = self._pod_map(issues) if by_pid else {}
        host_netns = loopback_netns(self.proc) if by_pid else frozenset()
        processes = []
        for pid in sorted(by_pid):
            facts = read_process(self.proc, pid, issues)
            if facts is None:
                continue
            processes.append(
                judge(facts, by_pid[pid], pci, topo, pods.get(pid), host_netns=host_netns)
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
