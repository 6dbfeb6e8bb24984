"""Generates fabricscope's Grafana dashboards (``dashboards/*.json``) with
grafana-foundation-sdk, from the panel tables below.

    python dashboards/generate.py            # rewrite dashboards/*.json
    python dashboards/generate.py --check    # exit 1 if a committed file differs

Each panel is a :class:`Panel` row: title, kind, PromQL targets, unit, and ``shows``: the
planted cause kinds (``tests/lab/scenarios.py``) whose faulty node/port/GPU this panel must
put first, and by which labels. ``tests/test_dashboards.py`` runs every target against a
real Prometheus holding each backfilled lab scenario and checks exactly that.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, table, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as prom_m

HERE = Path(__file__).resolve().parent
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
#: matchers every query carries: the cluster and node variables
N = 'cluster=~"$cluster",instance=~"$node"'
RI = "$__rate_interval"
PROBE_SIZE = '"67108864"'  # 64 MiB: the probe's largest default size


@dataclass(frozen=True)
class Show:
    """This panel must rank the cause of a scenario of ``kinds`` first, compared on
    ``labels`` (cause field -> series label); ``order`` "desc": highest value first."""

    kinds: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    order: str = "desc"


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | bargauge | table | matrix
    targets: tuple[tuple[str, str], ...]  # (expr, legend)
    unit: str
    description: str = ""
    w: int = 12
    h: int = 8
    shows: tuple[Show, ...] = ()
    #: may be empty in a scenario (a counter no scenario advances); says why
    may_be_empty: str = ""
    matrix: tuple[str, str] = ("", "")  # matrix: (row label, column label)
    stack: bool = False


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    variables: tuple[str, ...] = ("cluster", "node")
    single_node: bool = False
    extra_vars: tuple[tuple[str, str], ...] = field(default=())  # (name, label_values query)


NODE_PORT = (("node", "instance"), ("device", "device"))
NODE = (("node", "instance"),)
NODE_GPU = (("node", "instance"), ("gpu", "gpu"))

FINDINGS = (
    f"(fabricscope_infiniband_port_up{{{N}}} == 0)"
    f" or (increase(fabricscope_infiniband_port_symbol_errors_total{{{N}}}[1h]) > 10)"
    f" or (increase(fabricscope_infiniband_port_link_downed_total{{{N}}}[1h]) > 0)"
    f" or (fabricscope_pci_link_width_degraded{{{N}}} == 1)"
    f" or (fabricscope_topology_gpu_nearest_nic_cross_numa{{{N}}} == 1)"
    f" or (fabricscope_nvlink_up{{{N}}} == 0)"
    f' or (increase(fabricscope_nvlink_errors_total{{{N},reason=~"replay|recovery|crc_flit"}}[1h])'
    " > 0)"
    f" or (fabricscope_workload_finding_processes{{{N}}} > 0)"
    f' or (rate(fabricscope_netdev_pfc_pause_frames_total{{{N},direction="tx"}}[10m]) > 1000)'
)

FLEET = Board(
    "fabricscope-fleet",
    "Fabricscope / Fleet",
    "Every node at once: which nodes have findings, which ports are down, erroring or "
    "congested, how the probe's bus bandwidth compares with each pair's baseline, and "
    "whether the agents are healthy. Click a node in the Node dashboard link.",
    (
        Panel(
            "Nodes with findings",
            "bargauge",
            (
                (
                    f"sort_desc(count by (instance) ({FINDINGS})"
                    f" or count by (instance) (fabricscope_build_info{{{N}}}) * 0)",
                    "{{instance}}",
                ),
            ),
            "none",
            "Findings per node now: ports down, symbol errors > 10/h, link downs, PCIe "
            "width degraded, GPU nearest NIC across NUMA, NVLinks down or erroring, workload "
            "placement findings, PFC pause sent above 1000/s (the alert rules' conditions).",
            w=8,
            shows=(
                Show(
                    (
                        "ib_link_errors",
                        "roce_incast",
                        "nvlink_errors",
                        "pcie_width_degraded",
                        "wrong_numa",
                    ),
                    NODE,
                ),
            ),
        ),
        Panel(
            "Ports down per node",
            "bargauge",
            (
                (
                    f"sort_desc(count by (instance) (fabricscope_infiniband_port_up{{{N}}} == 0)"
                    f" or count by (instance) (fabricscope_infiniband_port_up{{{N}}}) * 0)",
                    "{{instance}}",
                ),
            ),
            "none",
            "RDMA ports not ACTIVE/LinkUp now (0 on a healthy node).",
            w=6,
        ),
        Panel(
            "Link downs (1 h)",
            "bargauge",
            (
                (
                    "sort_desc(sum by (instance, device, port) (increase("
                    f"fabricscope_infiniband_port_link_downed_total{{{N}}}[1h])))",
                    "{{instance}} {{device}}",
                ),
            ),
            "none",
            "Times each port's link failed error recovery in the last hour.",
            w=10,
            shows=(Show(("ib_link_errors",), NODE_PORT),),
        ),
        Panel(
            "Port error rate, top 10",
            "timeseries",
            (
                (
                    "topk(10, sum by (instance, device, port) ("
                    f"rate(fabricscope_infiniband_port_symbol_errors_total{{{N}}}[{RI}])"
                    f" + rate(fabricscope_infiniband_port_receive_errors_total{{{N}}}[{RI}])"
                    f" + rate(fabricscope_infiniband_port_link_error_recovery_total{{{N}}}[{RI}])"
                    "))",
                    "{{instance}} {{device}}",
                ),
            ),
            "cps",
            "Symbol errors + receive errors + link error recoveries per second, per port.",
            shows=(Show(("ib_link_errors",), NODE_PORT),),
        ),
        Panel(
            "Transmit wait, top 10",
            "timeseries",
            (
                (
                    f"topk(10, rate(fabricscope_infiniband_port_transmit_wait_total{{{N}}}[{RI}]))",
                    "{{instance}} {{device}}",
                ),
            ),
            "none",
            "PortXmitWait ticks per second: the port had data to send and no credit. Tick "
            "length is the device's, so compare ports of one kind.",
            shows=(Show(("ib_link_errors",), NODE_PORT),),
        ),
        Panel(
            "PFC pause frames sent, top 10",
            "timeseries",
            (
                (
                    "topk(10, sum by (instance, netdev) (rate("
                    f'fabricscope_netdev_pfc_pause_frames_total{{{N},direction="tx"}}[{RI}])))',
                    "{{instance}} {{netdev}}",
                ),
            ),
            "pps",
            "PFC pause frames a NIC sends because it cannot absorb traffic: the incast "
            "receiver, or a host that cannot drain its queues.",
            shows=(Show(("roce_incast",), (("node", "instance"), ("netdev", "netdev"))),),
        ),
        Panel(
            "RoCE CNPs sent, top 10",
            "timeseries",
            (
                (
                    f"topk(10, rate(fabricscope_infiniband_port_cnp_sent_total{{{N}}}[{RI}]))",
                    "{{instance}} {{device}}",
                ),
            ),
            "pps",
            "Congestion notification packets the port sent as notification point (ECN-"
            "marked traffic arrived): where congestion lands.",
            shows=(Show(("roce_incast",), NODE_PORT),),
        ),
        Panel(
            "Probe busbw against each pair's baseline (worst 10)",
            "timeseries",
            (
                (
                    "bottomk(10, min by (instance, peer) ("
                    "fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}}'
                    " / quantile_over_time(0.9, fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}}[6h])))',
                    "{{instance}} -> {{peer}}",
                ),
            ),
            "percentunit",
            "Node-pair sendrecv bus bandwidth at 64 MiB as a share of its own 6-hour 90th "
            "percentile, worst GPU pair per node pair.",
            shows=(Show(("ib_link_errors", "pcie_width_degraded"), NODE, "asc"),),
        ),
        Panel(
            "Agent health",
            "timeseries",
            (
                (
                    f"max by (instance, sampler) (fabricscope_sampler_duration_seconds{{{N}}})",
                    "{{instance}} {{sampler}}",
                ),
            ),
            "s",
            "Duration of each sampler's latest pass (failures show in Sampler failures).",
        ),
        Panel(
            "Sampler failures",
            "bargauge",
            (
                (
                    f"sort_desc(count by (instance) (fabricscope_sampler_success{{{N}}} == 0)"
                    f" or count by (instance) (fabricscope_sampler_success{{{N}}}) * 0)",
                    "{{instance}}",
                ),
            ),
            "none",
            "Samplers whose latest pass failed, per node (0: all healthy).",
        ),
    ),
)

NODE_BOARD = Board(
    "fabricscope-node",
    "Fabricscope / Node",
    "One node: its RDMA ports' traffic against their rate, error counters as rates, "
    "saturated counters, RoCE congestion and netdev drops; its GPUs' NVLinks, PCIe and "
    "XIDs; and the GPU-NIC topology and workload placement findings.",
    (
        Panel(
            "Port throughput (tx + rx)",
            "timeseries",
            (
                (
                    f"sum by (device) (rate(fabricscope_infiniband_port_transmitted_bytes_total"
                    f"{{{N}}}[{RI}]) + rate(fabricscope_infiniband_port_received_bytes_total"
                    f"{{{N}}}[{RI}]))",
                    "{{device}}",
                ),
            ),
            "Bps",
            "Bytes per second each port moves, both directions together.",
        ),
        Panel(
            "Port utilisation (tx) against its rate",
            "timeseries",
            (
                (
                    f"rate(fabricscope_infiniband_port_transmitted_bytes_total{{{N}}}[{RI}])"
                    " / on (instance, device, port) "
                    f"fabricscope_infiniband_port_rate_bytes_per_second{{{N}}}",
                    "{{device}}",
                ),
            ),
            "percentunit",
            "Transmitted bytes per second over the port's link rate.",
        ),
        Panel(
            "Port errors",
            "timeseries",
            (
                (
                    "sum by (device) (rate(fabricscope_infiniband_port_symbol_errors_total"
                    f"{{{N}}}[{RI}]))",
                    "{{device}} symbol",
                ),
                (
                    "sum by (device) (rate(fabricscope_infiniband_port_receive_errors_total"
                    f"{{{N}}}[{RI}]))",
                    "{{device}} rcv",
                ),
                (
                    "sum by (device) (increase(fabricscope_infiniband_port_link_downed_total"
                    f"{{{N}}}[{RI}]))",
                    "{{device}} link downed",
                ),
            ),
            "cps",
            "Symbol errors and receive errors per second; link downs in each interval.",
            shows=(Show(("ib_link_errors",), (("device", "device"),)),),
        ),
        Panel(
            "Saturated PMA counters",
            "bargauge",
            (
                (
                    "sort_desc(sum by (device) (fabricscope_infiniband_port_pma_saturated"
                    f"{{{N}}}))",
                    "{{device}}",
                ),
            ),
            "none",
            "Counters stuck at their width's maximum (their rates read 0): reset them.",
            w=6,
        ),
        Panel(
            "Ports not up",
            "bargauge",
            (
                (
                    f"sort(min by (device) (fabricscope_infiniband_port_up{{{N}}}))",
                    "{{device}}",
                ),
            ),
            "bool_on_off",
            "1: ACTIVE and LinkUp.",
            w=6,
        ),
        Panel(
            "RoCE congestion: CNPs and PFC pause",
            "timeseries",
            (
                (
                    f"rate(fabricscope_infiniband_port_cnp_sent_total{{{N}}}[{RI}])",
                    "{{device}} CNP sent",
                ),
                (
                    f"rate(fabricscope_infiniband_port_cnp_handled_total{{{N}}}[{RI}])",
                    "{{device}} CNP handled",
                ),
                (
                    "sum by (netdev, direction) (rate(fabricscope_netdev_pfc_pause_frames_total"
                    f"{{{N}}}[{RI}]))",
                    "{{netdev}} pause {{direction}}",
                ),
            ),
            "pps",
            "CNPs sent (congestion arrives here) and handled (this port slows down); PFC "
            "pause frames sent (tx) and received (rx).",
        ),
        Panel(
            "Netdev drops",
            "timeseries",
            (
                (
                    f"sum by (netdev) (rate(fabricscope_netdev_out_of_buffer_drops_total{{{N}}}"
                    f"[{RI}]))",
                    "{{netdev}} out of buffer",
                ),
                (
                    f"sum by (netdev) (rate(fabricscope_netdev_phy_discarded_packets_total"
                    f"{{{N}}}[{RI}]))",
                    "{{netdev}} phy discards",
                ),
                (
                    f"sum by (netdev) (rate(fabricscope_netdev_dropped_packets_total{{{N}}}"
                    f"[{RI}]))",
                    "{{netdev}} kernel drops",
                ),
            ),
            "pps",
            "Packets dropped for want of receive buffers, discarded at the PHY, or dropped "
            "by the kernel.",
        ),
        Panel(
            "NVLinks up per GPU",
            "bargauge",
            ((f"sort(sum by (gpu) (fabricscope_nvlink_up{{{N}}}))", "GPU {{gpu}}"),),
            "none",
            "Active NVLinks of each GPU (18 on an H100/H200).",
            w=6,
        ),
        Panel(
            "NVLink errors",
            "timeseries",
            (
                (
                    "sum by (gpu, reason) (rate(fabricscope_nvlink_errors_total"
                    f'{{{N},reason=~"replay|recovery|crc_flit"}}[{RI}]))',
                    "GPU {{gpu}} {{reason}}",
                ),
            ),
            "cps",
            "Replay, recovery and CRC-flit errors per second (crc_data/ecc_data are left "
            "out: non-zero on healthy links).",
            w=18,
            shows=(Show(("nvlink_errors",), (("gpu", "gpu"),)),),
        ),
        Panel(
            "PCIe links narrower than both ends support",
            "bargauge",
            (
                (
                    f"topk(10, fabricscope_pci_link_width_degraded{{{N}}})",
                    "{{pci_bus_id}}",
                ),
            ),
            "bool_yes_no",
            "1: the link above this GPU, NIC or bridge trained with fewer lanes than it and "
            "its upstream port both support (a reseat or reboot usually retrains it).",
            shows=(Show(("pcie_width_degraded",), (("pci_bus_id", "pci_bus_id"),)),),
        ),
        Panel(
            "GPU PCIe generation and width",
            "timeseries",
            (
                (f"fabricscope_gpu_pcie_current_link_width{{{N}}}", "GPU {{gpu}} width"),
                (f"fabricscope_gpu_pcie_current_link_generation{{{N}}}", "GPU {{gpu}} gen"),
            ),
            "none",
            "Current PCIe width and generation of each GPU (generation drops at idle by design).",
        ),
        Panel(
            "GPU PCIe replays and XIDs",
            "timeseries",
            (
                (
                    f"sum by (gpu) (rate(fabricscope_gpu_pcie_replays_total{{{N}}}[{RI}]))",
                    "GPU {{gpu}} PCIe replays",
                ),
                (
                    f"sum by (gpu, reason) (increase(fabricscope_gpu_xid_errors_total{{{N}}}"
                    f"[{RI}]))",
                    "GPU {{gpu}} XID {{reason}}",
                ),
            ),
            "cps",
            "PCIe replays per second and XID events per interval, per GPU.",
        ),
        Panel(
            "GPU-NIC topology findings",
            "bargauge",
            (
                (
                    "sort_desc(sum by (pci_bus_id) ("
                    f"fabricscope_topology_gpu_nearest_nic_cross_numa{{{N}}}))",
                    "GPU {{pci_bus_id}} nearest NIC cross-NUMA",
                ),
            ),
            "none",
            "1: every nearest NIC of that GPU is on another NUMA node.",
        ),
        Panel(
            "Workload placement findings",
            "bargauge",
            (
                (
                    "sort_desc(sum by (gpu, kind) ("
                    f"fabricscope_workload_finding_processes{{{N}}}))",
                    "GPU {{gpu}} {{kind}}",
                ),
            ),
            "none",
            "Training processes per GPU with a placement finding (CPUs off the GPU's NUMA "
            "node, NCCL_IB_HCA on another node, IB disabled).",
            shows=(Show(("wrong_numa",), ()),),
        ),
    ),
    single_node=True,
)

JOB_PODS = 'namespace=~"$namespace"'
JOB_GPUS = f"max by (instance, gpu, pod) (fabricscope_pod_gpu_info{{{JOB_PODS},{N}}})"
JOB_NICS = f"max by (instance, device, pod) (fabricscope_pod_rdma_info{{{JOB_PODS},{N}}})"

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
            (
                (
                    'max by (job_name) (fabricscope_throughput_tokens_per_second{job_name=~"$job",'
                    f"{N}}})",
                    "{{job_name}} tokens/s",
                ),
            ),
            "none",
            "Tokens per second the job prints (its own log lines).",
            w=24,
            h=7,
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
                    "sum by (instance, gpu) (rate(fabricscope_nvlink_errors_total"
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
                    "group_left (pod, device) max by (instance, pci_bus_id, pod, device) "
                    f"(fabricscope_pod_rdma_info{{{JOB_PODS},{N}}})",
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
                    "sum by (instance, pod, kind) (fabricscope_workload_finding_processes"
                    f"{{{JOB_PODS},{N}}})",
                    "{{pod}} {{instance}} {{kind}}",
                ),
            ),
            "none",
            "Processes of the job's pods with a placement finding.",
            w=8,
            shows=(Show(("wrong_numa",), NODE),),
        ),
        Panel(
            "Probe busbw of the job's nodes",
            "timeseries",
            (
                (
                    "min by (instance, peer) (fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}}) '
                    "and on (instance) count by (instance) "
                    f"(fabricscope_pod_gpu_info{{{JOB_PODS},{N}}})",
                    "{{instance}} -> {{peer}}",
                ),
            ),
            "Bps",
            "Worst GPU pair's node-pair sendrecv bus bandwidth at 64 MiB, for the nodes "
            "running the job.",
            w=24,
            h=7,
            shows=(Show(("ib_link_errors", "pcie_width_degraded"), NODE, "asc"),),
        ),
    ),
    extra_vars=(
        ("namespace", "label_values(fabricscope_pod_gpu_info, namespace)"),
        ("job", "label_values(fabricscope_throughput_tokens_per_second, job_name)"),
    ),
)

PROBE = Board(
    "fabricscope-probe",
    "Fabricscope / Probe",
    "The NCCL probe: the node-pair and GPU x GPU bus-bandwidth matrices, each pair's "
    "trend, intra-node all_reduce, and failures by reason.",
    (
        Panel(
            "Node-pair busbw matrix (sendrecv, 64 MiB, worst GPU pair)",
            "matrix",
            (
                (
                    "min by (instance, peer) (fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}})',
                    "",
                ),
            ),
            "Bps",
            "Rows: the node; columns: its peer. A bad link or node shows as a cold row and column.",
            shows=(Show(("ib_link_errors", "pcie_width_degraded"), NODE, "asc"),),
            matrix=("instance", "peer"),
        ),
        Panel(
            "GPU x GPU busbw matrix (sendrecv, 64 MiB, worst peer)",
            "matrix",
            (
                (
                    "min by (gpu, peer_gpu) (fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}})',
                    "",
                ),
            ),
            "Bps",
            "Rows: this node's GPU; columns: the peer's GPU. One cold cell pair: one rail.",
            shows=(Show(("ib_link_errors", "pcie_width_degraded"), (("gpu", "gpu"),), "asc"),),
            matrix=("gpu", "peer_gpu"),
        ),
        Panel(
            "Node-pair busbw over time",
            "timeseries",
            (
                (
                    "min by (instance, peer) (fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}})',
                    "{{instance}} -> {{peer}}",
                ),
            ),
            "Bps",
            "Each node pair's worst GPU pair over time.",
            shows=(Show(("ib_link_errors", "pcie_width_degraded"), NODE, "asc"),),
        ),
        Panel(
            "Intra-node all_reduce busbw",
            "timeseries",
            (
                (
                    "max by (instance) (fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="all_reduce",size_bytes={PROBE_SIZE}}})',
                    "{{instance}}",
                ),
            ),
            "Bps",
            "NVLink all_reduce across each node's idle GPUs at 64 MiB.",
            shows=(Show(("nvlink_errors",), NODE, "asc"),),
        ),
        Panel(
            "Probe failures by reason (1 h)",
            "bargauge",
            (
                (
                    "sort_desc(sum by (reason) (increase(fabricscope_probe_runs_total"
                    f'{{{N},reason!="ok"}}[1h])))',
                    "{{reason}}",
                ),
            ),
            "none",
            "Failed probe runs in the last hour by reason (timeout, peer_unreachable, "
            "wrong_result, ...).",
        ),
        Panel(
            "Probe runs per node (1 h)",
            "bargauge",
            (
                (
                    "sort_desc(sum by (instance) (increase(fabricscope_probe_runs_total"
                    f"{{{N}}}[1h])))",
                    "{{instance}}",
                ),
            ),
            "none",
            "Probe runs in the last hour, all outcomes.",
        ),
    ),
)

BOARDS = (FLEET, NODE_BOARD, JOB, PROBE)


def _target(expr: str, legend: str, ref: str, instant: bool) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if instant:
        q = q.instant().format(prom_m.PromQueryFormat.TABLE)
    return q


def _panel(p: Panel, pid: int, x: int, y: int) -> object:
    instant = p.kind in ("bargauge", "matrix", "table")
    if p.kind == "timeseries":
        b = (
            timeseries.Panel()
            .line_width(1)
            .fill_opacity(10 if not p.stack else 60)
            .show_points(common.VisibilityMode.NEVER)
            .legend(
                common_b.VizLegendOptions()
                .show_legend(True)
                .display_mode(common.LegendDisplayMode.TABLE)
                .placement(common.LegendPlacement.RIGHT)
                .calcs(["max", "lastNotNull"])
                .sort_by("Max")
                .sort_desc(True)
            )
        )
    elif p.kind == "bargauge":
        b = (
            bargauge.Panel()
            .display_mode(common.BarGaugeDisplayMode.BASIC)
            .orientation(common.VizOrientation.HORIZONTAL)
            .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        )
    else:  # matrix: a table pivoted to rows x columns, cells coloured by value
        b = (
            table.Panel()
            .cell_options(
                common.TableColoredBackgroundCellOptions(
                    mode=common.TableCellBackgroundDisplayMode.GRADIENT
                )
            )
            .with_transformation(
                dm.DataTransformerConfig(
                    id_val="groupingToMatrix",
                    options={
                        "rowField": p.matrix[0],
                        "columnField": p.matrix[1],
                        "valueField": "Value",
                    },
                )
            )
            .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.CONTINUOUS_RD_YL_GR))
        )
    b = (
        b.id(pid)
        .title(p.title)
        .description(p.description)
        .datasource(DS)
        .unit(p.unit)
        .grid_pos(dm.GridPos(h=p.h, w=p.w, x=x, y=y))
    )
    for i, (expr, legend) in enumerate(p.targets):
        b = b.with_target(_target(expr, legend, chr(ord("A") + i), instant))
    return b


def _variables(board: Board) -> list[object]:
    out: list[object] = [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
    ]
    cluster = (
        dashboard.QueryVariable("cluster")
        .label("Cluster")
        .datasource(DS)
        .query("label_values(fabricscope_build_info, cluster)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .all_value(".*")
        .multi(True)
    )
    node = (
        dashboard.QueryVariable("node")
        .label("Node")
        .datasource(DS)
        .query('label_values(fabricscope_build_info{cluster=~"$cluster"}, instance)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )
    if not board.single_node:
        node = node.include_all(True).all_value(".*").multi(True)
    out += [cluster, node]
    for name, query in board.extra_vars:
        out.append(
            dashboard.QueryVariable(name)
            .label(name.capitalize())
            .datasource(DS)
            .query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .all_value(".*")
        )
    return out


def build(board: Board) -> dict[str, object]:
    d = (
        dashboard.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(["fabricscope"])
        .editable()
        .time("now-6h", "now")
        .refresh("1m")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .link(
            dashboard.DashboardLink("Fabricscope")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["fabricscope"])
            .as_dropdown(False)
            .include_vars(True)
            .keep_time(True)
        )
    )
    for v in _variables(board):
        d = d.with_variable(v)  # type: ignore[arg-type]
    x = y = row_h = 0
    for pid, p in enumerate(board.panels, start=1):
        if x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        d = d.with_panel(_panel(p, pid, x, y))  # type: ignore[arg-type]
        x += p.w
        row_h = max(row_h, p.h)
    out: dict[str, object] = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    return out


def render(board: Board) -> str:
    return json.dumps(build(board), indent=2, sort_keys=True) + "\n"


def path_of(board: Board) -> Path:
    return HERE / f"{board.uid.removeprefix('fabricscope-')}.json"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for board in BOARDS:
        text = render(board)
        path = path_of(board)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
