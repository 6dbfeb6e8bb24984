"""The Fleet dashboard: every node at once, readable at 500-2,000 nodes.

Every panel is bounded whatever the fleet's size: an aggregate over the fleet, the top 25
nodes with a non-zero count, or the worst 10 nodes over the dashboard's time range (chosen
once for the whole range, ``@ end()``, so a time series panel never draws more than 10
lines). Panels read the per-node series that ``deploy/rules/fleet.rules.yaml`` records every
minute (``fabricscope:node_*``), a few thousand series, never the per-port and per-GPU raw
millions. Every node a panel names links to the Node dashboard for the ports, GPUs and PCIe
links behind its figure (``node_link``). A port whose physical state is Disabled is no
port down and no finding, as in the port-down alert.
"""

from __future__ import annotations

from boards.model import NODE, PROBE_SIZE, Board, N, Panel, Show
from boards.switches import BY_SWITCH

#: a series per node, one per fleet.rules.yaml record
FINDINGS = "fabricscope:node_findings:count"
PORTS_DOWN = "fabricscope:node_ports_down:count"
LINK_DOWNS = "fabricscope:node_link_downs:increase1h"
PORT_ERRORS = "fabricscope:node_port_error_rate:max5m"
TRANSMIT_WAIT = "fabricscope:node_transmit_wait_rate:max5m"
PFC_SENT = "fabricscope:node_pfc_pause_sent_rate:max5m"
CNP_SENT = "fabricscope:node_cnp_sent_rate:max5m"
SAMPLER_DURATION = "fabricscope:node_sampler_duration:max"
SAMPLER_FAILURES = "fabricscope:node_sampler_failures:count"

TOP = 25  # bars in a "which nodes" panel
NON_ZERO = "nodes with nothing to count are left out: empty on a healthy fleet"
WORST = 10  # lines in a "worst nodes over time" panel


def top_nodes(record: str) -> str:
    """The nodes with a non-zero count now, highest first, at most :data:`TOP` (counts
    from increase() rounded: an hour's window extrapolates one event to 1.02)."""
    return f"sort_desc(topk({TOP}, round({record}{{{N}}}) > 0))"


WORST_EMPTY = "only nodes whose figure rose above 0 in the range: empty where none did"


def worst_nodes(record: str) -> str:
    """Every node's line for the :data:`WORST` nodes with the highest value over the
    dashboard's range, chosen once at its end: at most that many lines however the ranking
    moved within the range."""
    return (
        f"{record}{{{N}}} and on (instance) "
        f"topk({WORST}, max_over_time({record}{{{N}}}[$__range] @ end()) > 0)"
    )


FLEET = Board(
    "fabricscope-fleet",
    "Fabricscope / Fleet",
    "Every node at once, for fleets of thousands: how many nodes have findings, ports down, "
    "link downs or failing samplers; which nodes (the top 25 by count); the worst 10 nodes "
    "by port errors, transmit wait, PFC pause and CNPs sent; the probe's worst node pairs. "
    "Reads the per-node series of the shipped recording rules (fleet.rules.yaml); click a "
    "node for the Node dashboard.",
    (
        Panel(
            "Fleet at a glance",
            "timeseries",
            (
                (f"count({FINDINGS}{{{N}}} > 0) or vector(0)", "nodes with findings"),
                (f"sum({PORTS_DOWN}{{{N}}}) or vector(0)", "ports down (not Disabled)"),
                (f"count({LINK_DOWNS}{{{N}}} > 0) or vector(0)", "nodes with link downs (1 h)"),
                (f"sum({SAMPLER_FAILURES}{{{N}}}) or vector(0)", "samplers failing"),
                (
                    f'count(up{{job="fabricscope",{N}}} == 0) or vector(0)',
                    "agents not scraped",
                ),
            ),
            "none",
            "Fleet-wide counts over time, from the recording rules: nodes with a finding (the "
            "hardware alerts' conditions), RDMA ports down (an administratively Disabled port "
            "is not down), nodes whose links went down in the last hour, failing samplers, "
            "agents Prometheus cannot scrape. Five lines whatever the fleet's size.",
            w=24,
            h=7,
            node_link=False,
        ),
        Panel(
            f"Nodes with findings (top {TOP})",
            "bargauge",
            ((top_nodes(FINDINGS), "{{instance}}"),),
            "none",
            "Findings per node now, nodes without any left out: ports down (not Disabled), "
            "symbol errors > 10/h, link downs, ports below their rate, PCIe width degraded, "
            "GPU nearest NIC across NUMA, NVLinks down or erroring, lost GPUs, workload "
            "placement findings, PFC pause sent above 1000/s (the alert rules' conditions).",
            w=8,
            h=10,
            may_be_empty=NON_ZERO,
            shows=(
                Show(
                    (
                        "ib_link_errors",
                        "roce_incast",
                        "nvlink_errors",
                        "pcie_width_degraded",
                        "wrong_numa",
                        "ib_rate_drop",
                    ),
                    NODE,
                ),
            ),
        ),
        Panel(
            f"Ports down (top {TOP} nodes)",
            "bargauge",
            ((top_nodes(PORTS_DOWN), "{{instance}}"),),
            "none",
            "RDMA ports not ACTIVE/LinkUp now, per node, nodes with none left out. A port an "
            "administrator disabled (physical state Disabled) does not count.",
            w=8,
            h=10,
            may_be_empty=NON_ZERO,
        ),
        Panel(
            f"Link downs in the last hour (top {TOP} nodes)",
            "bargauge",
            ((top_nodes(LINK_DOWNS), "{{instance}}"),),
            "none",
            "Times the node's links failed error recovery and went down in the last hour, "
            "nodes without any left out; the Node dashboard names the ports.",
            w=8,
            h=10,
            may_be_empty=NON_ZERO,
            shows=(Show(("ib_link_errors",), NODE),),
        ),
        Panel(
            f"Port error rate, worst {WORST} nodes",
            "timeseries",
            ((worst_nodes(PORT_ERRORS), "{{instance}}"),),
            "cps",
            "The worst port of each node: symbol errors + receive errors + link error "
            "recoveries per second (5-minute rate), for the 10 nodes with the highest peak "
            "in the time range.",
            shows=(Show(("ib_link_errors",), NODE),),
            may_be_empty=WORST_EMPTY,
        ),
        Panel(
            f"Transmit wait, worst {WORST} nodes",
            "timeseries",
            ((worst_nodes(TRANSMIT_WAIT), "{{instance}}"),),
            "none",
            "The worst port of each node: PortXmitWait ticks per second (the port had data to "
            "send and no credit). A port whose 32-bit counter stopped at its maximum reads 0 "
            "here: the Node dashboard's saturated counters panel shows it.",
            shows=(Show(("ib_link_errors",), NODE),),
            may_be_empty=WORST_EMPTY,
        ),
        Panel(
            f"PFC pause frames sent, worst {WORST} nodes",
            "timeseries",
            ((worst_nodes(PFC_SENT), "{{instance}}"),),
            "pps",
            "The worst NIC of each node: PFC pause frames it sends because it cannot absorb "
            "traffic (the incast receiver, or a host that cannot drain its queues).",
            shows=(Show(("roce_incast",), NODE),),
            may_be_empty=WORST_EMPTY,
        ),
        Panel(
            f"RoCE CNPs sent, worst {WORST} nodes",
            "timeseries",
            ((worst_nodes(CNP_SENT), "{{instance}}"),),
            "pps",
            "The worst port of each node: congestion notification packets it sent as "
            "notification point (ECN-marked traffic arrived), where congestion lands.",
            shows=(Show(("roce_incast",), NODE),),
            may_be_empty=WORST_EMPTY,
        ),
        Panel(
            f"Probe busbw against each pair's baseline (worst {WORST} pairs now)",
            "bargauge",
            (
                (
                    f"sort(bottomk({WORST}, min by (instance, peer) ("
                    "fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}}'
                    " / quantile_over_time(0.9, fabricscope_probe_busbw_bytes_per_second"
                    f'{{{N},collective="sendrecv",size_bytes={PROBE_SIZE}}}[6h]))))',
                    "{{instance}} -> {{peer}}",
                ),
            ),
            "percentunit",
            "Node-pair sendrecv bus bandwidth at 64 MiB as a share of its own 6-hour 90th "
            "percentile, worst GPU pair per node pair: the 10 lowest pairs now (with the "
            "probe on).",
            shows=(Show(("ib_link_errors", "pcie_width_degraded"), NODE, "asc"),),
        ),
        Panel(
            f"Slowest sampler, worst {WORST} nodes",
            "timeseries",
            ((worst_nodes(SAMPLER_DURATION), "{{instance}}"),),
            "s",
            "Each node's slowest sampler pass, for the 10 nodes with the slowest in the time "
            "range (failures show beside).",
            may_be_empty=WORST_EMPTY,
        ),
        Panel(
            f"Sampler failures (top {TOP} nodes)",
            "bargauge",
            ((top_nodes(SAMPLER_FAILURES), "{{instance}}"),),
            "none",
            "Samplers whose latest pass failed, per node, healthy nodes left out.",
            w=6,
            may_be_empty=NON_ZERO,
        ),
        Panel(
            f"Agents not scraped (first {TOP})",
            "bargauge",
            ((f'sort(topk({TOP}, up{{job="fabricscope",{N}}} == 0))', "{{instance}}"),),
            "none",
            "Nodes whose agent Prometheus fails to scrape now (0: down), at most 25 of them "
            "(the glance panel counts all).",
            w=6,
            may_be_empty=NON_ZERO,
        ),
        # the fabric's own topology: faults per leaf switch, per cable, per uplink
        *BY_SWITCH,
    ),
)
