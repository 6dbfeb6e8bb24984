"""The throughput sampler's records: what a pass gives the agent (:class:`ThroughputSnapshot`,
with its series, its streams' NCCL facts and, from a supervised child, the state a child
replacing it resumes from) and what the agent gives a pass (:class:`ThroughputInputs`). Frozen
values only: they cross the pipe between the agent and the child as pickles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.core.sysfs import ReadIssue
from agent.kubernetes.pods import PodIndex
from agent.throughput.tail import TAIL_REASONS, TailResume

# the label vocabularies of the NCCL series (what agent.throughput.nccl parses into)

#: the ``transport`` label: how a channel connection moves data, as NCCL names it
TRANSPORTS = (
    "NET/IB",  # NCCL's own IB verbs transport, or an IB plugin (IBext, IBext_v8 ...)
    "NET/Socket",
    "NET/other",  # another network plugin (AWS Libfabric, gIB ...)
    "P2P/CUMEM",
    "P2P/IPC",
    "P2P/direct",  # same process: "P2P/direct pointer"
    "SHM",
    "other",
)
#: network transports: the connections that leave the node
NET_TRANSPORTS = ("NET/IB", "NET/Socket", "NET/other")
#: the ``kind`` of an ``NCCL WARN`` line, in the order the kinds are tried
WARNING_KINDS = (
    "ib_completion",  # Got completion ... with error/status (a failed IB work request)
    "ib_async_event",  # NET/IB : mlx5_0:1 Got async event : ...
    "ibv_call",  # Call to ibv_... failed
    "proxy",  # [Proxy Service N] / [Service thread] failures
    "socket",  # socketProgress, Connection closed/refused, socket recv failures
    "timeout",
    "cuda",  # Cuda failure 'out of memory', Failed to CUDA calloc
    "other",
)
#: the kinds that say the network itself failed a transfer
NETWORK_WARNING_KINDS = ("ib_completion", "ib_async_event", "ibv_call", "socket", "timeout")
#: rdma-core's ``enum ibv_wc_status`` (verbs.h), lower case without the prefix, by value
IB_WC_STATUSES = (
    "success",
    "loc_len_err",
    "loc_qp_op_err",
    "loc_eec_op_err",
    "loc_prot_err",
    "wr_flush_err",
    "mw_bind_err",
    "bad_resp_err",
    "loc_access_err",
    "rem_inv_req_err",
    "rem_access_err",
    "rem_op_err",
    "retry_exc_err",
    "rnr_retry_exc_err",
    "loc_rdd_viol_err",
    "rem_inv_rd_req_err",
    "rem_abort_err",
    "inv_eecn_err",
    "inv_eec_state_err",
    "fatal_err",
    "resp_timeout_err",
    "general_err",
    "tm_err",
    "tm_rndv_incomplete",
)

#: namespace, pod, container, job_name
Labels = tuple[str, str, str, str]

#: reasons counted in ``ThroughputSnapshot.errors_total``
ERROR_REASONS = tuple(
    sorted({*TAIL_REASONS, "bad_regex", "no_match", "too_long_to_parse", "pass_deadline"})
)


@dataclass(frozen=True, slots=True)
class ThroughputSeries:
    """The latest figures one stream printed in one format (None: never printed)."""

    namespace: str
    pod: str
    container: str
    job_name: str
    format: str
    lines_parsed: int
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    iterations_per_second: float | None = None
    step_seconds: float | None = None
    flops_per_gpu: float | None = None
    mfu_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class StreamTime:
    """Wall time (seconds since the epoch) of a stream's last parsed line."""

    namespace: str
    pod: str
    container: str
    job_name: str
    last_parsed_timestamp_seconds: float


@dataclass(frozen=True, slots=True)
class NcclSeries:
    """What one stream's NCCL lines said (:mod:`agent.throughput.nccl`).

    ``channels``: (transport, GPUDirect RDMA, connections) of the current run (the
    container's current log); ``hca_channels``: (HCA, connections) of its NET/IB channels
    whose NET index maps to an HCA NCCL listed; ``warnings``: (kind, lines) for every kind;
    ``ib_errors``: (ibv_wc_status name, vendor error, lines). ``lines``, ``warnings``,
    ``ib_errors``, ``inits`` and ``aborts`` count since the stream was first read.
    ``last_init_timestamp_seconds``: CRI time of the latest ``Init COMPLETE`` (None: none, or a
    plain file without timestamps). ``version``: the latest ``NCCL version`` printed.
    ``gpu_hca_channels``: (GPU PCI address, HCA, connections) of the NET/IB channels whose
    process named its GPU. ``hca_numa``: per HCA whose channels could be judged (the NUMA
    node of the HCA and of the channel's GPU both known, :attr:`ThroughputInputs.numa`),
    (HCA, channels judged, channels whose GPU is on another NUMA node than the HCA).
    ``nvlink_channels``: see :func:`agent.throughput.nccl_join.nvlink_channels`.
    """

    namespace: str
    pod: str
    container: str
    job_name: str
    lines: int
    version: str | None = None
    channels: tuple[tuple[str, bool, int], ...] = ()
    hca_channels: tuple[tuple[str, int], ...] = ()
    warnings: tuple[tuple[str, int], ...] = ()
    ib_errors: tuple[tuple[str, str, int], ...] = ()
    inits: int = 0
    aborts: int = 0
    last_init_timestamp_seconds: float | None = None
    gpu_hca_channels: tuple[tuple[str, str, int], ...] = ()
    hca_numa: tuple[tuple[str, int, int], ...] = ()
    #: (GPU, peer GPU, transport, connections) of channels between two GPUs of this node
    #: that NVML shows joined by NVLink (:attr:`ThroughputInputs.nvlinks`): the addresses
    #: sorted within each pair; a transport other than P2P/* does not use the NVLinks
    nvlink_channels: tuple[tuple[str, str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class StreamResume:
    """One stream as a replacing child takes it over: where its tail stopped (None: never
    opened) and its values and counts (a pickle: only numbers and bounded names)."""

    key: str
    tail: TailResume | None
    state: bytes


@dataclass(frozen=True, slots=True)
class ThroughputResume:
    """What a child replacing this one needs not to count a line twice (see the module
    docstring): every stream, the gzip'd files already read whole, the error counts."""

    streams: tuple[StreamResume, ...] = ()
    gz_done: tuple[str, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ThroughputSnapshot:
    """One pass: series sorted by labels; ``sources`` logs tailed; errors since start;
    ``nccl``: per stream that printed NCCL lines, what they said."""

    series: tuple[ThroughputSeries, ...] = ()
    times: tuple[StreamTime, ...] = ()
    sources: int = 0
    errors_total: tuple[tuple[str, int], ...] = tuple((r, 0) for r in ERROR_REASONS)
    issues: tuple[ReadIssue, ...] = ()
    #: bytes known to have been written to a log and never read (see agent.throughput.tail)
    unread_bytes_total: int = 0
    #: estimated bytes, and lines, of rotated files deleted before they could be listed
    #: (see agent.throughput.gaps)
    missed_bytes_total: int = 0
    missed_lines_total: int = 0
    nccl: tuple[NcclSeries, ...] = ()
    #: for a supervised child's replacement (None: not kept, in process); not compared
    resume: ThroughputResume | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ThroughputInputs:
    """What the sampler needs from the rest of the agent each pass: the (namespace, pod)
    pairs holding a GPU of this node (None: no attribution answer) and the API server's pod
    index (None: not watching). Sent to the child process when it changes (the index is
    compared by identity: the watcher replaces it on every change)."""

    gpu_pods: frozenset[tuple[str, str]] | None = None
    index: PodIndex | None = None
    #: the NUMA node of each GPU (by PCI address) and RDMA device (by name) of the node, from
    #: sysfs (None: not known; a device whose platform reports no node is left out)
    numa: tuple[tuple[str, int], ...] | None = None
    #: pairs of this node's GPUs (PCI addresses) joined by active NVLinks, with how many, from
    #: NVML (None: not known)
    nvlinks: tuple[tuple[str, str, int], ...] | None = None
