"""The Fleet dashboard: every node at once."""

from __future__ import annotations

from boards.model import NODE, NODE_PORT, PROBE_SIZE, RI, Board, N, Panel, Show
from boards.switches import BY_SWITCH

FINDINGS = (
    f"(fabricscope_infiniband_port_up{{{N}}} == 0)"
    f" or (increase(fabricscope_infiniband_port_symbol_errors_total{{{N}}}[1h]) > 10)"
    f" or (increase(fabricscope_infiniband_port_link_downed_total{{{N}}}[1h]) > 0)"
    f" or (fabricscope_pci_link_width_degraded{{{N}}} == 1)"
    f" or (fabricscope_topology_gpu_nearest_nic_cross_numa{{{N}}} == 1)"
    f" or (fabricscope_nvlink_up{{{N}}} == 0)"
    " or (increase(fabricscope_gpu_nvlink_errors_total"
    f'{{{N},reason=~"replay|recovery|crc_flit"}}[1h]) > 0)'
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
        *BY_SWITCH,
    ),
)
