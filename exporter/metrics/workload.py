"""Metric specs and rendering for the workload sampler: where GPU processes may run, the
NCCL settings they were started with, and whether the node offers GPUDirect RDMA.

Cardinality: no series carries a PID. Per-process values are folded per GPU and container
(``gpu``, ``namespace``, ``pod``, ``container``; the pod labels are empty when the process
is not attributed): mismatch ratios keep the worst process, finding series count
processes, NCCL settings keep each distinct value. NCCL settings are at most one series
per allowlisted variable (agent/workload/sampler.py ``NCCL_ENV_ALLOWLIST``) and value per GPU and
container; values outside a safe character set are exported as ``<redacted>``. A container's
processes may each be started with another value (the values are its text): at most
:data:`MAX_ENV_VALUES` distinct values per variable, GPU and container have a series of their
own, any other reads ``<other>``.
"""

from __future__ import annotations

from agent.workload.findings import PROCESS_FINDING_KINDS, workload_findings
from agent.workload.records import WorkloadSnapshot
from exporter.metrics.spec import Families, MetricSpec

_POD = ("gpu", "namespace", "pod", "container")
#: distinct values of one variable exported per GPU and container
MAX_ENV_VALUES = 4
#: the value of the series that stands for the values past that
OTHER_VALUE = "<other>"

CPU_GPU_NUMA_MISMATCH = MetricSpec(
    "fabricscope_workload_cpu_gpu_numa_mismatch_ratio",
    "gauge",
    "Fraction of a GPU compute process's allowed CPUs (Cpus_allowed_list) outside the GPU's "
    "NUMA node: 0 all local, 1 none local; the worst process of the container on the GPU. "
    "Pod labels are empty when the process is not attributed; absent when the GPU's NUMA "
    "node is unknown.",
    _POD,
    "ratio",
)
CPU_NIC_NUMA_MISMATCH = MetricSpec(
    "fabricscope_workload_cpu_nic_numa_mismatch_ratio",
    "gauge",
    "Fraction of a GPU compute process's allowed CPUs outside the NUMA nodes of the GPU's "
    "nearest RDMA NICs: 0 all local, 1 none local; the worst process of the container on the "
    "GPU. Absent when the GPU has no NIC or a NUMA node is unknown.",
    _POD,
    "ratio",
)
NCCL_ENV_INFO = MetricSpec(
    "fabricscope_workload_nccl_env_info",
    "gauge",
    "An allowlisted NCCL environment variable a GPU compute process was started with; always "
    "1. Values outside a safe character set or longer than 256 characters read <redacted>; "
    "no other variable is ever read or exported. At most 4 distinct values of a variable per "
    "GPU and container have a series; any further value reads <other>.",
    (*_POD, "variable", "value"),
)
FINDING_PROCESSES = MetricSpec(
    "fabricscope_workload_finding_processes",
    "gauge",
    "GPU compute processes of the container on the GPU with a workload finding of this kind "
    "(process_cpus_off_gpu_numa, nccl_ib_disabled, nccl_ib_hca_no_match, "
    "nccl_ib_hca_wrong_numa); 0 for every kind without one.",
    ("kind", *_POD),
)
GPUDIRECT_RDMA_AVAILABLE = MetricSpec(
    "fabricscope_gpudirect_rdma_available",
    "gauge",
    "1 when the node has a kernel path for GPUDirect RDMA: nvidia_peermem or nv_peer_mem "
    "loaded, or the NVIDIA open GPU kernel module on Linux 5.12 or later (DMA-BUF), else 0. "
    "Absent when that cannot be told.",
)
GPUDIRECT_PEERMEM_LOADED = MetricSpec(
    "fabricscope_gpudirect_rdma_peermem_loaded",
    "gauge",
    "1 when the nvidia_peermem (or legacy nv_peer_mem) kernel module is loaded, else 0.",
)

SPECS: tuple[MetricSpec, ...] = (
    CPU_GPU_NUMA_MISMATCH,
    CPU_NIC_NUMA_MISMATCH,
    NCCL_ENV_INFO,
    FINDING_PROCESSES,
    GPUDIRECT_RDMA_AVAILABLE,
    GPUDIRECT_PEERMEM_LOADED,
)

_Row = tuple[str, str, str, str]


def _worst(rows: dict[_Row, float], row: _Row, value: float | None) -> None:
    if value is not None:
        rows[row] = max(value, rows.get(row, value))


def render(snap: WorkloadSnapshot, out: Families) -> None:
    gpu_mismatch: dict[_Row, float] = {}
    nic_mismatch: dict[_Row, float] = {}
    counts: dict[tuple[str, _Row], int] = {}
    row_of: dict[tuple[int, int], _Row] = {}  # (pid, gpu) -> row
    env_values: dict[tuple[_Row, str], set[str]] = {}
    for p in snap.processes:
        pod = (p.pod.namespace, p.pod.pod, p.pod.container) if p.pod else ("", "", "")
        for g in p.gpus:
            row = (str(g.gpu), *pod)
            row_of[(p.pid, g.gpu)] = row
            _worst(gpu_mismatch, row, g.cpu_gpu_numa_mismatch)
            _worst(nic_mismatch, row, g.cpu_nic_numa_mismatch)
            for kind in PROCESS_FINDING_KINDS:
                counts.setdefault((kind, row), 0)
            for s in p.nccl_env or ():
                seen = env_values.setdefault((row, s.name), set())
                if s.value not in seen and len(seen) >= MAX_ENV_VALUES:
                    out.add(NCCL_ENV_INFO, 1, *row, s.name, OTHER_VALUE)
                    continue
                seen.add(s.value)
                out.add(NCCL_ENV_INFO, 1, *row, s.name, s.value)
    for w in workload_findings(snap):
        for gpu in w.gpus:
            key = (w.kind, row_of[(w.pid, gpu)])
            counts[key] += 1
    for row, value in gpu_mismatch.items():
        out.add(CPU_GPU_NUMA_MISMATCH, value, *row)
    for row, value in nic_mismatch.items():
        out.add(CPU_NIC_NUMA_MISMATCH, value, *row)
    for (kind, row), n in counts.items():
        out.add(FINDING_PROCESSES, n, kind, *row)
    gd = snap.gpudirect
    out.add(GPUDIRECT_RDMA_AVAILABLE, gd.available)
    out.add(GPUDIRECT_PEERMEM_LOADED, gd.peermem_loaded)
