"""GPU <-> NIC <-> CPU affinity from a :class:`~agent.pci.PciSnapshot` alone: the
``nvidia-smi topo -m`` path types, each GPU's nearest NIC(s), degraded PCIe links and ACS
peer-to-peer redirection on the paths. Pure functions; nothing here touches the host.

Path types (nvidia-smi's legend)
    PIX   at most a single PCIe bridge (one switch, or one root port) between the two
    PXB   several PCIe bridges, without traversing the host bridge
    PHB   through a PCIe host bridge: same root complex, different root ports
    NODE  between host bridges within one NUMA node
    SYS   across the SMP interconnect between NUMA nodes

    A PCIe switch is an upstream port plus its downstream ports, so a path counts
    *switches*: the bridges it traverses, with each downstream port folded into the upstream
    port above it (what NCCL does when it skips the downstream port in its topology). Port
    types come from config space when it was readable; otherwise by depth below the root
    port (odd: upstream port, even: downstream port), which holds for every PCIe tree made of
    switches. Between host bridges, the NUMA nodes of the two root complexes decide (the root
    port's ``numa_node``, else the device's own): equal -> NODE, different -> SYS, both
    unknown (-1: a platform without NUMA) -> NODE, one unknown -> SYS. Cross-NUMA placement
    of a GPU's nearest NIC is judged on the devices' own ``numa_node``, which is what the
    drivers allocate queues and memory on.

Ranks
    :data:`PATH_RANK` numbers the types PIX=1, PXB=2, PHB=3, NODE=4, SYS=5 (lower is closer).
    NVLink (``NV#``) comes from NVML, not from here.

Links
    Both ends of a PCIe link report its width. Each link is judged once, at its downstream
    end (an endpoint, or a switch upstream port); root ports and switch downstream ports
    report the link below them, which their child judges. A link is *width-degraded* when
    its current width is below what both ends support (``min`` of the two max widths).
    Speed is not judged: GPUs and NICs drop their link speed when idle, by design.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from agent.findings import Finding
from agent.pci import PciDevice, PciSnapshot, format_cpulist

PathType = Literal["PIX", "PXB", "PHB", "NODE", "SYS"]
PATH_TYPES: tuple[PathType, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")
PATH_RANK: dict[PathType, int] = {t: i + 1 for i, t in enumerate(PATH_TYPES)}

LEGEND = (
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes"),
    ("NODE", "Connection traversing PCIe and the interconnect between host bridges in a node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks (from NVML, when it answers)"),
)

#: active NVLinks between two GPUs, keyed by both GPUs' PCI addresses, in both orders
NvlinkCounts = Mapping[tuple[str, str], int]


@dataclass(frozen=True, slots=True)
class DevicePath:
    """The path type between two devices (GPU-NIC: ``a`` is the GPU)."""

    a: str
    b: str
    path_type: PathType


@dataclass(frozen=True, slots=True)
class GpuAffinity:
    """One GPU's placement. ``index`` is its position in PCI bus order (what nvidia-smi and
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` number). ``nearest_nics`` are the NICs with the best
    path type (ties all listed); ``cross_numa`` is True when every nearest NIC whose NUMA
    node is known sits on another node than the GPU, None when that cannot be told."""

    address: str
    index: int
    numa_node: int | None
    cpus: tuple[int, ...] | None
    nearest_nics: tuple[str, ...]
    nearest_path_type: PathType | None
    cross_numa: bool | None


@dataclass(frozen=True, slots=True)
class LinkCheck:
    """One PCIe link on a GPU/NIC path, judged at its downstream end ``device``.

    ``expected_width`` is the narrower of the two ends' max widths (None if unknown).
    """

    device: str
    partner: str | None
    width: int | None
    expected_width: int | None
    degraded: bool | None


@dataclass(frozen=True, slots=True)
class Topology:
    """Everything :func:`analyse` derives. Devices keep the snapshot's (address) order."""

    gpus: tuple[PciDevice, ...]
    nics: tuple[PciDevice, ...]
    gpu_nic: tuple[DevicePath, ...]
    gpu_gpu: tuple[DevicePath, ...]
    affinity: tuple[GpuAffinity, ...]
    links: tuple[LinkCheck, ...]
    acs_redirect: tuple[str, ...]
    snapshot: PciSnapshot

    def path(self, a: str, b: str) -> PathType | None:
        for p in (*self.gpu_nic, *self.gpu_gpu):
            if (p.a, p.b) in ((a, b), (b, a)):
                return p.path_type
        return None


# -- classification ----------------------------------------------------------------------


def _known_numa(d: PciDevice) -> int | None:
    return d.numa_node if d.numa_node is not None and d.numa_node >= 0 else None


def _root_complex_numa(d: PciDevice, snap: PciSnapshot) -> int | None:
    """The NUMA node of the device's root complex: its root port's ``numa_node`` (the bus's
    node, which one device's overridden ``numa_node`` does not move), else its own."""
    root = snap.get(d.upstream[0]) if d.upstream else None
    node = _known_numa(root) if root is not None else None
    return node if node is not None else _known_numa(d)


def _is_downstream_port(bridge: PciDevice | None, depth: int) -> bool:
    if bridge is not None and bridge.port_type is not None:
        return bridge.port_type == "downstream_port"
    return depth >= 2 and depth % 2 == 0


def _switch_of(chain: tuple[str, ...], i: int, snap: PciSnapshot) -> str:
    """The switch a bridge belongs to, named by its upstream port (a root port is its own)."""
    if i >= 1 and _is_downstream_port(snap.get(chain[i]), i):
        return chain[i - 1]
    return chain[i]


def path_type(a: PciDevice, b: PciDevice, snap: PciSnapshot) -> PathType:
    """The ``nvidia-smi topo -m`` path type between two devices of ``snap``."""
    if a.host_bridge != b.host_bridge:
        na, nb = _root_complex_numa(a, snap), _root_complex_numa(b, snap)
        return "NODE" if na == nb else "SYS"
    ua, ub = a.upstream, b.upstream
    common = 0
    while common < min(len(ua), len(ub)) and ua[common] == ub[common]:
        common += 1
    if common == 0:
        return "PHB"
    switches = {_switch_of(ua, i, snap) for i in range(common - 1, len(ua))}
    switches |= {_switch_of(ub, i, snap) for i in range(common, len(ub))}
    return "PIX" if len(switches) <= 1 else "PXB"


# -- analysis ----------------------------------------------------------------------------


def _link_checks(snap: PciSnapshot, on_paths: Iterable[str]) -> tuple[LinkCheck, ...]:
    out = []
    for addr in sorted(set(on_paths)):
        dev = snap.get(addr)
        if dev is None:
            continue
        depth = len(dev.upstream)
        if dev.role == "bridge":
            if dev.port_type is not None:
                judged_here = dev.port_type in ("upstream_port", "pci_to_pcie_bridge")
            else:
                judged_here = depth % 2 == 1
            if not judged_here:
                continue  # root or downstream port: its child judges the link below it
        if not dev.upstream:
            continue  # on a root bus: no link to judge (root-complex integrated)
        partner = snap.get(dev.upstream[-1])
        widths = [dev.link.max_width]
        if partner is not None:
            widths.append(partner.link.max_width)
        known = [w for w in widths if w is not None and w > 0]
        expected = min(known) if known else None
        width = dev.link.width
        degraded = None if width is None or expected is None else width < expected
        out.append(LinkCheck(addr, dev.upstream[-1], width, expected, degraded))
    return tuple(out)


def analyse(snap: PciSnapshot) -> Topology:
    """Derive paths, affinity, link checks and ACS state from one snapshot."""
    gpus = snap.by_role("gpu")
    nics = snap.by_role("nic")
    gpu_nic = tuple(
        DevicePath(g.address, n.address, path_type(g, n, snap)) for g in gpus for n in nics
    )
    gpu_gpu = tuple(
        DevicePath(g.address, h.address, path_type(g, h, snap))
        for i, g in enumerate(gpus)
        for h in gpus[i + 1 :]
    )
    nic_by_addr = {n.address: n for n in nics}
    affinity = []
    for index, g in enumerate(gpus):
        mine = [p for p in gpu_nic if p.a == g.address]
        best = min((PATH_RANK[p.path_type] for p in mine), default=None)
        nearest = tuple(p.b for p in mine if PATH_RANK[p.path_type] == best)
        best_type = PATH_TYPES[best - 1] if best is not None else None
        cross: bool | None = None
        gnode = _known_numa(g)
        nodes = [n for n in (_known_numa(nic_by_addr[a]) for a in nearest) if n is not None]
        if gnode is not None and nodes:
            cross = all(n != gnode for n in nodes)
        affinity.append(
            GpuAffinity(g.address, index, g.numa_node, g.cpus, nearest, best_type, cross)
        )
    on_paths = [a for d in (*gpus, *nics) for a in (d.address, *d.upstream)]
    acs = tuple(
        a
        for a in sorted(set(on_paths))
        if (d := snap.get(a)) is not None
        and d.role == "bridge"
        and d.acs is not None
        and d.acs.p2p_redirect
        and not _is_root_port(d)
    )
    return Topology(
        gpus=gpus,
        nics=nics,
        gpu_nic=gpu_nic,
        gpu_gpu=gpu_gpu,
        affinity=tuple(affinity),
        links=_link_checks(snap, on_paths),
        acs_redirect=acs,
        snapshot=snap,
    )


def _is_root_port(d: PciDevice) -> bool:
    if d.port_type is not None:
        return d.port_type == "root_port"
    return not d.upstream


def _nic_name(n: PciDevice | None, address: str) -> str:
    if n is not None and n.rdma_devices:
        return f"{','.join(n.rdma_devices)} ({address})"
    return address


def findings(topo: Topology) -> list[Finding]:
    """Conditions to act on: ``nic_cross_numa`` (subject: the GPU), ``pci_link_width_degraded``
    (the downstream end of the narrow link; one finding per link even for multi-function
    devices), ``acs_p2p_redirect`` (the bridge; root ports are not judged: P2P between root
    ports crosses the root complex anyway). Sorted."""
    snap = topo.snapshot
    out: list[Finding] = []
    for aff in topo.affinity:
        if aff.cross_numa:
            names = ", ".join(_nic_name(snap.get(a), a) for a in aff.nearest_nics)
            nic_nodes = sorted(
                {str(d.numa_node) for a in aff.nearest_nics if (d := snap.get(a)) is not None}
            )
            out.append(
                Finding(
                    "nic_cross_numa",
                    aff.address,
                    f"GPU {aff.address} is on NUMA node {aff.numa_node} but its nearest NIC "
                    f"{names} ({aff.nearest_path_type}) is on NUMA node "
                    f"{'/'.join(nic_nodes)}",
                )
            )
    seen_links: set[tuple[str | None, str]] = set()
    for link in topo.links:
        if not link.degraded:
            continue
        slot = (link.partner, link.device.rsplit(".", 1)[0])  # functions share one link
        if slot in seen_links:
            continue
        seen_links.add(slot)
        out.append(
            Finding(
                "pci_link_width_degraded",
                link.device,
                f"PCIe link {link.partner} -> {link.device} trained at x{link.width}, "
                f"both ends support x{link.expected_width}",
            )
        )
    for addr in topo.acs_redirect:
        d = snap.get(addr)
        control = d.acs.control if d is not None and d.acs is not None else 0
        out.append(
            Finding(
                "acs_p2p_redirect",
                addr,
                f"bridge {addr} redirects peer-to-peer traffic to the root complex (ACS "
                f"Control 0x{control:04x}); GPUDirect P2P/RDMA through it takes the long way",
            )
        )
    return sorted(out)


# -- presentation ------------------------------------------------------------------------


def _numa_text(node: int | None) -> str:
    return "N/A" if node is None or node < 0 else str(node)


def _gpu_cell(topo: Topology, a: str, b: str, nvlinks: NvlinkCounts) -> str:
    n = nvlinks.get((a, b))
    return f"NV{n}" if n else (topo.path(a, b) or "?")


def format_table(topo: Topology, nvlinks: NvlinkCounts | None = None) -> str:
    """An ``nvidia-smi topo -m``-like matrix: GPU rows, GPU and NIC columns, then CPU and
    NUMA affinity, legends and the findings. GPUs are numbered in PCI bus order. A GPU pair
    joined by NVLink shows ``NV#`` (from ``nvlinks``) instead of its PCIe path."""
    nv = nvlinks or {}
    gpu_names = [f"GPU{i}" for i in range(len(topo.gpus))]
    nic_names = [f"NIC{i}" for i in range(len(topo.nics))]
    header = ["", *gpu_names, *nic_names, "CPU Affinity", "NUMA Affinity"]
    rows = [header]
    for i, g in enumerate(topo.gpus):
        cells = [gpu_names[i]]
        for h in topo.gpus:
            cells.append(" X " if h is g else _gpu_cell(topo, g.address, h.address, nv))
        for n in topo.nics:
            cells.append(topo.path(g.address, n.address) or "?")
        cells.append(format_cpulist(g.cpus) if g.cpus is not None else "N/A")
        cells.append(_numa_text(g.numa_node))
        rows.append(cells)
    lines = ["\t".join(r).rstrip() for r in rows]
    lines += ["", "Legend:", ""]
    lines += [f"  {k:<4} = {v}" for k, v in LEGEND]
    lines += ["", "GPU Legend:", ""]
    lines += [f"  {gpu_names[i]}: {g.address}" for i, g in enumerate(topo.gpus)] or ["  none"]
    if topo.nics:
        lines += ["", "NIC Legend:", ""]
        for i, n in enumerate(topo.nics):
            name = ",".join(n.rdma_devices) if n.rdma_devices else "(no RDMA device)"
            lines.append(f"  {nic_names[i]}: {name} ({n.address})")
    found = findings(topo)
    lines += ["", "Findings:", ""]
    lines += [f"  {f.kind} {f.subject}: {f.detail}" for f in found] or ["  none"]
    return "\n".join(lines) + "\n"


def to_json(topo: Topology, nvlinks: NvlinkCounts | None = None) -> dict[str, object]:
    """A JSON-serialisable view with stable keys (``fabricscope topo --json``)."""
    nv = nvlinks or {}

    def device(d: PciDevice) -> dict[str, object]:
        return {
            "pci_bus_id": d.address,
            "numa_node": d.numa_node,
            "cpus": format_cpulist(d.cpus) if d.cpus is not None else None,
            "rdma_devices": list(d.rdma_devices),
            "netdevs": list(d.netdevs),
            "upstream": list(d.upstream),
        }

    return {
        "gpus": [
            {
                **device(g),
                "index": a.index,
                "nearest_nics": list(a.nearest_nics),
                "nearest_path_type": a.nearest_path_type,
                "nearest_nic_cross_numa": a.cross_numa,
            }
            for g, a in zip(topo.gpus, topo.affinity, strict=True)
        ],
        "nics": [device(n) for n in topo.nics],
        "gpu_nic_paths": [{"gpu": p.a, "nic": p.b, "path_type": p.path_type} for p in topo.gpu_nic],
        "gpu_gpu_paths": [
            {
                "gpu": p.a,
                "peer_gpu": p.b,
                "path_type": p.path_type,
                "nvlinks": nv.get((p.a, p.b), 0),
            }
            for p in topo.gpu_gpu
        ],
        "links": [
            {
                "pci_bus_id": c.device,
                "upstream_pci_bus_id": c.partner,
                "width": c.width,
                "expected_width": c.expected_width,
                "degraded": c.degraded,
            }
            for c in topo.links
        ],
        "acs_p2p_redirect": list(topo.acs_redirect),
        "findings": [
            {"kind": f.kind, "subject": f.subject, "detail": f.detail} for f in findings(topo)
        ],
    }
