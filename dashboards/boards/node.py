"""The Node dashboard: one node's ports, GPUs, PCIe links and topology findings."""

from __future__ import annotations

from boards.model import RI, Board, N, Panel, Show
from boards.switches import CABLES

NODE_BOARD = Board(
    "fabricscope-node",
    "Fabricscope / Node",
    "One node: its RDMA ports' traffic against their rate, error counters as rates, "
    "saturated counters, RoCE congestion and netdev drops; its GPUs' NVLinks, PCIe and "
    "XIDs, and their activity from dcgm-exporter where it runs; and the GPU-NIC topology "
    "and workload placement findings.",
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
            "Port link rate",
            "timeseries",
            (
                (
                    f"fabricscope_infiniband_port_rate_bytes_per_second{{{N}}} * 8",
                    "{{device}}",
                ),
            ),
            "bps",
            "The rate each port trained at (lanes x lane speed, the kernel's rate file). A "
            "port that stays up at a lower rate carries a fraction of its traffic while its "
            "error counters can stay flat: the panels beside say whether lanes or speed fell.",
        ),
        Panel(
            "Port link width (lanes)",
            "timeseries",
            ((f"fabricscope_infiniband_port_link_width{{{N}}}", "{{device}}"),),
            "none",
            "Lanes each port trained with (4 for 4X): a cable or transceiver fault drops lanes.",
            w=6,
            shows=(Show(("ib_rate_drop",), (("device", "device"),), "asc"),),
        ),
        Panel(
            "Port lane speed (Gb/s)",
            "timeseries",
            (
                (
                    f"fabricscope_infiniband_port_rate_bytes_per_second{{{N}}} * 8 / 1e9 / "
                    f"fabricscope_infiniband_port_link_width{{{N}}}",
                    "{{device}}",
                ),
            ),
            "none",
            "Speed of each lane (NDR 100, HDR 50, EDR 25 Gb/s; RoCE ports in the same terms: "
            "100GbE reads 4X EDR).",
            w=6,
        ),
        Panel(
            "Ports below their rate",
            "bargauge",
            (
                (
                    # below full detail only the comparisons a port runs below are exported:
                    # every other port reads "none", 0, from port_up
                    "sort_desc(max by (device, comparison) ("
                    f"fabricscope_infiniband_port_rate_degraded{{{N}}}) or on (device) "
                    "label_replace(max by (device) (0 * fabricscope_infiniband_port_up"
                    f'{{{N}}}), "comparison", "none", "", ""))',
                    "{{device}} ({{comparison}})",
                ),
            ),
            "bool_yes_no",
            "1: an ACTIVE port below its own fastest rate since the agent started (history), "
            "the rate most ports of its HCA model here run at (peers), or the node class's "
            "expected rate (expected); (none): below no comparison.",
            w=6,
            shows=(Show(("ib_rate_drop",), (("device", "device"),)),),
        ),
        Panel(
            "Port state (1 = up)",
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
            "Saturated PMA counters",
            "bargauge",
            (
                (
                    # below full detail a port without one exports no count: 0 from port_up
                    "sort_desc(sum by (device) (fabricscope_infiniband_port_pma_saturated_counters"
                    f"{{{N}}}) or sum by (device) (0 * fabricscope_infiniband_port_up{{{N}}}))",
                    "{{device}}",
                ),
            ),
            "none",
            "Counters stuck at their width's maximum (their rates read 0): on an InfiniBand "
            "port, clear them; on a RoCE port nothing can, and the netdev's ethtool "
            "statistics carry the link's counts.",
            w=6,
        ),
        Panel(
            "NVLinks up per GPU",
            "bargauge",
            ((f"sort(sum by (gpu) (fabricscope_gpu_nvlinks_up{{{N}}}))", "GPU {{gpu}}"),),
            "none",
            "Active NVLinks of each GPU (18 on an H100/H200).",
            w=6,
        ),
        Panel(
            "GPU activity (dcgm-exporter)",
            "timeseries",
            ((f"fabricscope:gpu_dcgm_activity:ratio{{{N}}}", "GPU {{gpu}} ({{field}})"),),
            "percentunit",
            "Each GPU's activity as dcgm-exporter measures it, beside its links: SM activity "
            "where dcgm-exporter collects it, else graphics-engine activity, else GPU "
            "utilisation (the legend names the field; a MIG GPU shows its busiest instance). "
            "Joined by GPU UUID (deploy/rules/joins.rules.yaml); empty where dcgm-exporter is "
            "not scraped, which the panel beside says.",
        ),
        Panel(
            "GPUs in dcgm-exporter",
            "bargauge",
            (
                (f"count(fabricscope:gpu_dcgm_activity:ratio{{{N}}})", "with DCGM activity"),
                (
                    f"count(fabricscope_gpu_info{{{N}}} unless on (uuid) "
                    f"fabricscope:gpu_dcgm_activity:ratio{{{N}}})",
                    "without: dcgm-exporter not scraped here, or not these GPUs",
                ),
            ),
            "none",
            "How many of this node's GPUs dcgm-exporter reports (matched by UUID). Only "
            '"without": this Prometheus scrapes no dcgm-exporter for this node, or its '
            "fields are off (DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_GR_ENGINE_ACTIVE, "
            "DCGM_FI_DEV_GPU_UTIL); the join rules must be loaded too.",
            w=6,
        ),
        Panel(
            "NVLink errors",
            "timeseries",
            (
                (
                    "sum by (gpu, reason) (rate(fabricscope_gpu_nvlink_errors_total"
                    f'{{{N},reason=~"replay|recovery|crc_flit"}}[{RI}]))',
                    "GPU {{gpu}} {{reason}}",
                ),
            ),
            "cps",
            "Replay, recovery and CRC-flit errors per second (crc_data/ecc_data are left "
            "out: non-zero on healthy links).",
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
            "NIC PCIe link speed (GT/s)",
            "timeseries",
            (
                (
                    f"fabricscope_pci_link_speed_transfers_per_second{{{N}}} / 1e9 and on "
                    f'(instance, pci_bus_id) fabricscope_pci_device_info{{{N},role="nic"}}',
                    "{{pci_bus_id}}",
                ),
            ),
            "none",
            "Each NIC's PCIe link speed. NICs hold their trained speed at idle (GPUs do not), "
            "so a NIC below its maximum (32 for Gen5, 16 for Gen4) is capped.",
            shows=(Show(("pcie_speed_degraded",), (("pci_bus_id", "pci_bus_id"),), "asc"),),
        ),
        Panel(
            "GPU PCIe generation and width",
            "timeseries",
            (
                (f"fabricscope_gpu_pcie_current_link_width{{{N}}}", "GPU {{gpu}} width"),
                (f"fabricscope_gpu_pcie_current_link_generation{{{N}}}", "GPU {{gpu}} gen"),
            ),
            "none",
            "Current PCIe width and generation of each GPU (generation drops at idle by "
            "design; fabricscope_gpu_pcie_link_generation_degraded judges it while the GPU "
            "runs processes).",
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
        *CABLES,
    ),
    single_node=True,
)
