"""Metric specs and rendering for each GPU's NVLink fabric registration (the nvml sampler's
``fabric`` records, :mod:`agent.nvml.fabric`): where a GPU stands in joining a multi-node
NVLink domain, and the domain it joined. ``fabricscope topology`` reads the domain as the
``accelerator.topograph.run/domain`` label, the Slurm block plugin's blocks and a Kueue level.
"""

from __future__ import annotations

from agent.nvml.fabric import STATES
from agent.nvml.snapshot import NvmlSnapshot
from exporter.metrics.spec import Families, MetricSpec

FABRIC_STATE = MetricSpec(
    "fabricscope_gpu_fabric_state",
    "gauge",
    "The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV, nvidia-smi -q's Fabric "
    "section): 1 for its state, one series per GPU: not_supported (no multi-node NVLink, or a "
    "driver without the call), not_started, in_progress, completed (in a domain: see "
    "fabricscope_gpu_fabric_info), failed (completed with an error status, named by "
    "fabric_status), no_domain (completed with an all-zero cluster UUID). Read for each GPU "
    "every 2nd NVML pass (a minute at the default 30 s), and every pass while in_progress.",
    ("gpu", "state", "fabric_status"),
)
FABRIC_INFO = MetricSpec(
    "fabricscope_gpu_fabric_info",
    "gauge",
    "The multi-node NVLink domain the GPU joined, only once its registration completed "
    "successfully: the cluster's UUID and the clique's ID (the domain is "
    "<cluster_uuid>.<clique_id>, as nvidia.com/gpu.clique spells it); always 1.",
    ("gpu", "cluster_uuid", "clique_id"),
)

SPECS: tuple[MetricSpec, ...] = (FABRIC_STATE, FABRIC_INFO)
assert len(STATES) == 6  # the help above names each


def render(snap: NvmlSnapshot, out: Families) -> None:
    for f in snap.fabric:
        g = str(f.gpu)
        out.add(FABRIC_STATE, 1, g, f.state, f.status or "")
        if f.cluster_uuid is not None and f.clique_id is not None:
            out.add(FABRIC_INFO, 1, g, f.cluster_uuid, str(f.clique_id))
