"""Where each GPU compute process may run relative to its GPUs and their nearest NICs: pure
judgements of a process's facts (:class:`~agent.workload.process.ProcessFacts`) against
the PCI snapshot and its topology (:func:`cpus_outside`: the fraction of the allowed CPUs
outside a NUMA node).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent.nvml.snapshot import NvmlGpu, NvmlSnapshot
from agent.pci.sampler import PciSnapshot
from agent.pci.topology import Topology
from agent.workload.process import ProcessFacts
from agent.workload.records import GpuPlacement, PodIdentity, RdmaDevice, WorkloadProcess


def cpus_outside(allowed: Iterable[int], local: Iterable[int]) -> float | None:
    """The fraction of ``allowed`` CPUs not in ``local``; ``None`` when ``allowed`` is
    empty."""
    allowed_set = set(allowed)
    if not allowed_set:
        return None
    return len(allowed_set - set(local)) / len(allowed_set)


def _known(node: int | None) -> int | None:
    return node if node is not None and node >= 0 else None


def rdma_devices(pci: PciSnapshot | None) -> tuple[RdmaDevice, ...]:
    if pci is None:
        return ()
    found = [
        RdmaDevice(name, nic.address, _known(nic.numa_node))
        for nic in pci.by_role("nic")
        for name in nic.rdma_devices
    ]
    return tuple(sorted(found, key=lambda d: (d.pci_bus_id, d.name)))


def gpus_by_pid(nvml: NvmlSnapshot | None) -> dict[int, list[NvmlGpu]]:
    out: dict[int, list[NvmlGpu]] = {}
    for gpu in nvml.gpus if nvml is not None else ():
        for p in gpu.compute_processes or ():
            out.setdefault(p.pid, []).append(gpu)
    return out


def _node_cpus(pci: PciSnapshot | None) -> dict[int, tuple[int, ...]]:
    if pci is None:
        return {}
    return {n.node: n.cpus for n in pci.numa_nodes if n.cpus is not None}


def _host_cpus(pci: PciSnapshot | None) -> frozenset[int] | None:
    """Every CPU of the host's NUMA nodes; None when a node's CPU list is unknown."""
    if pci is None or not pci.numa_nodes or any(n.cpus is None for n in pci.numa_nodes):
        return None
    return frozenset(c for n in pci.numa_nodes for c in n.cpus or ())


def _place(
    gpu: NvmlGpu,
    allowed: tuple[int, ...],
    container_cpus: tuple[int, ...] | None,
    pci: PciSnapshot | None,
    topo: Topology | None,
) -> GpuPlacement:
    dev = pci.get(gpu.pci_bus_id) if pci is not None and gpu.pci_bus_id else None
    if dev is None or pci is None:
        return GpuPlacement(gpu.index, gpu.pci_bus_id, gpu.uuid, None)
    nodes = _node_cpus(pci)
    numa = _known(dev.numa_node)
    local = nodes.get(numa) if numa is not None else None
    aff = next((a for a in topo.affinity if a.address == dev.address), None) if topo else None
    nics = [n for a in (aff.nearest_nics if aff else ()) if (n := pci.get(a)) is not None]
    nic_nodes = sorted({k for n in nics if (k := _known(n.numa_node)) is not None})
    nic_local: set[int] | None = None
    if nic_nodes and all(k in nodes for k in nic_nodes):
        nic_local = {c for k in nic_nodes for c in nodes[k]}
    return GpuPlacement(
        gpu=gpu.index,
        pci_bus_id=dev.address,
        uuid=gpu.uuid,
        numa_node=numa,
        nearest_rdma_devices=tuple(r for n in nics for r in n.rdma_devices),
        nic_numa_nodes=tuple(nic_nodes),
        cpu_gpu_numa_mismatch=cpus_outside(allowed, local) if local is not None else None,
        cpu_nic_numa_mismatch=cpus_outside(allowed, nic_local) if nic_local is not None else None,
        container_cpu_gpu_numa_mismatch=(
            cpus_outside(container_cpus, local) if container_cpus and local is not None else None
        ),
    )


def judge(
    facts: ProcessFacts,
    gpus: Sequence[NvmlGpu],
    pci: PciSnapshot | None,
    topo: Topology | None,
    pod: PodIdentity | None,
    *,
    host_netns: frozenset[str] = frozenset(),
) -> WorkloadProcess:
    host = _host_cpus(pci)
    pinned = None if host is None else not host <= set(facts.allowed)
    container_cpus = pod.cpu_ids if pod is not None else None
    placements = tuple(
        _place(g, facts.allowed, container_cpus, pci, topo)
        for g in sorted(gpus, key=lambda g: g.index)
    )
    return WorkloadProcess(
        pid=facts.pid,
        gpus=placements,
        allowed_cpus=facts.allowed,
        pinned=pinned,
        nccl_env=facts.env,
        pod=pod,
        ns_pid=facts.ns_pid,
        launch_rank=facts.rank,
        host_network=(None if facts.netns is None or not host_netns else facts.netns in host_netns),
    )
