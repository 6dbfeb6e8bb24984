"""``fabricscope_findings{kind}``: how many findings of each registered kind the node has
now, from every sampler's latest snapshot (:func:`agent.node_findings.collect`, the join
``fabricscope topo`` prints). One series per kind of every area whose sampler has data
(0 when it has none of that kind); kinds of an area without data are absent."""

from __future__ import annotations

from collections.abc import Mapping

from agent.core.runner import SamplerStatus
from agent.ibpeer.sampler import IbPeerSnapshot
from agent.infiniband.records import InfinibandSnapshot
from agent.node_findings import collect
from agent.nvml.snapshot import NvmlSnapshot
from agent.pci.sampler import PciSnapshot
from agent.throughput.records import ThroughputSnapshot
from agent.workload.records import WorkloadSnapshot
from exporter.metrics.spec import Families, MetricSpec

#: the owner of this fragment in the exposition cache
OWNER = "_findings"

FINDINGS = MetricSpec(
    "fabricscope_findings",
    "gauge",
    "Findings of this kind on the node now (the list `fabricscope topo` prints; kinds, "
    "severities and alerts in docs/metrics.md#findings); 0 for each kind of a sampler with "
    "data and no such finding, absent for kinds of samplers without data.",
    ("kind",),
)

SPECS: tuple[MetricSpec, ...] = (FINDINGS,)

#: the samplers whose snapshots the findings join: only their updates change the fragment
SOURCES = frozenset({"pci", "infiniband", "ibpeer", "nvml", "workload", "throughput"})


def _snap(statuses: Mapping[str, SamplerStatus], name: str, kind: type[object]) -> object:
    st = statuses.get(name)
    snap = st.snapshot if st is not None else None
    return snap if isinstance(snap, kind) else None


def render(statuses: Mapping[str, SamplerStatus], out: Families) -> None:
    pci = _snap(statuses, "pci", PciSnapshot)
    ib = _snap(statuses, "infiniband", InfinibandSnapshot)
    gpu = _snap(statuses, "nvml", NvmlSnapshot)
    work = _snap(statuses, "workload", WorkloadSnapshot)
    peer = _snap(statuses, "ibpeer", IbPeerSnapshot)
    tp = _snap(statuses, "throughput", ThroughputSnapshot)
    assert pci is None or isinstance(pci, PciSnapshot)
    assert ib is None or isinstance(ib, InfinibandSnapshot)
    assert gpu is None or isinstance(gpu, NvmlSnapshot)
    assert work is None or isinstance(work, WorkloadSnapshot)
    assert peer is None or isinstance(peer, IbPeerSnapshot)
    assert tp is None or isinstance(tp, ThroughputSnapshot)
    node = collect(pci=pci, ib=ib, gpu=gpu, work=work, peer=peer, tp=tp)
    for kind, n in node.counts().items():
        out.add(FINDINGS, n, kind)
