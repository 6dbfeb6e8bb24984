"""Workload findings: what :class:`~agent.workload.records.WorkloadSnapshot` says is wrong with how
the GPU processes are placed and configured, as pure functions of a snapshot (the kinds
are described in :mod:`agent.workload.sampler`), and the ``NCCL_IB_HCA`` grammar they need.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent.core.findings import Finding
from agent.pci.sampler import format_cpulist
from agent.workload.gpudirect import PEERMEM_MODULES
from agent.workload.process import REDACTED
from agent.workload.records import GpuPlacement, RdmaDevice, WorkloadProcess, WorkloadSnapshot

#: per-process finding kinds (``kind`` label of ``fabricscope_workload_finding_processes``)
PROCESS_FINDING_KINDS = (
    "nccl_ib_disabled",
    "nccl_ib_hca_no_match",
    "nccl_ib_hca_wrong_numa",
    "process_cpus_off_gpu_numa",
)


# -- NCCL_IB_HCA -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HcaEntry:
    """One ``NCCL_IB_HCA`` entry: a device name prefix (the whole name when exact) and a
    port (``None``: any port)."""

    prefix: str
    port: int | None = None


@dataclass(frozen=True, slots=True)
class IbHcaSpec:
    """A parsed ``NCCL_IB_HCA``: ``exclude`` (``^``), ``exact`` (``=``) and the entries."""

    exclude: bool
    exact: bool
    entries: tuple[HcaEntry, ...]

    def selects(self, device: str, port: int = 1) -> bool:
        """Whether NCCL would use ``port`` of ``device`` (NCCL's ``matchIfList``): without
        ``=`` an entry matches every device whose name starts with it (``mlx5_1`` also
        matches ``mlx5_10``); an empty list matches everything (so ``^`` alone excludes
        every device)."""
        if not self.entries:
            matched = True
        else:
            matched = any(
                (device == e.prefix if self.exact else device.startswith(e.prefix))
                and (e.port is None or e.port == port)
                for e in self.entries
            )
        return matched != self.exclude


def _atoi(text: str) -> int:
    """C's ``atoi``: optional blanks and sign, then digits; 0 when there are none."""
    m = re.match(r"\s*([+-]?[0-9]+)", text)
    return int(m.group(1)) if m else 0


def parse_ib_hca(value: str) -> IbHcaSpec:
    """NCCL's ``NCCL_IB_HCA`` syntax (``src/transport/net_ib``, ``parseStringList``): an
    optional ``^`` (exclude), then an optional ``=`` (exact names), then comma-separated
    ``name[:port[:rail[:plane]]]`` entries; entries with an empty name are skipped, an empty
    port means any port, a port is read as C's ``atoi`` (``:x`` is port 0, matching none)."""
    s = value
    exclude = s.startswith("^")
    if exclude:
        s = s[1:]
    exact = s.startswith("=")
    if exact:
        s = s[1:]
    entries = []
    for entry in s.split(","):
        name, _, rest = entry.partition(":")
        if not name:
            continue
        port_text = rest.split(":", 1)[0]
        entries.append(HcaEntry(name, _atoi(port_text) if port_text else None))
    return IbHcaSpec(exclude, exact, tuple(entries))


def ib_disabled(proc: WorkloadProcess) -> str | None:
    """Why NCCL in this process will not use RDMA devices (a sentence fragment), or None."""
    disable = proc.setting("NCCL_IB_DISABLE")
    if disable is not None and disable != REDACTED:
        try:
            if int(disable.strip(), 0) != 0:  # NCCL reads it with strtoll(base 0)
                return f"NCCL_IB_DISABLE={disable}"
        except ValueError:
            pass  # NCCL warns and keeps its default (0) for a value that does not parse
    net = proc.setting("NCCL_NET")
    if net is not None and net.lower() == "socket":  # NCCL compares with strcasecmp
        return f"NCCL_NET={net}"
    return None


# -- findings ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class WorkloadFinding:
    """A per-process finding and the GPUs (NVML indices) it concerns."""

    finding: Finding
    pid: int
    gpus: tuple[int, ...]

    @property
    def kind(self) -> str:
        return self.finding.kind


def _who(p: WorkloadProcess) -> str:
    who = f"process {p.pid}"
    if p.pod is not None:
        who += f" ({p.pod.namespace}/{p.pod.pod}/{p.pod.container})"
    return who


def _gpu_text(g: GpuPlacement) -> str:
    return f"GPU {g.gpu}" + (f" ({g.pci_bus_id})" if g.pci_bus_id else "")


def _cpu_finding(
    p: WorkloadProcess, node_of: Mapping[int, tuple[int, ...]]
) -> tuple[Finding, tuple[int, ...]] | None:
    """``process_cpus_off_gpu_numa`` (see the module docstring) and the GPUs concerned."""
    local = {
        g.gpu: set(node_of[g.numa_node])
        for g in p.gpus
        if g.numa_node is not None and g.numa_node in node_of
    }
    known = [g for g in p.gpus if g.gpu in local]
    if not known:
        return None
    allowed = set(p.allowed_cpus)
    starved = [g for g in known if not allowed & local[g.gpu]]
    outside = allowed - set().union(*local.values()) if p.pinned else set()
    if not starved and not outside:
        return None
    gpus = ", ".join(f"{_gpu_text(g)} on NUMA node {g.numa_node}" for g in known)
    if starved:
        what = f"may run only on CPUs {format_cpulist(allowed)}, none on the NUMA node of "
        what += " or ".join(_gpu_text(g) for g in starved)
    else:
        nodes = "/".join(sorted({str(g.numa_node) for g in known}))
        what = (
            f"is pinned to CPUs {format_cpulist(allowed)}, {len(outside) / len(allowed):.0%} "
            f"of them ({format_cpulist(outside)}) off NUMA node {nodes}"
        )
    detail = f"{_who(p)} uses {gpus} but {what}"
    if p.pod is not None and p.pod.cpu_ids:
        off = any(m for g in known if (m := g.container_cpu_gpu_numa_mismatch) is not None)
        where = "also off" if off else "on"
        detail += (
            f"; the container's CPUs from kubelet ({format_cpulist(p.pod.cpu_ids)}) are "
            f"{where} the GPU's NUMA node"
        )
    finding = Finding("process_cpus_off_gpu_numa", f"pid {p.pid}", detail + ".")
    return finding, tuple(g.gpu for g in (starved or known))


def _hca_findings(p: WorkloadProcess, rdma: Sequence[RdmaDevice]) -> list[WorkloadFinding]:
    value = p.setting("NCCL_IB_HCA")
    if value is None or value == REDACTED or not rdma:
        return []
    spec = parse_ib_hca(value)
    chosen = [d for d in rdma if spec.selects(d.name)]
    all_gpus = tuple(g.gpu for g in p.gpus)
    subject = f"pid {p.pid}"
    if not chosen:
        names = ", ".join(d.name for d in rdma)
        return [
            WorkloadFinding(
                Finding(
                    "nccl_ib_hca_no_match",
                    subject,
                    f"{_who(p)} runs with NCCL_IB_HCA={value}, which selects none of the "
                    f"node's RDMA devices ({names}): NCCL will not use RDMA.",
                ),
                p.pid,
                all_gpus,
            )
        ]
    out = []
    for g in p.gpus:
        placed = [d for d in chosen if d.numa_node is not None]
        if g.numa_node is None or not placed or any(d.numa_node == g.numa_node for d in placed):
            continue
        names = ", ".join(f"{d.name} (NUMA node {d.numa_node})" for d in placed)
        out.append(
            WorkloadFinding(
                Finding(
                    "nccl_ib_hca_wrong_numa",
                    subject,
                    f"{_who(p)} runs with NCCL_IB_HCA={value}: it selects {names} and none "
                    f"on NUMA node {g.numa_node}, where {_gpu_text(g)} is.",
                ),
                p.pid,
                (g.gpu,),
            )
        )
    return out


def workload_findings(snap: WorkloadSnapshot) -> list[WorkloadFinding]:
    """Per-process findings (kinds in :data:`PROCESS_FINDING_KINDS`), sorted."""
    out: list[WorkloadFinding] = []
    node_of = {n.node: n.cpus for n in snap.numa_nodes if n.cpus is not None}
    for p in snap.processes:
        all_gpus = tuple(g.gpu for g in p.gpus)
        cpu = _cpu_finding(p, node_of)
        if cpu is not None:
            out.append(WorkloadFinding(cpu[0], p.pid, cpu[1]))
        why = ib_disabled(p)
        if why is not None and snap.rdma_devices:
            out.append(
                WorkloadFinding(
                    Finding(
                        "nccl_ib_disabled",
                        f"pid {p.pid}",
                        f"{_who(p)} runs with {why} on a node with {len(snap.rdma_devices)} "
                        "RDMA devices: NCCL sends inter-node traffic over TCP sockets.",
                    ),
                    p.pid,
                    all_gpus,
                )
            )
        elif why is None:
            out.extend(_hca_findings(p, snap.rdma_devices))
    return sorted(out)


def findings(snap: WorkloadSnapshot) -> list[Finding]:
    """Every workload finding: the per-process ones and ``gpudirect_rdma_unavailable``."""
    out = [w.finding for w in workload_findings(snap)]
    gd = snap.gpudirect
    if snap.has_gpus and snap.rdma_devices and gd.available is False:
        flavour = {"open": "open", "proprietary": "proprietary", "absent": "no"}
        out.append(
            Finding(
                "gpudirect_rdma_unavailable",
                "node",
                f"the node has GPUs and {len(snap.rdma_devices)} RDMA devices but neither "
                f"{' nor '.join(PEERMEM_MODULES)} is loaded and the "
                f"{flavour[gd.nvidia_module or 'absent']} NVIDIA kernel module offers no "
                "DMA-BUF path: NCCL stages RDMA traffic through host memory "
                "(modprobe nvidia_peermem).",
            )
        )
    return sorted(out)
