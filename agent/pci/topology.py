"""GPU <-> NIC <-> CPU affinity from a :class:`~agent.pci.sampler.PciSnapshot` alone: the
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
    its current width is below what both ends support (``min`` of the max widths the ends
    report). Speed is judged on NIC links only (``speed_degraded``): the current speed below
    the slower of the two ends' maximum speeds. NICs hold their trained speed at idle: every
    ConnectX-7 and ConnectX-6 Dx in two real ``lspci -vvv`` captures (a Dell 8x H100 server,
    an ASUS ESC8000A-E12) reads its maximum speed, while the idle RTX 6000 Ada GPUs of the
    second read 2.5 GT/s of 16: GPUs lower it at idle by design, so a GPU's speed is judged
    from NVML only while it runs compute processes (``agent.nvml.findings``). The expected
    speed takes both ends because a switch port reports the link below it, trained to the
    slower end: in the Dell capture the Gen5 switch's downstream ports above the Gen4
    ConnectX-6 Dx and NVMe drives read 16 GT/s of 32 ("downgraded"), correctly.

    A link is judged only on values actually reported. *Not reported* (``reported`` False,
    ``degraded`` None, never a finding): an SR-IOV virtual function (its Link Status
    register is reserved and reads 0), a current width of 0 or absent (with speed
    ``Unknown``: a VF passed into a VM, which has no ``physfn`` there), or no end reporting
    a maximum width above 0. Width is what is judged, so a reported width is judged whatever
    the speed file says. An end that reports a maximum width of 0
    (an emulated or virtual port without link reporting, as hypervisors' PCIe switches
    present them) is left out of the expected width instead of making the link look wide
    or narrow.

ACS
    Every bridge on a GPU's or NIC's path gets an :class:`AcsCheck`: ``redirect`` (P2P
    Request or Completion Redirect set), ``no_redirect``, ``no_capability`` (no ACS
    extended capability: nothing can redirect) or ``unreadable`` (config space beyond 64
    bytes needs CAP_SYS_ADMIN, or the read failed). A redirect is a finding on switch ports
    and other bridges, never on a root port. Why: ACS redirect decides between a peer route
    and an upstream route only where the paths of two peers diverge (Linux's p2pdma
    evaluates it there). Below a PCIe switch that is the switch's downstream ports: with
    redirect on, GPU<->GPU and GPU<->NIC traffic that would turn around inside the switch
    climbs to the root complex and back, which is what NCCL's troubleshooting guide warns
    of ("If PCI switches have ACS enabled, it needs to be disabled"). Peers behind
    *different* root ports diverge in the root complex itself: their traffic crosses it
    (the PHB/NODE/SYS path) with or without the redirect bit, which then only selects
    whether the root complex's IOMMU translates it, a property of the IOMMU mode
    (``iommu=pt``), not of the PCIe path. Linux sets redirect on every ACS-capable root
    port when an IOMMU is active; judging root ports would flag every such server while
    naming no path that gets longer. The series ``fabricscope_pci_acs_p2p_redirect_enabled``
    still reads 1 for a root port (the register's value); the shipped alert leaves root
    ports out by joining ``fabricscope_pci_device_info{port_type="root_port"}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from agent.core.findings import Finding
from agent.pci.sampler import PciDevice, PciSnapshot

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

    ``expected_width`` is the narrower of the max widths the two ends report (None if
    neither does). ``reported`` is False when the link state is not reported (see the
    module docstring); ``not_reported`` then says why and ``degraded`` is None.
    ``speed_degraded`` (NIC links only, else None): the current speed (transfers/second)
    below ``expected_speed``, the slower of the two ends' maximum speeds; None also where
    a speed is unknown.
    """

    device: str
    partner: str | None
    width: int | None
    expected_width: int | None
    degraded: bool | None
    reported: bool = True
    not_reported: str | None = None
    speed: int | None = None
    expected_speed: int | None = None
    speed_degraded: bool | None = None


AcsStateName = Literal["redirect", "no_redirect", "no_capability", "unreadable"]

#: how ``fabricscope topo`` words each ACS state
ACS_STATE_TEXT: dict[str, str] = {
    "redirect": "P2P redirect on",
    "no_redirect": "ACS capability present, P2P redirect off",
    "no_capability": "no ACS capability",
    "unreadable": "config space not readable (privilege: needs CAP_SYS_ADMIN)",
}


@dataclass(frozen=True, slots=True)
class AcsCheck:
    """ACS on one bridge of a GPU/NIC path. ``control`` is the ACS Control register (None
    unless the capability was read). ``judged`` is False for root ports (see the module
    docstring); ``finding`` is True when a redirect is judged."""

    address: str
    port_type: str | None
    state: AcsStateName
    control: int | None
    judged: bool

    @property
    def finding(self) -> bool:
        return self.judged and self.state == "redirect"


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
    acs: tuple[AcsCheck, ...] = ()

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


def _not_reported(dev: PciDevice) -> str | None:
    """Why ``dev``'s side of its upstream link reports nothing, or None when it does."""
    if dev.virtfn:
        return "SR-IOV virtual function: its Link Status register is reserved"
    if dev.link.width is None or dev.link.width == 0:
        if dev.link.speed_transfers_per_second is None:
            return "width 0 and speed Unknown: the link state is not reported"
        return "current width not reported (0 or absent)"
    return None


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
        why = _not_reported(dev)
        if why is None and expected is None:
            why = "no end reports a maximum width"
        if why is not None:
            out.append(LinkCheck(addr, dev.upstream[-1], width, expected, None, False, why))
            continue
        assert width is not None and expected is not None
        speeds = [dev.link.max_speed_transfers_per_second]
        if partner is not None:
            speeds.append(partner.link.max_speed_transfers_per_second)
        known_speeds = [s for s in speeds if s is not None and s > 0]
        expected_speed = min(known_speeds) if known_speeds else None
        speed = dev.link.speed_transfers_per_second
        speed_degraded = None
        if dev.role == "nic" and speed is not None and expected_speed is not None:
            speed_degraded = speed < expected_speed
        out.append(
            LinkCheck(
                addr,
                dev.upstream[-1],
                width,
                expected,
                width < expected,
                speed=speed,
                expected_speed=expected_speed,
                speed_degraded=speed_degraded,
            )
        )
    return tuple(out)


def _acs_checks(snap: PciSnapshot, on_paths: Iterable[str]) -> tuple[AcsCheck, ...]:
    out = []
    for addr in sorted(set(on_paths)):
        d = snap.get(addr)
        if d is None or d.role != "bridge":
            continue
        state: AcsStateName
        if d.acs is None:
            state = "unreadable"
        elif d.acs.offset is None:
            state = "no_capability"
        else:
            state = "redirect" if d.acs.p2p_redirect else "no_redirect"
        control = d.acs.control if d.acs is not None and d.acs.offset is not None else None
        out.append(AcsCheck(addr, d.port_type, state, control, judged=not _is_root_port(d)))
    return tuple(out)


#: the latest snapshot analysed and its topology: the PCI fragment, the node's findings and
#: the workload sampler each analyse the same pass's snapshot (a snapshot is frozen)
_last: list[tuple[PciSnapshot, Topology]] = []


def analyse(snap: PciSnapshot) -> Topology:
    """Derive paths, affinity, link checks and ACS state from one snapshot (the latest
    snapshot's answer is kept: asked again for the same snapshot, the same topology)."""
    last = _last[0] if _last else None
    if last is not None and last[0] is snap:
        return last[1]
    topo = _analyse(snap)
    _last[:] = [(snap, topo)]
    return topo


def _analyse(snap: PciSnapshot) -> Topology:
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
    acs = _acs_checks(snap, on_paths)
    return Topology(
        gpus=gpus,
        nics=nics,
        gpu_nic=gpu_nic,
        gpu_gpu=gpu_gpu,
        affinity=tuple(affinity),
        links=_link_checks(snap, on_paths),
        acs_redirect=tuple(c.address for c in acs if c.finding),
        snapshot=snap,
        acs=acs,
    )


def _is_root_port(d: PciDevice) -> bool:
    if d.port_type is not None:
        return d.port_type == "root_port"
    return not d.upstream


def _nic_name(n: PciDevice | None, address: str) -> str:
    if n is not None and n.rdma_devices:
        return f"{','.join(n.rdma_devices)} ({address})"
    return address


def _gts(transfers: int | None) -> str:
    if transfers is None:
        return "an unknown speed"
    return f"{transfers / 1e9:g} GT/s"


def findings(topo: Topology) -> list[Finding]:
    """Conditions to act on: ``nic_cross_numa`` (subject: the GPU), ``pci_link_width_degraded``
    (the downstream end of the narrow link; one finding per link even for multi-function
    devices; links whose state is not reported are never one), ``pci_link_speed_degraded``
    (a NIC whose link runs below the speed both ends support; one per link),
    ``acs_p2p_redirect`` (the
    bridge; root ports are not judged: see the module docstring). Sorted."""
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
        partner = snap.get(link.partner) if link.partner else None
        both = partner is not None and (partner.link.max_width or 0) > 0
        support = (
            f"both ends support x{link.expected_width}"
            if both
            else f"the device supports x{link.expected_width} (its upstream port reports no width)"
        )
        out.append(
            Finding(
                "pci_link_width_degraded",
                link.device,
                f"PCIe link {link.partner} -> {link.device} trained at x{link.width}, {support}",
            )
        )
    seen_speed: set[tuple[str | None, str]] = set()
    for link in topo.links:
        if not link.speed_degraded:
            continue
        slot = (link.partner, link.device.rsplit(".", 1)[0])
        if slot in seen_speed:
            continue
        seen_speed.add(slot)
        nic = snap.get(link.device)
        out.append(
            Finding(
                "pci_link_speed_degraded",
                link.device,
                f"PCIe link {link.partner} -> NIC {_nic_name(nic, link.device)} runs at "
                f"{_gts(link.speed)}, below the {_gts(link.expected_speed)} both ends support; "
                "NICs hold their trained speed at idle, so this caps the NIC's bandwidth "
                "(reseat the card or riser, check the slot's BIOS speed setting)",
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
