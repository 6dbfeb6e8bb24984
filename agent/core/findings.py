"""Findings: conditions an SRE should act on, derived from snapshots by pure functions, and
the one vocabulary of their kinds.

Each area's analysis (``agent.infiniband.findings.findings``, ``agent.pci.topology.findings``,
``agent.nvml.findings.findings``, ``agent.workload.findings.findings``) returns a list of
:class:`Finding`; :func:`agent.node_findings.collect` joins them for ``fabricscope topo``
(table and JSON) and for the ``fabricscope_findings{kind}`` series. :data:`KINDS` is the
single registry: every kind a finding may carry, with its severity, the series an alert can
use and the shipped alert that fires on it. A :class:`Finding` of an unregistered kind
cannot be built, and docs/metrics.md is generated from the registry, so the CLI, the series,
the alerts and the docs cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning", "info"]
Area = Literal["infiniband", "ibpeer", "pci", "nvml", "workload", "throughput"]


@dataclass(frozen=True, slots=True)
class FindingKind:
    """One kind of finding.

    ``area`` is the sampler whose snapshot it is derived from. ``series`` is the per-object
    series that carries it (its identity labels name the subject); ``alert`` the shipped
    alert rule on that series, or None (then ``fabricscope_findings{kind}`` is the series an
    operator's own rule can use). ``alert_note`` says where the alert and the finding
    deliberately differ.
    """

    kind: str
    area: Area
    severity: Severity
    help: str
    series: str
    alert: str | None = None
    alert_note: str = ""


_KINDS: tuple[FindingKind, ...] = (
    FindingKind(
        "port_down",
        "infiniband",
        "critical",
        "An RDMA port is not up (not ACTIVE, or its physical link not LinkUp) and was not "
        "switched off by an administrator (physical state Disabled: port_disabled).",
        "fabricscope_infiniband_port_up",
        "FabricscopeInfinibandPortDown",
    ),
    FindingKind(
        "port_disabled",
        "infiniband",
        "info",
        "An RDMA port's physical state is Disabled: switched off by an administrator (or "
        "left so by the firmware's configuration), not a fault. Nothing alerts on it.",
        "fabricscope_infiniband_port_physical_state",
    ),
    FindingKind(
        "counter_saturated",
        "infiniband",
        "info",
        "A PMA port counter with no 64-bit source sits at the maximum of its width: what it "
        "misses is lost (with --infiniband.reset-saturated: it filled its width within one "
        "pass).",
        "fabricscope_infiniband_port_pma_saturated",
        "FabricscopeInfinibandCounterSaturated",
        "The alert fires once per node (the number of such counters), after 15 minutes, at "
        "info: blind evidence is a monitoring gap to fix (a 64-bit copy or clearing), not a "
        "fault that costs a job. On a RoCE or iWARP port nothing can clear it (PMA clears go "
        "through an InfiniBand subnet): the finding points at the netdev's 64-bit ethtool "
        "statistics instead, and the alert leaves the port out.",
    ),
    FindingKind(
        "ib_peer_errors",
        "ibpeer",
        "warning",
        "The port at the other end of a node's InfiniBand cable (a switch port) counts symbol, "
        "receive, link-recovery or link-down errors: this node's transmitter or the cable.",
        "fabricscope_infiniband_peer_port_symbol_errors_total",
        "FabricscopeInfinibandPeerErrorsRising",
        "The alert fires on symbol or receive errors rising within an hour; the finding on any "
        "count since the switch's counters were last reset.",
    ),
    FindingKind(
        "ib_link_width_degraded",
        "ibpeer",
        "warning",
        "An InfiniBand link trained narrower than the widest width both ends support "
        "(PortInfo LinkWidthActive against both ends' LinkWidthSupported).",
        "fabricscope_infiniband_link_width_degraded",
        "FabricscopeInfinibandLinkWidthDegraded",
    ),
    FindingKind(
        "ib_link_speed_degraded",
        "ibpeer",
        "warning",
        "An InfiniBand link trained at a lower lane speed than the fastest both ends support "
        "(PortInfo LinkSpeed(Ext)Active against both ends' LinkSpeed(Ext)Supported).",
        "fabricscope_infiniband_link_speed_degraded",
        "FabricscopeInfinibandLinkSpeedDegraded",
    ),
    FindingKind(
        "ib_peer_changed",
        "ibpeer",
        "warning",
        "The other end of a local InfiniBand port is another node GUID or port than before: "
        "the cable was moved or the neighbour replaced.",
        "fabricscope_infiniband_peer_info",
        "FabricscopeInfinibandPeerChanged",
        "The finding holds for an hour after the agent saw the change; the alert reads the "
        "info series over 30 minutes, so it also fires after an agent restart.",
    ),
    FindingKind(
        "port_rate_degraded",
        "infiniband",
        "warning",
        "An ACTIVE RDMA port runs below the rate it should (fewer lanes or a lower lane "
        "speed): below its own fastest rate since the agent started, the rate most ports of "
        "its HCA model and link layer on the node run at, or --infiniband.expected-rate.",
        "fabricscope_infiniband_port_rate_degraded",
        "FabricscopeInfinibandPortRateDegraded",
        "The alert fires after 5 minutes and names one comparison per port, the strongest "
        "that holds (expected, then peers, then history); the finding lists every one.",
    ),
    FindingKind(
        "nic_cross_numa",
        "pci",
        "warning",
        "Every nearest NIC of a GPU reports another NUMA node than the GPU.",
        "fabricscope_topology_gpu_nearest_nic_cross_numa",
        "FabricscopeGpuNearestNicCrossNuma",
    ),
    FindingKind(
        "pci_link_width_degraded",
        "pci",
        "warning",
        "A PCIe link on a GPU/NIC path trained narrower than both ends report they support "
        "(judged only on widths actually reported: never on virtual functions or links "
        "reading width 0 / speed Unknown).",
        "fabricscope_pci_link_width_degraded",
        "FabricscopePcieLinkWidthDegraded",
    ),
    FindingKind(
        "pci_link_speed_degraded",
        "pci",
        "warning",
        "A NIC's PCIe link runs below the speed both ends support (NICs hold their trained "
        "speed at idle; judged only where current and maximum speeds are reported, never "
        "on GPUs, whose speed drops at idle by design: see gpu_pcie_speed_degraded).",
        "fabricscope_pci_link_speed_degraded",
        "FabricscopePcieLinkSpeedDegraded",
    ),
    FindingKind(
        "acs_p2p_redirect",
        "pci",
        "warning",
        "A PCIe switch port or bridge on a GPU/NIC path (not a root port) redirects "
        "peer-to-peer requests or completions up to the root complex.",
        "fabricscope_pci_acs_p2p_redirect_enabled",
        "FabricscopeAcsP2pRedirectEnabled",
        "Root ports are not judged (their series still reads 1): peers behind different "
        "root ports reach each other through the root complex either way.",
    ),
    FindingKind(
        "nvlink_down",
        "nvml",
        "warning",
        "An NVLink is inactive on a node whose other NVLinks are up.",
        "fabricscope_nvlink_up",
        "FabricscopeNvlinkDown",
    ),
    FindingKind(
        "nvlink_errors",
        "nvml",
        "warning",
        "An NVLink's replay, recovery or CRC-flit error counter is above 0.",
        "fabricscope_nvlink_errors_total",
        "FabricscopeNvlinkErrorsRising",
        "The alert fires on an increase within an hour; the finding on any count since the "
        "driver loaded.",
    ),
    FindingKind(
        "gpu_lost",
        "nvml",
        "critical",
        "NVML answers GPU_IS_LOST for a GPU.",
        "fabricscope_gpu_lost",
        "FabricscopeGpuLost",
    ),
    FindingKind(
        "pcie_link_degraded",
        "nvml",
        "warning",
        "NVML reports a GPU's PCIe link narrower than its maximum.",
        "fabricscope_pci_link_width_degraded",
        "FabricscopePcieLinkWidthDegraded",
        "The alert is the sysfs judgement of the same link (pci_link_width_degraded), which "
        "also knows the upstream port's width.",
    ),
    FindingKind(
        "gpu_pcie_speed_degraded",
        "nvml",
        "warning",
        "A GPU running compute processes has its PCIe link below the highest generation it "
        "and its system support (an idle GPU lowers it by design and is not judged).",
        "fabricscope_gpu_pcie_link_generation_degraded",
        "FabricscopeGpuPcieGenerationDegradedUnderLoad",
        "The alert waits 15 minutes: a process that holds its GPU idle (data loading, "
        "checkpoints) may let the link drop for a while.",
    ),
    FindingKind(
        "row_remap_failure",
        "nvml",
        "critical",
        "A GPU memory row remap failed; the GPU needs service.",
        "fabricscope_gpu_row_remap_failure",
        "FabricscopeGpuRowRemapFailure",
    ),
    FindingKind(
        "xid",
        "nvml",
        "warning",
        "A GPU reported XID events since the agent started.",
        "fabricscope_gpu_xid_errors_total",
        "FabricscopeGpuXidErrors",
    ),
    FindingKind(
        "process_cpus_off_gpu_numa",
        "workload",
        "warning",
        "A GPU process may run only on CPUs away from its GPUs' NUMA nodes.",
        "fabricscope_workload_finding_processes",
    ),
    FindingKind(
        "nccl_ib_disabled",
        "workload",
        "warning",
        "A GPU process runs with NCCL's InfiniBand transport off on a node with RDMA NICs.",
        "fabricscope_workload_finding_processes",
    ),
    FindingKind(
        "nccl_ib_hca_no_match",
        "workload",
        "warning",
        "NCCL_IB_HCA of a GPU process selects none of the node's RDMA devices.",
        "fabricscope_workload_finding_processes",
    ),
    FindingKind(
        "nccl_ib_hca_wrong_numa",
        "workload",
        "warning",
        "NCCL_IB_HCA of a GPU process selects no RDMA device on one of its GPUs' NUMA nodes.",
        "fabricscope_workload_finding_processes",
    ),
    FindingKind(
        "nccl_nvlink_bypassed",
        "throughput",
        "warning",
        "A job's NCCL channels between two GPUs of the node that NVML shows joined by NVLink "
        "go through host memory (SHM) or the network (NET) instead of P2P over the NVLinks.",
        "fabricscope_nccl_nvlink_peer_channels",
        "FabricscopeNcclNvlinkBypassed",
    ),
    FindingKind(
        "gpudirect_rdma_unavailable",
        "workload",
        "warning",
        "The node has GPUs and RDMA NICs but no GPUDirect RDMA kernel path.",
        "fabricscope_gpudirect_rdma_available",
    ),
)

#: the registry: every finding kind, by name
KINDS: dict[str, FindingKind] = {k.kind: k for k in _KINDS}


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """``kind`` is one of :data:`KINDS`; ``subject`` names the thing concerned (a PCI
    address, ``mlx5_0/1``, ``mlx5_0/1/port_xmit_wait``, ``gpu0/link3``); ``detail`` is one
    sentence for a person."""

    kind: str
    subject: str
    detail: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"finding kind {self.kind!r} is not in agent.core.findings.KINDS")

    @property
    def severity(self) -> Severity:
        return KINDS[self.kind].severity
