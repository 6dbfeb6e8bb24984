"""The candidate causes ``explain`` ranks, each with the dashboard panel that shows it, and
the score at which a candidate stands out. Imports nothing of the explain package."""

from __future__ import annotations

from dataclasses import dataclass

#: a candidate at or above this score "stands out"; below it, it is listed as checked only
THRESHOLD = 1.0

#: the Node dashboard's panels (dashboards/boards/node.py) for a port's rate/width/speed and
#: for its data rate beside its rail peers'
PANEL_PORT_RATE = 4
PANEL_PORT_DATA = 1
#: the Fleet dashboard's switches ranked by faulty ports under them (dashboards/boards/
#: switches.py, the first panel of the by-switch row)
PANEL_BY_SWITCH = 11


@dataclass(frozen=True, slots=True)
class Cause:
    """A candidate cause and the dashboard panel that shows it (dashboards/*.json, generated
    by dashboards/generate.py: uid and panel id; 0: the dashboard has no panel for it)."""

    name: str
    title: str
    dashboard: str
    panel: int


CAUSES: dict[str, Cause] = {
    c.name: c
    for c in (
        Cause("ib_link", "InfiniBand/RoCE link errors", "fabricscope-node", 3),
        Cause("ib_congestion", "port congestion (xmit_wait)", "fabricscope-job", 4),
        Cause("roce_congestion", "RoCE congestion (PFC pause, CNP/ECN)", "fabricscope-node", 9),
        Cause("drops", "packet drops and retransmissions", "fabricscope-node", 10),
        Cause(
            "port_rate",
            "InfiniBand/RoCE port up but below its rate (fewer lanes or a lower speed)",
            "fabricscope-node",
            PANEL_PORT_RATE,
        ),
        Cause(
            "rail_share",
            "port carrying less data than its rail peers",
            "fabricscope-node",
            PANEL_PORT_DATA,
        ),
        Cause("pcie", "PCIe link degraded", "fabricscope-node", 14),
        Cause("nvlink", "NVLink down or erroring", "fabricscope-node", 13),
        Cause("gpu", "GPU errors (XID, lost GPU)", "fabricscope-node", 17),
        Cause("gpu_throttle", "GPU clocks throttled", "fabricscope-node", 0),
        Cause("probe", "probe bus bandwidth below the pair's baseline", "fabricscope-probe", 3),
        Cause("misplacement", "pods placed off their GPUs' NUMA node", "fabricscope-job", 8),
        Cause("nccl_config", "NCCL settings differ or are wrong", "fabricscope-job", 8),
        Cause(
            "nccl_transport",
            "NCCL chose another transport, GPUDirect RDMA mode or HCA set",
            "fabricscope-job",
            2,
        ),
        Cause("nccl_network", "NCCL network warnings", "fabricscope-job", 12),
        Cause(
            "nccl_rank",
            "an NCCL rank stopped answering or lags the others (NCCL's RAS)",
            "fabricscope-job",
            0,
        ),
        Cause(
            "nccl_nvlink",
            "NCCL traffic between NVLinked GPUs of a node going through host memory or the "
            "network instead of NVLink",
            "fabricscope-job",
            0,
        ),
        Cause(
            "switch",
            "a switch: ports of several of the job's nodes under it, or its uplinks, show "
            "the same fault",
            "fabricscope-fleet",
            PANEL_BY_SWITCH,
        ),
    )
}
