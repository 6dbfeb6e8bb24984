"""Metric specs and rendering for the pci sampler: PCI devices and links, NUMA nodes, and the
GPU <-> NIC topology that :func:`agent.pci.topology.analyse` derives from the same snapshot.

Path ranks (``fabricscope_topology_*_path_rank``) number nvidia-smi's path types from near to
far: 1 PIX, 2 PXB, 3 PHB, 4 NODE, 5 SYS.
"""

from __future__ import annotations

from agent.pci.sampler import PciDevice, PciSnapshot, format_cpulist
from agent.pci.topology import PATH_RANK, analyse
from exporter.metrics.spec import Families, MetricSpec

_ID = ("pci_bus_id",)
_BRIDGE_FOLD = (
    "Below full, for GPUs and NICs only: a bridge's links are covered by "
    "fabricscope_pci_link_width_degraded at the downstream end of each link on a GPU or "
    "NIC path."
)

DEVICE_INFO = MetricSpec(
    "fabricscope_pci_device_info",
    "gauge",
    "A GPU, RDMA NIC or a bridge on their path to the root complex; always 1. vendor and "
    "model are PCI ids (0x10de, 0x2330); parent_pci_bus_id is the upstream bridge; "
    "port_type is the PCIe port type from config space (bridges only: root_port, "
    "upstream_port, downstream_port ...); empty values are attributes the device does not "
    "expose or that could not be read.",
    (
        "pci_bus_id",
        "role",
        "vendor",
        "model",
        "driver",
        "parent_pci_bus_id",
        "numa_node",
        "port_type",
    ),
)
LINK_SPEED = MetricSpec(
    "fabricscope_pci_link_speed_transfers_per_second",
    "gauge",
    "Current PCIe link speed (current_link_speed). GPUs and NICs lower it when idle, by design.",
    _ID,
    "transfers_per_second",
    fold=_BRIDGE_FOLD,
)
LINK_MAX_SPEED = MetricSpec(
    "fabricscope_pci_link_max_speed_transfers_per_second",
    "gauge",
    "Fastest PCIe link speed the device supports (max_link_speed).",
    _ID,
    "transfers_per_second",
    fold=_BRIDGE_FOLD,
)
LINK_WIDTH = MetricSpec(
    "fabricscope_pci_link_width",
    "gauge",
    "Current PCIe link width in lanes (current_link_width).",
    _ID,
    fold=_BRIDGE_FOLD,
)
LINK_MAX_WIDTH = MetricSpec(
    "fabricscope_pci_link_max_width",
    "gauge",
    "Widest PCIe link the device supports, in lanes (max_link_width).",
    _ID,
    fold=_BRIDGE_FOLD,
)
LINK_WIDTH_DEGRADED = MetricSpec(
    "fabricscope_pci_link_width_degraded",
    "gauge",
    "1 when the link between this device and its upstream port trained narrower than both "
    "ends support, else 0. Exported at the downstream end of each link on a GPU or NIC path "
    "(endpoints and switch upstream ports). Absent where the link state is not reported "
    "(fabricscope_pci_link_reported 0).",
    _ID,
)
LINK_SPEED_DEGRADED = MetricSpec(
    "fabricscope_pci_link_speed_degraded",
    "gauge",
    "1 when a NIC's PCIe link runs below the speed both ends support (the slower of the two "
    "maximum speeds), else 0. NIC links only: NICs hold their trained speed at idle, GPUs "
    "do not (see fabricscope_gpu_pcie_link_generation_degraded). Absent where a speed is "
    "unknown or the link state is not reported.",
    _ID,
)
LINK_REPORTED = MetricSpec(
    "fabricscope_pci_link_reported",
    "gauge",
    "1 when the link between this device and its upstream port reports its state (current "
    "width and speed, and a maximum width at either end), else 0: SR-IOV virtual functions "
    "(Link Status reserved), width 0, speed Unknown, emulated ports without link reporting. "
    "Exported where fabricscope_pci_link_width_degraded would be, so a dashboard tells "
    "unknown from healthy.",
    _ID,
    fold="Below full, only where the state is not reported (0).",
)
ACS_P2P_REDIRECT = MetricSpec(
    "fabricscope_pci_acs_p2p_redirect_enabled",
    "gauge",
    "1 when the bridge's ACS Control redirects peer-to-peer requests or completions to the "
    "root complex, else 0 (also 0 without an ACS capability). Absent when config space is "
    "unreadable (needs CAP_SYS_ADMIN). Reads the register on root ports too, where it is no "
    "finding: peers behind different root ports cross the root complex either way.",
    _ID,
)
ACS_INFO = MetricSpec(
    "fabricscope_pci_acs_info",
    "gauge",
    "ACS state of a bridge on a GPU or NIC path; always 1. state is redirect (P2P request "
    "or completion redirect on), no_redirect, no_capability (no ACS capability) or "
    "unreadable (config space beyond 64 bytes needs CAP_SYS_ADMIN, or the read failed).",
    ("pci_bus_id", "state"),
    detail="full",
)
NUMA_NODE_INFO = MetricSpec(
    "fabricscope_numa_node_info",
    "gauge",
    "A NUMA node and its CPUs (devices/system/node/node*/cpulist); always 1.",
    ("numa_node", "cpus"),
)
GPU_NIC_PATH_INFO = MetricSpec(
    "fabricscope_topology_gpu_nic_path_info",
    "gauge",
    "The nvidia-smi topo -m path type between a GPU (pci_bus_id) and an RDMA device; always 1.",
    ("pci_bus_id", "device", "path_type"),
    detail="full",
)
GPU_NIC_PATH_RANK = MetricSpec(
    "fabricscope_topology_gpu_nic_path_rank",
    "gauge",
    "The GPU-to-RDMA-device path type as a number: 1 PIX, 2 PXB, 3 PHB, 4 NODE, 5 SYS.",
    ("pci_bus_id", "device"),
    fold="Below full, only each GPU's nearest RDMA devices (at the GPU's "
    "fabricscope_topology_gpu_nearest_nic_path_rank); the whole GPU x NIC matrix at full, "
    "and always in fabricscope topo.",
)
GPU_NEAREST_NIC_RANK = MetricSpec(
    "fabricscope_topology_gpu_nearest_nic_path_rank",
    "gauge",
    "Path type to the GPU's nearest NIC: 1 PIX, 2 PXB, 3 PHB, 4 NODE, 5 SYS.",
    _ID,
)
GPU_NEAREST_NIC_CROSS_NUMA = MetricSpec(
    "fabricscope_topology_gpu_nearest_nic_cross_numa",
    "gauge",
    "1 when every nearest NIC of the GPU reports another NUMA node than the GPU, else 0; "
    "absent when a NUMA node is unknown.",
    _ID,
)

SPECS: tuple[MetricSpec, ...] = (
    DEVICE_INFO,
    LINK_SPEED,
    LINK_MAX_SPEED,
    LINK_WIDTH,
    LINK_MAX_WIDTH,
    LINK_WIDTH_DEGRADED,
    LINK_SPEED_DEGRADED,
    LINK_REPORTED,
    ACS_P2P_REDIRECT,
    ACS_INFO,
    NUMA_NODE_INFO,
    GPU_NIC_PATH_INFO,
    GPU_NIC_PATH_RANK,
    GPU_NEAREST_NIC_RANK,
    GPU_NEAREST_NIC_CROSS_NUMA,
)


def _hex(value: int | None, digits: int) -> str:
    return "" if value is None else f"0x{value:0{digits}x}"


def _label(value: object) -> str:
    return "" if value is None else str(value)


def _render_device(d: PciDevice, out: Families) -> None:
    out.add(
        DEVICE_INFO,
        1,
        d.address,
        d.role,
        _hex(d.vendor, 4),
        _hex(d.device, 4),
        _label(d.driver),
        _label(d.parent),
        _label(d.numa_node),
        _label(d.port_type),
    )
    if d.role == "bridge" and out.folds:
        if d.acs is not None:
            out.add(ACS_P2P_REDIRECT, d.acs.p2p_redirect, d.address)
        return
    out.add(LINK_SPEED, d.link.speed_transfers_per_second, d.address)
    out.add(LINK_MAX_SPEED, d.link.max_speed_transfers_per_second, d.address)
    out.add(LINK_WIDTH, d.link.width, d.address)
    out.add(LINK_MAX_WIDTH, d.link.max_width, d.address)
    if d.role == "bridge" and d.acs is not None:
        out.add(ACS_P2P_REDIRECT, d.acs.p2p_redirect, d.address)


def render(snap: PciSnapshot, out: Families) -> None:
    for d in snap.devices:
        _render_device(d, out)
    for node in snap.numa_nodes:
        cpus = format_cpulist(node.cpus) if node.cpus is not None else ""
        out.add(NUMA_NODE_INFO, 1, str(node.node), cpus)
    topo = analyse(snap)
    folds = out.folds
    for link in topo.links:
        out.add(LINK_WIDTH_DEGRADED, link.degraded, link.device)
        out.add(LINK_SPEED_DEGRADED, link.speed_degraded, link.device)
        if not (folds and link.reported):
            out.add(LINK_REPORTED, link.reported, link.device)
    for acs in topo.acs:
        out.add(ACS_INFO, 1, acs.address, acs.state)
    nics = {n.address: n for n in topo.nics}
    nearest = {a.address: a.nearest_path_type for a in topo.affinity}
    for p in topo.gpu_nic:
        path_rank = PATH_RANK[p.path_type]
        near = nearest.get(p.a)
        if folds and (near is None or path_rank > PATH_RANK[near]):
            continue
        for rdma in nics[p.b].rdma_devices:  # a NIC without an RDMA device has nothing to join
            out.add(GPU_NIC_PATH_INFO, 1, p.a, rdma, p.path_type)
            out.add(GPU_NIC_PATH_RANK, path_rank, p.a, rdma)
    for aff in topo.affinity:
        rank = PATH_RANK[aff.nearest_path_type] if aff.nearest_path_type else None
        out.add(GPU_NEAREST_NIC_RANK, rank, aff.address)
        out.add(GPU_NEAREST_NIC_CROSS_NUMA, aff.cross_numa, aff.address)
