"""Metric specs and rendering for what NCCL itself printed into a job's log: the transports
and HCAs its channels use, its warnings, its communicator inits and aborts (the throughput
sampler reads the lines, :mod:`agent.throughput.nccl` parses them).

Every series carries the throughput series' ``namespace``, ``pod``, ``container`` and
``job_name``; none carries a rank, channel or peer. The transport mix of a job::

    sum by (namespace, job_name, transport, gdr) (fabricscope_nccl_channels)

A job's pods whose network channels run over sockets while their node has active RDMA
ports, over IB without GPUDirect RDMA where the node has a peer-memory path, or through an
HCA on another NUMA node than their GPU are the alerts of ``deploy/rules/throughput.rules.yaml``.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.throughput.records import WARNING_KINDS, NcclSeries
from exporter.metrics.spec import Families, MetricSpec

_J = ("namespace", "pod", "container", "job_name")
_P = "fabricscope_nccl_"
_RUN = (
    " Counted over the current run: the container's current log (a restarted container starts "
    "again); an agent started mid-job reads the log's first MiB for what NCCL chose, and only "
    "what its first read reaches of a log the kubelet rotated since."
)

INFO = MetricSpec(
    _P + "info",
    "gauge",
    "The NCCL version the job's processes printed (NCCL version line), value 1.",
    (*_J, "version"),
)
CHANNELS = MetricSpec(
    _P + "channels",
    "gauge",
    "Channel connections NCCL set up, by transport (NET/IB: NCCL's IB verbs transport or an "
    "IB plugin such as IBext_v8; NET/Socket; NET/other: another network plugin; P2P/CUMEM, "
    "P2P/IPC, P2P/direct, SHM, other) and GPUDirect RDMA (gdr 1: NCCL printed /GDRDMA)." + _RUN,
    (*_J, "transport", "gdr"),
)
HCA_CHANNELS = MetricSpec(
    _P + "hca_channels",
    "gauge",
    "Network channel connections over NET/IB by the HCA they use (the NET index of the "
    "channel line mapped through the NET/IB list the same process printed). At most 64 HCA "
    "names per container and 256 per node have a series of their own; channels through any "
    "other name are counted under device other." + _RUN,
    (*_J, "device"),
)
HCA_CHANNELS_OFF_GPU_NUMA = MetricSpec(
    _P + "hca_channels_off_gpu_numa",
    "gauge",
    "NET/IB channel connections through this HCA whose process drives a GPU on another NUMA "
    "node than the HCA (the GPU from the busId of the process's communicator lines, both "
    "NUMA nodes from sysfs): traffic crosses the CPU interconnect on its way to the NIC. 0 "
    "when every judged channel is local; absent for an HCA whose channels could not be "
    "judged (no busId line, or a NUMA node unknown)." + _RUN,
    (*_J, "device"),
)
NVLINK_PEER_CHANNELS = MetricSpec(
    _P + "nvlink_peer_channels",
    "gauge",
    "Channel connections between two GPUs of this node that NVML shows joined by NVLink "
    "(pci_bus_id < peer_pci_bus_id), by the transport NCCL chose: P2P/* moves the data over "
    "the NVLinks; SHM (through host memory) and NET/* (through a NIC or sockets) do not, "
    "typically because the two ranks' containers cannot share memory or peer access is off "
    "(NCCL_P2P_DISABLE). The two ranks of a channel are matched to GPUs through the Init "
    "START lines (NCCL 2.17+) of any log read on this node, so two containers with one GPU "
    "each are judged together." + _RUN,
    (*_J, "pci_bus_id", "peer_pci_bus_id", "transport"),
)
WARNINGS = MetricSpec(
    _P + "warnings_total",
    "counter",
    "NCCL WARN lines by kind: ib_completion (a failed IB work request), ib_async_event, "
    "ibv_call (a verbs call failed), proxy, socket, timeout, cuda, other.",
    (*_J, "kind"),
)
IB_COMPLETION_ERRORS = MetricSpec(
    _P + "ib_completion_errors_total",
    "counter",
    "NCCL WARN lines of a failed IB work completion, by its status (rdma-core's ibv_wc_status "
    "name: retry_exc_err is transport retries exceeded, wr_flush_err a flushed request after "
    "the queue pair failed) and vendor error (0-255, mlx5's syndrome). At most 16 pairs per "
    "container and 256 per node have a series of their own (the first seen keep it); lines "
    "of any other pair are counted under status and vendor_error other, so none is lost.",
    (*_J, "status", "vendor_error"),
)
INITS = MetricSpec(
    _P + "communicator_inits_total",
    "counter",
    "NCCL communicators that finished initialising (Init COMPLETE lines).",
    _J,
)
ABORTS = MetricSpec(
    _P + "communicator_aborts_total",
    "counter",
    "NCCL communicators aborted (Abort COMPLETE lines).",
    _J,
)
LAST_INIT = MetricSpec(
    _P + "last_init_timestamp_seconds",
    "gauge",
    "CRI log time of the latest Init COMPLETE line (container logs only).",
    _J,
    "seconds",
)
LINES = MetricSpec(
    _P + "lines_total",
    "counter",
    "Log lines recognised as NCCL's own (version, HCA list, channel, warning, a communicator's "
    "init START with its GPU, init, abort).",
    _J,
)

SPECS: tuple[MetricSpec, ...] = (
    INFO,
    CHANNELS,
    HCA_CHANNELS,
    HCA_CHANNELS_OFF_GPU_NUMA,
    NVLINK_PEER_CHANNELS,
    WARNINGS,
    IB_COMPLETION_ERRORS,
    INITS,
    ABORTS,
    LAST_INIT,
    LINES,
)


def render(series: Sequence[NcclSeries], out: Families) -> None:
    for s in series:
        j = (s.namespace, s.pod, s.container, s.job_name)
        if s.version is not None:
            out.add(INFO, 1, *j, s.version)
        for transport, gdr, n in s.channels:
            out.add(CHANNELS, n, *j, transport, "1" if gdr else "0")
        for device, n in s.hca_channels:
            out.add(HCA_CHANNELS, n, *j, device)
        for device, _judged, off in s.hca_numa:
            out.add(HCA_CHANNELS_OFF_GPU_NUMA, off, *j, device)
        for gpu, peer, transport, n in s.nvlink_channels:
            out.add(NVLINK_PEER_CHANNELS, n, *j, gpu, peer, transport)
        warned = dict(s.warnings)
        for kind in WARNING_KINDS:
            out.add(WARNINGS, warned.get(kind, 0), *j, kind)
        for status, vendor, n in s.ib_errors:
            out.add(IB_COMPLETION_ERRORS, n, *j, status, vendor)
        out.add(INITS, s.inits, *j)
        out.add(ABORTS, s.aborts, *j)
        out.add(LAST_INIT, s.last_init_timestamp_seconds, *j)
        out.add(LINES, s.lines, *j)
