"""``fabricscope topo``: the GPU/NIC matrix, the PCIe links and ACS state on the paths, the
RDMA ports and every finding of the node, as a table for people and JSON for programs.
Pure: it formats what :mod:`agent.pci.topology` and :mod:`agent.node_findings` derived.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from agent.core.findings import KINDS
from agent.ibpeer.records import IbPeerSnapshot, PeerPort
from agent.infiniband.records import InfinibandSnapshot
from agent.node_findings import NodeFindings
from agent.pci.sampler import PciDevice, format_cpulist
from agent.pci.topology import ACS_STATE_TEXT, LEGEND, LinkCheck, NvlinkCounts, Topology


def _numa_text(node: int | None) -> str:
    return "N/A" if node is None or node < 0 else str(node)


def _gpu_cell(topo: Topology, a: str, b: str, nvlinks: NvlinkCounts) -> str:
    n = nvlinks.get((a, b))
    return f"NV{n}" if n else (topo.path(a, b) or "?")


def _matrix(topo: Topology, nv: NvlinkCounts) -> list[str]:
    gpu_names = [f"GPU{i}" for i in range(len(topo.gpus))]
    nic_names = [f"NIC{i}" for i in range(len(topo.nics))]
    rows = [["", *gpu_names, *nic_names, "CPU Affinity", "NUMA Affinity"]]
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
    return lines


def _per_link(checks: Sequence[LinkCheck]) -> list[tuple[LinkCheck, list[str]]]:
    """Checks grouped by physical link: the functions of one device (a dual-port NIC's two
    ports) share their link, so it is counted and shown once, under its first function, as
    the ``pci_link_width_degraded`` finding and the alert count it."""
    groups: dict[tuple[str | None, str], tuple[LinkCheck, list[str]]] = {}
    for c in checks:
        slot, _, fn = c.device.rpartition(".")
        key = (c.partner, slot)
        if key in groups:
            groups[key][1].append(fn)
        else:
            groups[key] = (c, [])
    return list(groups.values())


def _links(topo: Topology) -> list[str]:
    links = _per_link(topo.links)
    bad = [(c, more) for c, more in links if c.degraded]
    unknown = [(c, more) for c, more in links if not c.reported]
    lines = [
        "",
        f"PCIe links on GPU/NIC paths: {len(links)} judged, {len(bad)} degraded, "
        f"{len(unknown)} not reported",
    ]
    if bad or unknown:
        lines.append("")

    def functions(more: list[str]) -> str:
        return f" (and function{'s' if len(more) > 1 else ''} {', '.join(more)})" if more else ""

    for c, more in bad:
        lines.append(
            f"  {c.partner} -> {c.device}{functions(more)}: x{c.width} of x{c.expected_width} "
            "(degraded)"
        )
    for c, more in unknown:
        lines.append(
            f"  {c.partner} -> {c.device}{functions(more)}: not reported ({c.not_reported})"
        )
    return lines


def _acs(topo: Topology) -> list[str]:
    lines = ["", "ACS on bridges of GPU/NIC paths:", ""]
    for c in topo.acs:
        ctl = f" (ACS Control 0x{c.control:04x})" if c.control is not None else ""
        note = ""
        if c.state == "redirect":
            note = ": finding" if c.judged else ": root port, not a finding"
        kind = c.port_type or "bridge"
        lines.append(f"  {c.address} {kind}: {ACS_STATE_TEXT[c.state]}{ctl}{note}")
    return lines if topo.acs else [*lines, "  none"]


#: the far end's counters ``fabricscope topo`` prints beside each cable
PEER_COUNTERS = ("symbol_error", "port_rcv_errors", "port_xmit_discards")


def _peer_errors(p: PeerPort) -> dict[str, int]:
    return {c.name: c.raw for c in p.peer_counters if c.name in PEER_COUNTERS}


def _peer_text(p: PeerPort) -> str:
    if p.peer is None:
        return "far end not read (see the log)"
    desc = f"{p.peer_description} " if p.peer_description else ""
    text = f"-> {desc}({p.peer.guid}) port {p.peer.local_port}, {p.peer.node_type}"
    errors = _peer_errors(p)
    counted = {k: v for k, v in errors.items() if v}
    if counted:
        text += "; there: " + ", ".join(f"{k} {v}" for k, v in sorted(counted.items()))
    elif errors:
        text += "; there: no errors"
    return text


def _ports(
    ib: InfinibandSnapshot | None, peer: IbPeerSnapshot | None, peers_note: str
) -> list[str]:
    lines = ["", "RDMA ports:", ""]
    if ib is None:
        return [*lines, "  not read (no InfiniBand sampler data)"]
    far = {(p.device, p.port): p for p in peer.ports} if peer is not None else {}
    for dev in ib.devices:
        for p in dev.ports:
            state = p.state.name if p.state else "unknown"
            phys = p.phys_state.name if p.phys_state else "unknown"
            nets = ",".join(p.netdevs) or "-"
            lines.append(
                f"  {dev.name}/{p.port} ({dev.pci_bus_id or '?'}, {p.link_layer or '?'}, "
                f"{nets}): {state} / {phys}"
            )
            cable = far.get((dev.name, p.port))
            if cable is not None:
                lines.append(f"      {_peer_text(cable)}")
    if len(lines) == 3:
        return [*lines, "  none"]
    return [*lines, f"  far ends of the InfiniBand cables: {peers_note}"] if peers_note else lines


def format_table(
    topo: Topology | None,
    node: NodeFindings,
    ib: InfinibandSnapshot | None = None,
    nvlinks: NvlinkCounts | None = None,
    failed: Collection[str] = (),
    *,
    unavailable: str = "no PCI data",
    peer: IbPeerSnapshot | None = None,
    peers_note: str = "",
) -> str:
    """An ``nvidia-smi topo -m``-like matrix (GPUs in PCI bus order; a GPU pair joined by
    NVLink shows ``NV#``), then links, ACS, RDMA ports (each InfiniBand port's far end from
    ``peer``, when read; ``peers_note`` says why not) and every finding of the node.
    ``failed``: areas whose sampler failed (crashed, hung, raised) rather than found no
    hardware; they are listed apart from the ones with no data. Without a topology (no PCI
    data: ``unavailable`` says why) the matrix, links and ACS are said to be unavailable and
    the RDMA ports and findings are shown all the same."""
    if topo is None:
        lines = [f"GPU/NIC matrix, PCIe links and ACS: unavailable ({unavailable})"]
    else:
        lines = _matrix(topo, nvlinks or {}) + _links(topo) + _acs(topo)
    lines += _ports(ib, peer, peers_note)
    lines += ["", "Findings:", ""]
    lines += [f"  {f.severity:<8} {f.kind} {f.subject}: {f.detail}" for f in node.findings] or [
        "  none"
    ]
    broken = [a for a in node.areas_missing if a in failed]
    absent = [a for a in node.areas_missing if a not in failed]
    if node.areas_missing:
        lines.append("")
    if absent:
        lines.append(f"  not checked (no data): {', '.join(absent)}")
    if broken:
        lines.append(f"  not checked (sampler failed, see the log): {', '.join(broken)}")
    return "\n".join(lines) + "\n"


def _device(d: PciDevice) -> dict[str, object]:
    return {
        "pci_bus_id": d.address,
        "numa_node": d.numa_node,
        "cpus": format_cpulist(d.cpus) if d.cpus is not None else None,
        "rdma_devices": list(d.rdma_devices),
        "netdevs": list(d.netdevs),
        "upstream": list(d.upstream),
        "virtual_function": d.virtfn,
    }


def to_json(
    topo: Topology | None,
    node: NodeFindings,
    ib: InfinibandSnapshot | None = None,
    nvlinks: NvlinkCounts | None = None,
    *,
    unavailable: str = "no PCI data",
    peer: IbPeerSnapshot | None = None,
) -> dict[str, object]:
    """A JSON-serialisable view with stable keys (``fabricscope topo --format json``).
    Without a topology the PCI keys are null and ``pci_unavailable`` says why (else null)."""
    pci = (
        dict.fromkeys(
            ("gpus", "nics", "gpu_nic_paths", "gpu_gpu_paths", "links", "acs", "acs_p2p_redirect")
        )
        if topo is None
        else _pci_json(topo, nvlinks or {})
    )
    return {
        **pci,
        "pci_unavailable": unavailable if topo is None else None,
        "rdma_ports": _ports_json(ib, peer),
        "findings": [
            {
                "kind": f.kind,
                "severity": f.severity,
                "subject": f.subject,
                "detail": f.detail,
                "alert": KINDS[f.kind].alert,
            }
            for f in node.findings
        ],
        "areas_not_checked": list(node.areas_missing),
    }


def _pci_json(topo: Topology, nv: NvlinkCounts) -> dict[str, object]:
    return {
        "gpus": [
            {
                **_device(g),
                "index": a.index,
                "nearest_nics": list(a.nearest_nics),
                "nearest_path_type": a.nearest_path_type,
                "nearest_nic_cross_numa": a.cross_numa,
            }
            for g, a in zip(topo.gpus, topo.affinity, strict=True)
        ],
        "nics": [_device(n) for n in topo.nics],
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
                "reported": c.reported,
                "not_reported": c.not_reported,
                "degraded": c.degraded,
            }
            for c in topo.links
        ],
        "acs": [
            {
                "pci_bus_id": c.address,
                "port_type": c.port_type,
                "state": c.state,
                "control": c.control,
                "judged": c.judged,
                "finding": c.finding,
            }
            for c in topo.acs
        ],
        "acs_p2p_redirect": list(topo.acs_redirect),
    }


def _peer_json(p: PeerPort | None) -> dict[str, object] | None:
    if p is None or p.peer is None:
        return None
    return {
        "guid": p.peer.guid,
        "port": p.peer.local_port,
        "node_type": p.peer.node_type,
        "description": p.peer_description,
        "lid": p.peer_lid,
        "counters": _peer_errors(p),
    }


def _ports_json(
    ib: InfinibandSnapshot | None, peer: IbPeerSnapshot | None = None
) -> list[dict[str, object]] | None:
    far = {(p.device, p.port): p for p in peer.ports} if peer is not None else {}
    return (
        None
        if ib is None
        else [
            {
                "device": dev.name,
                "port": p.port,
                "pci_bus_id": dev.pci_bus_id,
                "link_layer": p.link_layer,
                "netdevs": list(p.netdevs),
                "state": p.state.name if p.state else None,
                "physical_state": p.phys_state.name if p.phys_state else None,
                "peer": _peer_json(far.get((dev.name, p.port))),
            }
            for dev in ib.devices
            for p in dev.ports
        ]
    )
