"""Every finding of a node, from whichever snapshots exist: the join behind
``fabricscope topo`` and the ``fabricscope_findings{kind}`` series. Pure.

Each area contributes its own kinds (registered in :data:`agent.core.findings.KINDS`); an area
whose snapshot is absent (sampler off, no hardware, snapshot replay without it) contributes
nothing and is listed in :attr:`NodeFindings.areas_missing`, so "no finding" and "not
looked" stay apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.core.findings import KINDS, Area, Finding
from agent.ibpeer import sampler as ibpeer
from agent.ibpeer.sampler import IbPeerSnapshot
from agent.infiniband import capacity
from agent.infiniband import findings as infiniband_findings
from agent.infiniband.records import InfinibandSnapshot
from agent.nvml import findings as nvml_findings
from agent.nvml.snapshot import NvmlSnapshot
from agent.pci import topology
from agent.pci.sampler import PciSnapshot
from agent.throughput.findings import findings as throughput_findings
from agent.throughput.records import ThroughputSnapshot
from agent.workload import findings as workload_findings
from agent.workload.records import WorkloadSnapshot

AREAS: tuple[Area, ...] = ("infiniband", "pci", "nvml", "workload")
#: areas counted when their snapshot is there, never listed as missing: the ibpeer sampler
#: needs more than sysfs (infiniband-diags and the umad device, which most nodes lack), and
#: the throughput sampler has nothing to say on a node without training logs
OPT_IN_AREAS: tuple[Area, ...] = ("ibpeer", "throughput")


@dataclass(frozen=True, slots=True)
class NodeFindings:
    """``findings`` sorted; ``areas_checked`` the areas whose snapshot was there."""

    findings: tuple[Finding, ...]
    areas_checked: tuple[Area, ...]

    @property
    def areas_missing(self) -> tuple[Area, ...]:
        return tuple(a for a in AREAS if a not in self.areas_checked)

    def counts(self) -> dict[str, int]:
        """Findings per kind, 0 for every registered kind of a checked area."""
        out = {k.kind: 0 for k in KINDS.values() if k.area in self.areas_checked}
        for f in self.findings:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out


def collect(
    *,
    pci: PciSnapshot | topology.Topology | None = None,
    ib: InfinibandSnapshot | None = None,
    gpu: NvmlSnapshot | None = None,
    work: WorkloadSnapshot | None = None,
    peer: IbPeerSnapshot | None = None,
    tp: ThroughputSnapshot | None = None,
) -> NodeFindings:
    """All findings of the snapshots given (``pci`` may be an already analysed topology)."""
    found: list[Finding] = []
    checked: list[Area] = []
    if ib is not None:
        found += infiniband_findings.findings(ib)
        found += capacity.findings(ib)
        checked.append("infiniband")
    if peer is not None:
        found += ibpeer.findings(peer)
        checked.append("ibpeer")
    if pci is not None:
        topo = pci if isinstance(pci, topology.Topology) else topology.analyse(pci)
        found += topology.findings(topo)
        checked.append("pci")
    if gpu is not None:
        found += nvml_findings.findings(gpu)
        checked.append("nvml")
    if work is not None:
        found += workload_findings.findings(work)
        checked.append("workload")
    if tp is not None:
        found += throughput_findings(tp)
        checked.append("throughput")
    return NodeFindings(tuple(sorted(found)), tuple(checked))
