"""The job's checks: its own placement and settings, what NCCL chose and suffered (its lines
in the pods' logs), and NCCL's RAS view of its ranks."""

from __future__ import annotations

from exporter.explain.checks.check import Check, Mode
from exporter.explain.checks.promql import (
    ANY_HCA,
    BY_POD,
    NVLINK_ALL,
    NVLINK_BYPASS,
    RAS_RANK,
    nccl_latest,
    nccl_share,
    or_zero,
)


def nccl_share_check(name: str, what: str, template: str, mode: Mode, significant: float) -> Check:
    """A per-pod share of NCCL's channel connections (cause ``nccl_transport``), in percent."""
    return Check(
        name,
        "nccl_transport",
        what,
        template,
        mode,
        significant,
        "pod",
        ("pod",),
        scope="pod",
        unit="%",
        scale=100.0,
        axis="% of network channel connections",
    )


JOB_CHECKS: tuple[Check, ...] = (
    # --- the job's own placement and settings -----------------------------------------
    Check(
        "cpu_gpu_numa",
        "misplacement",
        "share of a process's CPUs off its GPU's NUMA node",
        "max_over_time(fabricscope_workload_cpu_gpu_numa_mismatch_ratio{{{sel}}}[{d}])",
        "level",
        0.25,
        "pod",
        ("pod", "gpu"),
        scope="pod",
        axis="share of CPUs",
    ),
    Check(
        "cpu_nic_numa",
        "misplacement",
        "share of a process's CPUs off its NICs' NUMA node",
        "max_over_time(fabricscope_workload_cpu_nic_numa_mismatch_ratio{{{sel}}}[{d}])",
        "level",
        0.25,
        "pod",
        ("pod", "gpu"),
        scope="pod",
        axis="share of CPUs",
    ),
    Check(
        "nccl_findings",
        "nccl_config",
        "processes with an NCCL finding (IB disabled, NCCL_IB_HCA matching no HCA or one on "
        "another NUMA node)",
        "sum by (instance, namespace, pod, gpu) (max_over_time("
        "fabricscope_workload_finding_processes{{{sel},"
        'kind=~"nccl_ib_disabled|nccl_ib_hca_no_match|nccl_ib_hca_wrong_numa"}}[{d}]))',
        "level",
        0.5,
        "pod",
        ("pod", "gpu"),
        scope="pod",
        axis="processes",
    ),
    # --- what NCCL itself chose and suffered (its own lines in the pods' logs) --------
    nccl_share_check(
        "nccl_socket_share",
        "share of NCCL's network channel connections over NET/Socket",
        nccl_share('transport="NET/Socket"'),
        "rise",
        0.1,
    ),
    Check(
        "nccl_socket_channels",
        "nccl_transport",
        "NCCL channel connections over NET/Socket",
        or_zero(nccl_latest("channels", 'transport="NET/Socket"')),
        "rise",
        8.0,
        "pod",
        ("pod",),
        scope="pod",
        axis="connections",
    ),
    nccl_share_check(
        "nccl_ib_without_gdr_share",
        "share of NCCL's network channel connections over NET/IB without GPUDirect RDMA",
        nccl_share('transport="NET/IB",gdr="0"'),
        "rise",
        0.1,
    ),
    nccl_share_check(
        "nccl_gdr_share",
        "share of NCCL's network channel connections over NET/IB with GPUDirect RDMA",
        nccl_share('transport="NET/IB",gdr="1"'),
        "drop",
        0.2,
    ),
    Check(
        "nccl_hcas",
        "nccl_transport",
        "HCAs NCCL's channels use",
        or_zero(nccl_latest("hca_channels", ANY_HCA, "count")),
        "drop",
        0.25,
        "pod",
        ("pod",),
        scope="pod",
        axis="HCAs",
    ),
    nccl_share_check(
        "nccl_hca_off_numa_share",
        "share of NCCL's NET/IB channel connections through an HCA on another NUMA node than "
        "their GPU",
        nccl_latest("hca_channels_off_gpu_numa", ANY_HCA)
        + " / "
        + nccl_latest("hca_channels", ANY_HCA),
        "rise",
        0.1,
    ),
    Check(
        "nccl_nvlink_bypass_share",
        "nccl_nvlink",
        "share of NCCL's channel connections between NVLinked GPUs of a node not over P2P "
        "(through SHM or NET instead of the NVLinks)",
        f"({NVLINK_BYPASS} or 0 * {NVLINK_ALL}) / {NVLINK_ALL}",
        "level",
        0.25,
        "pod",
        ("pod",),
        scope="pod",
        unit="%",
        scale=100.0,
    ),
    Check(
        "nccl_network_warnings",
        "nccl_network",
        "NCCL network warnings (IB completion errors, async events, verbs calls, sockets, "
        "timeouts)",
        f"sum by ({BY_POD}) (increase(fabricscope_nccl_warnings_total{{{{{{sel}},"
        'kind=~"ib_completion|ib_async_event|ibv_call|socket|timeout"}}[{d}]))',
        "events",
        3.0,
        "pod",
        ("pod",),
        scope="pod",
        unit=" warnings",
    ),
    # --- NCCL's own view of its ranks (its RAS service) -------------------------------
    Check(
        "nccl_rank_stuck",
        "nccl_rank",
        "NCCL's RAS named this GPU's rank unresponsive, dead or lagging (0/1)",
        RAS_RANK,
        "level",
        0.5,
        "gpu",
        ("gpu",),
        axis="0/1",
        whole_job=True,
    ),
)
