"""Metric specs and rendering for the nvml sampler.

Per-GPU series carry only ``gpu`` (NVML's index); ``fabricscope_gpu_info`` joins it to the
UUID (what kubelet's pod-resources API names), the PCI address (what sysfs and the topology
series name), the model and the VBIOS. Only values NVML answered are exported: a counter
the GPU does not offer is absent, never 0.
"""

from __future__ import annotations

from agent.nvml.findings import generation_degraded_under_load
from agent.nvml.snapshot import NvLink, NvmlGpu, NvmlSnapshot
from exporter.metrics import nvml_fabric, nvml_mig
from exporter.metrics.spec import Families, MetricSpec

_G = ("gpu",)
_GL = ("gpu", "link")
_SHARED_FOLD = (
    "Below full, one series per GPU with an empty link label when every link that reports "
    "it agrees (per link otherwise)."
)
#: clock-event reasons that slow a GPU down: the ones levels below full export
SLOWDOWN_REASONS = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "hw_thermal_slowdown",
        "sw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)
#: NVLink error counters that make findings (the rest are non-zero on healthy links)
LINK_FINDING_REASONS = frozenset({"replay", "recovery", "crc_flit"})

GPU_INFO = MetricSpec(
    "fabricscope_gpu_info",
    "gauge",
    "GPU identity from NVML; always 1. pci_bus_id is in sysfs form (0000:19:00.0), fw_ver is "
    "the VBIOS version. Empty label values are attributes NVML did not give.",
    ("gpu", "uuid", "pci_bus_id", "model", "fw_ver"),
)
DRIVER_INFO = MetricSpec(
    "fabricscope_gpu_driver_info",
    "gauge",
    "NVIDIA driver version NVML reports; always 1.",
    ("version",),
)
NVML_INFO = MetricSpec(
    "fabricscope_gpu_nvml_info",
    "gauge",
    "NVML library version; always 1.",
    ("version",),
)
GPU_LOST = MetricSpec(
    "fabricscope_gpu_lost",
    "gauge",
    "1 when NVML answers GPU_IS_LOST for the GPU (fallen off the bus or inaccessible), else 0.",
    _G,
)
PCIE_CURRENT_GENERATION = MetricSpec(
    "fabricscope_gpu_pcie_current_link_generation",
    "gauge",
    "Current PCIe link generation of the GPU (drops at idle by design).",
    _G,
)
PCIE_MAX_GENERATION = MetricSpec(
    "fabricscope_gpu_pcie_max_link_generation",
    "gauge",
    "Highest PCIe link generation the GPU and the system it sits in support.",
    _G,
)
PCIE_GENERATION_DEGRADED = MetricSpec(
    "fabricscope_gpu_pcie_link_generation_degraded",
    "gauge",
    "1 when the GPU runs compute processes and its current PCIe generation is below the "
    "highest it and its system support, else 0; absent while it runs none (an idle GPU "
    "lowers its link speed by design) or when NVML gives no generation.",
    _G,
)
PCIE_CURRENT_WIDTH = MetricSpec(
    "fabricscope_gpu_pcie_current_link_width",
    "gauge",
    "Current PCIe link width of the GPU in lanes.",
    _G,
)
PCIE_MAX_WIDTH = MetricSpec(
    "fabricscope_gpu_pcie_max_link_width",
    "gauge",
    "Widest PCIe link the GPU supports, in lanes.",
    _G,
)
PCIE_REPLAYS = MetricSpec(
    "fabricscope_gpu_pcie_replays_total",
    "counter",
    "PCIe link-level replays (retransmissions) of the GPU since the driver loaded.",
    _G,
)
REMAPPED_ROWS = MetricSpec(
    "fabricscope_gpu_remapped_rows_total",
    "counter",
    "GPU memory rows remapped, by reason (correctable, uncorrectable memory errors).",
    ("gpu", "reason"),
)
ROW_REMAP_PENDING = MetricSpec(
    "fabricscope_gpu_row_remap_pending",
    "gauge",
    "1 when a row remap waits for a GPU reset, else 0.",
    _G,
)
ROW_REMAP_FAILURE = MetricSpec(
    "fabricscope_gpu_row_remap_failure",
    "gauge",
    "1 when a row remap failed (the GPU needs service), else 0.",
    _G,
)
ECC_ERRORS = MetricSpec(
    "fabricscope_gpu_ecc_errors_total",
    "counter",
    "Volatile ECC memory errors since the driver loaded, by reason (correctable, uncorrectable).",
    ("gpu", "reason"),
)
CLOCKS_EVENT_ACTIVE = MetricSpec(
    "fabricscope_gpu_clocks_event_active",
    "gauge",
    "1 while a clock-event (throttle) reason holds the GPU's clocks down, else 0, per reason "
    "(sw_power_cap, hw_slowdown, hw_thermal_slowdown, sw_thermal_slowdown, "
    "hw_power_brake_slowdown, gpu_idle ...).",
    ("gpu", "reason"),
    fold="Below full, only the reasons that slow a GPU down (sw_power_cap and the "
    "slowdowns); gpu_idle, applications_clocks_setting, sync_boost and "
    "display_clock_setting are exported at full only.",
)
COMPUTE_PROCESSES = MetricSpec(
    "fabricscope_gpu_compute_processes",
    "gauge",
    "Compute processes running on the GPU.",
    _G,
)
XID_ERRORS = MetricSpec(
    "fabricscope_gpu_xid_errors_total",
    "counter",
    "XID critical-error events since the agent started watching, by XID code (reason). A "
    "series appears with its first event: alert on it existing as well as on increase().",
    ("gpu", "reason"),
)
XID_WATCHED = MetricSpec(
    "fabricscope_gpu_xid_watched",
    "gauge",
    "1 when the agent receives the GPU's XID events, 0 when NVML refused to register them.",
    _G,
)
NVLINK_UP = MetricSpec(
    "fabricscope_nvlink_up",
    "gauge",
    "1 when the NVLink is trained (active or in a low-power state), 0 when inactive.",
    _GL,
    fold="Below full, only the links that are down (0): fabricscope_gpu_nvlinks_up counts "
    "the trained links of each GPU.",
)
GPU_NVLINKS_UP = MetricSpec(
    "fabricscope_gpu_nvlinks_up",
    "gauge",
    "NVLinks of the GPU that are trained (active or in a low-power state): the per-GPU "
    "fold of fabricscope_nvlink_up.",
    _G,
)
NVLINK_VERSION = MetricSpec(
    "fabricscope_nvlink_version",
    "gauge",
    "NVLink version as nvmlDeviceGetNvLinkVersion numbers it.",
    _GL,
    fold=_SHARED_FOLD,
)
NVLINK_SPEED = MetricSpec(
    "fabricscope_nvlink_speed_bytes_per_second",
    "gauge",
    "Speed of an active NVLink per direction, in bytes per second.",
    _GL,
    unit="bytes_per_second",
    fold=_SHARED_FOLD,
)
NVLINK_REMOTE_INFO = MetricSpec(
    "fabricscope_nvlink_remote_info",
    "gauge",
    "The device at the far end of an active NVLink; always 1. pci_bus_id is the far end's PCI "
    "address (another GPU's, or an NVSwitch's); remote_type is GPU, NVSwitch, IBMNPU or unknown "
    "(empty when NVML does not say).",
    ("gpu", "link", "pci_bus_id", "remote_type"),
    detail="full",
)
NVLINK_REMOTE_LINKS = MetricSpec(
    "fabricscope_nvlink_remote_links",
    "gauge",
    "Active NVLinks of the GPU whose far end is the device at pci_bus_id (remote_type as in "
    "fabricscope_nvlink_remote_info): nvidia-smi topo -m's NV# between two GPUs.",
    ("gpu", "pci_bus_id", "remote_type"),
)
NVLINK_ERRORS = MetricSpec(
    "fabricscope_nvlink_errors_total",
    "counter",
    "NVLink data-link error counters, by reason: replay, recovery, crc_flit, crc_data, ecc_data. "
    "Sources: replay, recovery and crc_flit from the per-link NVML_FI_DEV_NVLINK_ERROR_DL_* "
    "fields (161-163, scopeId = link; on H100/H200 what nvidia-smi nvlink -e prints), else "
    "nvmlDeviceGetNvLinkErrorCounter; crc_data and ecc_data from "
    "nvmlDeviceGetNvLinkErrorCounter (non-zero on healthy Hopper links). The older per-link "
    "*_ERROR_COUNT_L<n> fields answer NOT_SUPPORTED on Hopper and the NVLink5 COUNT fields "
    "exist on Blackwell only. Each nvmlDeviceGetNvLinkErrorCounter call takes milliseconds, "
    "so each link's replay, recovery and crc_flit are read every 18th pass and crc_data and "
    "ecc_data every 72nd (9 and 36 min at the default 30 s --nvml.interval; --nvml.*-rotation); "
    "between reads the last value is exported.",
    ("gpu", "link", "reason"),
    fold="Below full, replay, recovery and crc_flit only on links where they are non-zero, "
    "crc_data and ecc_data (non-zero on healthy links) not per link: "
    "fabricscope_gpu_nvlink_errors_total sums each reason over the GPU's links.",
)
GPU_NVLINK_ERRORS = MetricSpec(
    "fabricscope_gpu_nvlink_errors_total",
    "counter",
    "NVLink data-link error counters summed over the GPU's links, by reason (replay, "
    "recovery, crc_flit, crc_data, ecc_data): the per-GPU fold of "
    "fabricscope_nvlink_errors_total, with its read rotation.",
    ("gpu", "reason"),
)
NVLINK_TRANSMITTED_BYTES = MetricSpec(
    "fabricscope_gpu_nvlink_transmitted_bytes_total",
    "counter",
    "Payload bytes the GPU sent over all of its NVLinks since the driver loaded (NVML's "
    "NVLINK_THROUGHPUT_DATA_TX field over every link, KiB converted to bytes; protocol "
    "overhead not counted). A job whose GPUs exchange data but move nothing here is not "
    "using NVLink. Read for each GPU every 2nd NVML pass (a minute at the default 30 s): "
    "take its rate over 2 minutes or more.",
    _G,
    unit="bytes",
)
NVLINK_RECEIVED_BYTES = MetricSpec(
    "fabricscope_gpu_nvlink_received_bytes_total",
    "counter",
    "Payload bytes the GPU received over all of its NVLinks since the driver loaded "
    "(NVLINK_THROUGHPUT_DATA_RX over every link, KiB converted to bytes), read as the "
    "transmitted bytes are.",
    _G,
    unit="bytes",
)

SPECS: tuple[MetricSpec, ...] = (
    GPU_INFO,
    DRIVER_INFO,
    NVML_INFO,
    GPU_LOST,
    PCIE_CURRENT_GENERATION,
    PCIE_MAX_GENERATION,
    PCIE_GENERATION_DEGRADED,
    PCIE_CURRENT_WIDTH,
    PCIE_MAX_WIDTH,
    PCIE_REPLAYS,
    REMAPPED_ROWS,
    ROW_REMAP_PENDING,
    ROW_REMAP_FAILURE,
    ECC_ERRORS,
    CLOCKS_EVENT_ACTIVE,
    COMPUTE_PROCESSES,
    XID_ERRORS,
    XID_WATCHED,
    NVLINK_UP,
    GPU_NVLINKS_UP,
    NVLINK_VERSION,
    NVLINK_SPEED,
    NVLINK_REMOTE_INFO,
    NVLINK_REMOTE_LINKS,
    NVLINK_ERRORS,
    GPU_NVLINK_ERRORS,
    NVLINK_TRANSMITTED_BYTES,
    NVLINK_RECEIVED_BYTES,
    *nvml_fabric.SPECS,
    *nvml_mig.SPECS,
)


def render(snap: NvmlSnapshot, out: Families) -> None:
    if snap.driver_version is not None:
        out.add(DRIVER_INFO, 1, snap.driver_version)
    if snap.nvml_version is not None:
        out.add(NVML_INFO, 1, snap.nvml_version)
    for gpu in snap.gpus:
        _render_gpu(gpu, out)
    for reg in snap.xid_registrations:
        out.add(XID_WATCHED, reg.watched, str(reg.gpu))
    for xid in snap.xid_errors:
        out.add(XID_ERRORS, xid.count, str(xid.gpu), str(xid.xid))
    nvml_fabric.render(snap, out)
    nvml_mig.render(snap, out)


def _render_gpu(gpu: NvmlGpu, out: Families) -> None:
    g = str(gpu.index)
    out.add(GPU_LOST, gpu.lost, g)
    if gpu.uuid is not None or gpu.pci_bus_id is not None:
        out.add(
            GPU_INFO,
            1,
            g,
            gpu.uuid or "",
            gpu.pci_bus_id or "",
            gpu.name or "",
            gpu.vbios_version or "",
        )
    pcie = gpu.pcie
    out.add(PCIE_CURRENT_GENERATION, pcie.current_generation, g)
    out.add(PCIE_MAX_GENERATION, pcie.max_generation, g)
    out.add(PCIE_GENERATION_DEGRADED, generation_degraded_under_load(gpu), g)
    out.add(PCIE_CURRENT_WIDTH, pcie.current_width, g)
    out.add(PCIE_MAX_WIDTH, pcie.max_width, g)
    out.add(PCIE_REPLAYS, pcie.replays, g)
    rows = gpu.remapped_rows
    if rows is not None:
        out.add(REMAPPED_ROWS, rows.correctable, g, "correctable")
        out.add(REMAPPED_ROWS, rows.uncorrectable, g, "uncorrectable")
        out.add(ROW_REMAP_PENDING, rows.pending, g)
        out.add(ROW_REMAP_FAILURE, rows.failure, g)
    out.add(ECC_ERRORS, gpu.ecc_corrected_volatile, g, "correctable")
    out.add(ECC_ERRORS, gpu.ecc_uncorrected_volatile, g, "uncorrectable")
    for reason, active in gpu.active_clocks_event_reasons() or ():
        if reason in SLOWDOWN_REASONS or not out.folds:
            out.add(CLOCKS_EVENT_ACTIVE, active, g, reason)
    if gpu.compute_processes is not None:
        out.add(COMPUTE_PROCESSES, len(gpu.compute_processes), g)
    out.add(NVLINK_TRANSMITTED_BYTES, gpu.nvlink_transmitted_bytes, g)
    out.add(NVLINK_RECEIVED_BYTES, gpu.nvlink_received_bytes, g)
    if gpu.nvlinks:
        _render_nvlinks(g, gpu.nvlinks, out)


def _shared(values: list[int | None]) -> int | None:
    """The value every link that reports one agrees on; None when they differ or none does."""
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 else None


def _render_nvlinks(g: str, links: tuple[NvLink, ...], out: Families) -> None:
    """Per link at full detail; below it, down links only, facts once per GPU when every
    link agrees, error counters per link only where they count a finding."""
    folds = out.folds
    out.add(GPU_NVLINKS_UP, sum(1 for link in links if link.up), g)
    version = _shared([link.version for link in links]) if folds else None
    speed = _shared([link.speed_bytes_per_second for link in links]) if folds else None
    out.add(NVLINK_VERSION, version, g, "")
    out.add(NVLINK_SPEED, speed, g, "")
    remotes: dict[tuple[str, str], int] = {}
    totals: dict[str, int] = {}
    for link in links:
        n = str(link.link)
        if not (folds and link.up):
            out.add(NVLINK_UP, link.up, g, n)
        if version is None:
            out.add(NVLINK_VERSION, link.version, g, n)
        if speed is None:
            out.add(NVLINK_SPEED, link.speed_bytes_per_second, g, n)
        if link.remote_pci_bus_id is not None:
            far = (link.remote_pci_bus_id, link.remote_device_type or "")
            remotes[far] = remotes.get(far, 0) + 1
            out.add(NVLINK_REMOTE_INFO, 1, g, n, *far)
        for reason, value in link.errors.items():
            if value is None:
                continue
            totals[reason] = totals.get(reason, 0) + value
            if not folds or (reason in LINK_FINDING_REASONS and value > 0):
                out.add(NVLINK_ERRORS, value, g, n, reason)
    for (bus, kind), count in sorted(remotes.items()):
        out.add(NVLINK_REMOTE_LINKS, count, g, bus, kind)
    for reason, total in totals.items():
        out.add(GPU_NVLINK_ERRORS, total, g, reason)
