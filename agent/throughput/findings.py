"""Findings from what the jobs' own NCCL lines said (:class:`~agent.throughput.records.NcclSeries`):
channels between two of the node's GPUs joined by NVLink that do not use it. Pure."""

from __future__ import annotations

from agent.core.findings import Finding
from agent.throughput.records import ThroughputSnapshot


def findings(snap: ThroughputSnapshot) -> list[Finding]:
    """One ``nccl_nvlink_bypassed`` finding per container and NVLinked GPU pair whose NCCL
    channels go over a transport other than P2P (SHM, NET/*)."""
    out: list[Finding] = []
    for s in snap.nccl:
        bypass: dict[tuple[str, str], list[str]] = {}
        for gpu, peer, transport, n in s.nvlink_channels:
            if not transport.startswith("P2P/") and n > 0:
                bypass.setdefault((gpu, peer), []).append(f"{n} over {transport}")
        who = "/".join(x for x in (s.namespace, s.pod, s.container) if x) or s.job_name
        for (gpu, peer), how in sorted(bypass.items()):
            out.append(
                Finding(
                    "nccl_nvlink_bypassed",
                    f"{who}:{gpu}-{peer}",
                    f"job {s.job_name or '(unnamed)'}: NCCL channel connections between GPUs "
                    f"{gpu} and {peer}, joined by NVLink, go {', '.join(how)} instead of P2P "
                    "over the NVLinks (containers that cannot share GPU memory, or "
                    "NCCL_P2P_DISABLE)",
                )
            )
    return out
