"""The Job dashboard: one training job's throughput beside the evidence of its own GPUs,
NICs and nodes.

The job is a ``job_name`` in a namespace, whatever its framework prints: its variable lists
every job with a throughput series, and its headline reads tokens/s, else samples/s, else
iterations/s, else steps/s from the time per step, the order ``fabricscope explain`` and the
throughput alert use (``exporter/explain/discover.py`` ``THROUGHPUT_METRICS``). Its pods are
those named after the job (``<job>-...``, as Kubernetes controllers name them and explain
assumes) and those printing its throughput (which carry ``job_name``): every panel reads
those pods' GPUs, RDMA devices and nodes, never the rest of the namespace. A pod's SR-IOV
virtual function counts as its physical function (``pf_device``, ``pf_pci_bus_id`` of
``fabricscope_pod_rdma_info``): the port, PCIe link and switch port panels show the physical
port the VF rides on, as ``fabricscope explain`` does.
"""

from __future__ import annotations

from boards.model import NODE, NODE_GPU, NODE_PORT, PROBE_SIZE, RI, Board, N, Panel, Show

NS = 'namespace=~"$namespace"'
#: the job's own series (NCCL's, the throughput's): they carry its job_name
JOB_SERIES = f'{NS},job_name=~"$job"'
#: throughput metrics in explain's order of preference (step_seconds inverted)
THROUGHPUT = (
    ("fabricscope_throughput_tokens_per_second", "tokens/s"),
    ("fabricscope_throughput_samples_per_second", "samples/s"),
    ("fabricscope_throughput_iterations_per_second", "iterations/s"),
    ("fabricscope_throughput_step_seconds", "steps/s"),
)
ANY_THROUGHPUT = "|".join(m for m, _ in THROUGHPUT)
#: the pods printing the job's throughput
PRINTING = f'max by (namespace, pod) ({{__name__=~"{ANY_THROUGHPUT}",{JOB_SERIES},{N}}})'


def job_pods(metric: str) -> str:
    """``metric``'s series of the job's pods: named after the job, or printing its
    throughput (a pod outside the naming, e.g. one named by a fabricscope.io/job
    annotation)."""
    return (
        f'({metric}{{{NS},pod=~"$job-.+",{N}}} or '
        f"({metric}{{{NS},{N}}} and on (namespace, pod) {PRINTING}))"
    )


def headline() -> str:
    """The job's throughput, one series: the first of :data:`THROUGHPUT` it prints, the
    mean over its printing containers, labelled with what it is."""
    parts = []
    for metric, unit in THROUGHPUT:
        mean = f"avg by (job_name) ({metric}{{{JOB_SERIES},{N}}})"
        if metric.endswith("_step_seconds"):
            mean = f"1 / {mean}"
        parts.append(f'label_replace({mean}, "unit", "{unit}", "", "")')
    return " or on (job_name) ".join(parts)


def _physical(series: str, *pairs: tuple[str, str]) -> str:
    """``series`` and, for an SR-IOV virtual function's rows, the same rows relabelled to
    its physical function (``pf_device`` as ``device``, ``pf_pci_bus_id`` as
    ``pci_bus_id``): a VF has no port and no PCIe link of its own, its physical function's
    port is the cable to the switch. A physical function's rows (``pf_*`` empty) are left
    as they are, so ``or`` drops their unchanged copy."""
    relabelled = series
    for target, source in pairs:
        relabelled = f'label_replace({relabelled}, "{target}", "$1", "{source}", "(.+)")'
    return f"({series} or {relabelled})"


def _one_pod_per(labels: str, series: str) -> str:
    """One row per ``labels`` (with one of its pods): several pods riding one physical
    port (VFs of one PF, a shared RDMA device) must not make a join many-to-many."""
    return f"topk by ({labels}) (1, {series})"


JOB_GPUS = f"max by (instance, gpu, pod) {job_pods('fabricscope_pod_gpu_info')}"
#: the job's RDMA devices by (instance, device): each VF's physical function included
JOB_NICS = _one_pod_per(
    "instance, device",
    "max by (instance, device, pod) "
    + _physical(job_pods("fabricscope_pod_rdma_info"), ("device", "pf_device")),
)
#: the job's NICs by (instance, pci_bus_id): each VF's physical function included
JOB_NIC_FUNCTIONS = _one_pod_per(
    "instance, pci_bus_id",
    "max by (instance, pci_bus_id, pod, device) "
    + _physical(
        job_pods("fabricscope_pod_rdma_info"),
        ("device", "pf_device"),
        ("pci_bus_id", "pf_pci_bus_id"),
    ),
)

JOB = Board(
    "fabricscope-job",
    "Fabricscope / Job",
    "One training job: its throughput over time with, on the same time axis, the counters "
    "of exactly the GPUs and RDMA ports attributed to its pods and the probe results of "
    "its nodes, so a drop and its cause are on one screen.",
    (
        Panel(
            "Job throughput",
            "timeseries",
            ((headline(), "{{job_name}} {{unit}}"),),
            "none",
            "What the job prints (its own log lines), mean over its printing containers: "
            "tokens/s, else samples/s, else iterations/s, else steps/s from its time per "
            "step, the first it has (explain and the throughput alert use the same order).",
            w=16,
            h=7,
        ),
        Panel(
            "NCCL transports of the job",
            "timeseries",
            (
                (
                    f"sum by (transport, gdr) (fabricscope_nccl_channels{{{JOB_SERIES},{N}}})",
                    "{{transport}} gdr={{gdr}}",
                ),
            ),
            "none",
            "Channel connections NCCL set up in the job's current runs, by transport and "
            "GPUDirect RDMA (from NCCL_DEBUG=INFO lines of its pods' logs): a run that moved "
            "from NET/IB gdr=1 to NET/Socket or to gdr=0 shows here beside its throughput.",
            w=8,
            h=7,
            stack=True,
            shows=(Show(("nccl_socket_fallback",), (("transport", "transport"),)),),
        ),
        Panel(
            "Port errors on the job's NICs",
            "timeseries",
            (
                (
                    "sum by (instance, device) (rate("
                    f"fabricscope_infiniband_port_symbol_errors_total{{{N}}}[{RI}])) "
                    f"* on (instance, device) group_left (pod) {JOB_NICS}",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "cps",
            "Symbol errors per second on the RDMA devices allocated to the job's pods.",
            w=8,
            shows=(Show(("ib_link_errors",), NODE_PORT),),
        ),
        Panel(
            "Transmit wait on the job's NICs",
            "timeseries",
            (
                (
                    "sum by (instance, device) (rate("
                    f"fabricscope_infiniband_port_transmit_wait_total{{{N}}}[{RI}])) "
                    f"* on (instance, device) group_left (pod) {JOB_NICS}",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "none",
            "PortXmitWait ticks per second on the job's RDMA devices.",
            w=8,
            shows=(Show(("ib_link_errors",), NODE_PORT),),
        ),
        Panel(
            "CNPs sent on the job's NICs",
            "timeseries",
            (
                (
                    "sum by (instance, device) (rate("
                    f"fabricscope_infiniband_port_cnp_sent_total{{{N}}}[{RI}])) "
                    f"* on (instance, device) group_left (pod) {JOB_NICS}",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "pps",
            "RoCE congestion notifications the job's ports send.",
            w=8,
            shows=(Show(("roce_incast",), NODE_PORT),),
        ),
        Panel(
            "NVLink errors on the job's GPUs",
            "timeseries",
            (
                (
                    # the per-GPU sums: every GPU has them at every --collector.detail (the
                    # per-link counters are folded to the links that count errors)
                    "sum by (instance, gpu) (rate(fabricscope_gpu_nvlink_errors_total"
                    f'{{{N},reason=~"replay|recovery|crc_flit"}}[{RI}])) '
                    f"* on (instance, gpu) group_left (pod) {JOB_GPUS}",
                    "{{pod}} {{instance}} GPU {{gpu}}",
                ),
            ),
            "cps",
            "Replay, recovery and CRC-flit errors per second on the job's GPUs.",
            w=8,
            shows=(Show(("nvlink_errors",), NODE_GPU),),
        ),
        Panel(
            "PCIe width of the job's NICs",
            "timeseries",
            (
                (
                    f"(fabricscope_pci_link_width{{{N}}} / on (instance, pci_bus_id) "
                    f"fabricscope_pci_link_max_width{{{N}}}) * on (instance, pci_bus_id) "
                    f"group_left (pod, device) {JOB_NIC_FUNCTIONS}",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "percentunit",
            "Trained over supported PCIe lanes of each NIC the job holds.",
            w=8,
            shows=(Show(("pcie_width_degraded",), NODE_PORT, "asc"),),
        ),
        Panel(
            "Placement findings of the job's processes",
            "timeseries",
            (
                (
                    "sum by (instance, pod, kind) "
                    f"{job_pods('fabricscope_workload_finding_processes')}",
                    "{{pod}} {{instance}} {{kind}}",
                ),
            ),
            "none",
            "Processes of the job's pods with a placement finding.",
            w=8,
            shows=(Show(("wrong_numa",), NODE),),
        ),
        Panel(
            "Link rate of the job's NICs",
            "timeseries",
            (
                (
                    "min by (instance, device) ("
                    f"fabricscope_infiniband_port_rate_bytes_per_second{{{N}}}) * 8 "
                    f"* on (instance, device) group_left (pod) {JOB_NICS}",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "bps",
            "The rate each RDMA port of the job's pods trained at: a port up at fewer lanes "
            "or a lower speed slows the whole job with no error counted.",
            shows=(Show(("ib_rate_drop",), NODE_PORT, "asc"),),
        ),
        Panel(
            "PCIe speed of the job's NICs",
            "timeseries",
            (
                (
                    f"(fabricscope_pci_link_speed_transfers_per_second{{{N}}} / on (instance, "
                    f"pci_bus_id) fabricscope_pci_link_max_speed_transfers_per_second{{{N}}}) "
                    f"* on (instance, pci_bus_id) group_left (pod, device) {JOB_NIC_FUNCTIONS}",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "percentunit",
            "Current over maximum PCIe speed of each NIC the job holds (NICs hold their speed "
            "at idle).",
            shows=(Show(("pcie_speed_degraded",), NODE_PORT, "asc"),),
        ),
        Panel(
            "Probe busbw of the job's nodes",
            "timeseries",
            (
                (
                    "min by (instance, peer) (fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}}) '
                    "and on (instance) count by (instance) "
                    f"{job_pods('fabricscope_pod_gpu_info')}",
                    "{{instance}} -> {{peer}}",
                ),
            ),
            "Bps",
            "Worst GPU pair's node-pair sendrecv bus bandwidth at 64 MiB, for the nodes "
            "running the job.",
            w=24,
            h=7,
            shows=(
                Show(
                    (
                        "ib_link_errors",
                        "pcie_width_degraded",
                        "ib_rate_drop",
                        "pcie_speed_degraded",
                    ),
                    NODE,
                    "asc",
                ),
            ),
        ),
        Panel(
            "NCCL network warnings of the job",
            "timeseries",
            (
                (
                    "sum by (instance, pod, kind) (increase(fabricscope_nccl_warnings_total"
                    f"{{{JOB_SERIES},{N},"
                    'kind=~"ib_completion|ib_async_event|ibv_call|socket|timeout"}[1h]))',
                    "{{pod}} {{instance}} {{kind}}",
                ),
            ),
            "none",
            "NCCL WARN lines about the network in the last hour, per pod and kind (IB "
            "completion errors, async events, failed verbs calls, sockets, timeouts).",
            w=16,
            h=7,
        ),
        Panel(
            "NCCL channels off their GPU's NUMA node",
            "timeseries",
            (
                (
                    "sum by (instance, pod, device) (fabricscope_nccl_hca_channels_off_gpu_numa"
                    f"{{{JOB_SERIES},{N}}})",
                    "{{pod}} {{instance}} {{device}}",
                ),
            ),
            "none",
            "NET/IB channel connections of the job's current runs through an HCA on another "
            "NUMA node than the GPU of the process that set them up (the GPU from NCCL's busId "
            "lines, NUMA nodes from sysfs): traffic crosses the CPU interconnect; 0 when local.",
            w=8,
            h=7,
            shows=(Show(("nccl_hca_off_numa",), ()),),
        ),
        Panel(
            "Switch-port errors at the job's cables",
            "timeseries",
            (
                (
                    "sum by (instance, device, peer_guid, peer_port) (rate("
                    f"fabricscope_infiniband_peer_port_symbol_errors_total{{{N}}}[{RI}])) "
                    f"* on (instance, device) group_left (pod) {JOB_NICS}",
                    "{{pod}} {{instance}} {{device}} -> {{peer_guid}} port {{peer_port}}",
                ),
            ),
            "cps",
            "Symbol errors per second at the switch end of each cable the job's ports ride on "
            "(read by the agent with perfquery one hop out): a bad cable or transceiver shows "
            "at both ends, a bad switch port at this end only. An SR-IOV virtual function's "
            "cable is its physical function's.",
            w=24,
            h=7,
            may_be_empty="the neighbour counters exist only where the ibpeer sampler reads "
            "them (an InfiniBand fabric, infiniband-diags and the umad device)",
        ),
    ),
    extra_vars=(
        ("namespace", "label_values(fabricscope_pod_gpu_info, namespace)"),
        # every job printing any throughput (not tokens/s only)
        ("job", f'label_values({{__name__=~"{ANY_THROUGHPUT}",{NS}}}, job_name)'),
    ),
)
