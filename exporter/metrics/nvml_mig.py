"""Metric specs and rendering for the nvml sampler's MIG records (:mod:`agent.nvml.mig`):
which GPUs are in MIG mode, and one info series per MIG device naming its parent GPU, so a
slice a pod holds joins to the parent's NVLink and PCIe series on ``gpu``."""

from __future__ import annotations

from agent.nvml.snapshot import NvmlSnapshot
from exporter.metrics.spec import Families, MetricSpec

MIG_ENABLED = MetricSpec(
    "fabricscope_gpu_mig_enabled",
    "gauge",
    "1 when the GPU is in MIG mode now, else 0; absent for a GPU without MIG.",
    ("gpu",),
)
MIG_PENDING = MetricSpec(
    "fabricscope_gpu_mig_enabled_pending",
    "gauge",
    "The MIG mode the GPU will be in after its next reset (1 enabled, 0 disabled); differs "
    "from fabricscope_gpu_mig_enabled while a mode change waits for that reset.",
    ("gpu",),
    detail="full",
)
MIG_DEVICE_INFO = MetricSpec(
    "fabricscope_gpu_mig_device_info",
    "gauge",
    "One MIG device (slice) of a GPU in MIG mode; always 1. gpu and uuid are the parent GPU's "
    "(its NVLinks and PCIe link are the slice's), mig_uuid the slice's own (what the device "
    "plugin hands out), gpu_instance and compute_instance its NVML ids, profile its MIG "
    "profile (1g.10gb). Empty label values are attributes NVML did not give.",
    ("gpu", "uuid", "mig_uuid", "gpu_instance", "compute_instance", "profile"),
)

SPECS: tuple[MetricSpec, ...] = (MIG_ENABLED, MIG_PENDING, MIG_DEVICE_INFO)


def _text(value: int | str | None) -> str:
    return "" if value is None else str(value)


def render(snap: NvmlSnapshot, out: Families) -> None:
    for mode in snap.mig_modes:
        out.add(MIG_ENABLED, mode.enabled, str(mode.gpu))
        out.add(MIG_PENDING, mode.pending, str(mode.gpu))
    for d in snap.mig_devices:
        out.add(
            MIG_DEVICE_INFO,
            1,
            str(d.gpu),
            _text(d.parent_uuid),
            d.uuid,
            _text(d.gpu_instance),
            _text(d.compute_instance),
            _text(d.profile),
        )
