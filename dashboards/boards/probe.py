"""The Probe dashboard: the NCCL probe's bus-bandwidth matrices, trends and failures."""

from __future__ import annotations

from boards.model import NODE, PROBE_SIZE, Board, N, Panel, Show

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
