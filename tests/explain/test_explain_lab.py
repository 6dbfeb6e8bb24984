"""``fabricscope explain`` on the shared scenario lab (tests/lab: every step rendered by the
real agent from the DGX fixture tree, backfilled with promtool, served by a real
Prometheus): for every fault scenario the planted cause ranks first and nothing unrelated
stands out; healthy gives "no fabric cause found"; wrong NUMA gives misplacement.

Nothing is given but the job and the window, as an SRE would run it: explain finds the drop
in the job's throughput (the agent's series from the pods' CRI logs, namespace ``training``,
job_name ``llm`` from the pods' owner) and compares before and after it. The scenarios are
the ones tests/deploy/test_dashboards.py queries, built once per session (``lab_cache``).
"""

from __future__ import annotations

import pytest

from exporter.explain.checks import THRESHOLD
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec
from exporter.explain.plan import RunLedger
from exporter.explain.report import Report, explain
from tests.lab.backfill import TEST_HOURS, TEST_STEP, ScenarioCache
from tests.lab.scenarios import (
    BAD_TOKENS_PER_SECOND,
    GOOD_TOKENS_PER_SECOND,
    JOB_NAME,
    NAMESPACE,
    SCENARIOS,
    pod_name,
)

#: the lab's cause kinds as explain's causes, and where each finding must point
EXPECTED = {
    "ib_link_bad": ("ib_link", "node-01", "mlx5_4/1"),
    "roce_incast": ("roce_congestion", "node-02", "mlx5_9/1"),
    "nvlink_errors": ("nvlink", "node-03", "GPU 5"),
    "pcie_x8_nic": ("pcie", "node-02", "0000:3c:00.0"),
    "ib_rate_drop": ("port_rate", "node-01", "mlx5_5/1"),
    "pcie_speed_nic": ("pcie", "node-03", "0000:cc:00.0"),
    "wrong_numa": ("misplacement", "node-03", pod_name(3)),
    # every pod's next run fell back to sockets: the pods rank by name, all equal
    "nccl_socket_fallback": ("nccl_transport", "node-00", pod_name(0)),
    # every pod's next run went through the other socket's HCAs: all equal, ranked by name
    "nccl_hca_off_numa": ("nccl_transport", "node-00", pod_name(0)),
}


@pytest.fixture(scope="module")
def reports(lab_cache: ScenarioCache) -> dict[str, Report]:
    out = {}
    lab_cache.prefetch(sorted(SCENARIOS), TEST_HOURS, TEST_STEP)
    for name in sorted(SCENARIOS):
        s = lab_cache.get(name, TEST_HOURS, TEST_STEP)
        client = PrometheusClient(ClientSettings(s.url))
        out[name] = explain(client, JobSpec(JOB_NAME, NAMESPACE), s.start, s.end)
    return out


@pytest.fixture(scope="module")
def fault_starts(lab_cache: ScenarioCache) -> dict[str, float]:
    return {n: lab_cache.get(n, TEST_HOURS, TEST_STEP).fault_start for n in SCENARIOS}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_drop_is_found_at_the_fault(
    reports: dict[str, Report], fault_starts: dict[str, float], name: str
) -> None:
    report = reports[name]
    assert not report.change_given
    assert report.throughput.metric == "fabricscope_throughput_tokens_per_second"
    assert report.throughput.pods == tuple(pod_name(i) for i in range(4))
    assert report.shift is not None, f"{name}: no drop found in {report.throughput.series}"
    assert abs(report.shift.at - fault_starts[name]) <= TEST_STEP
    ratio = SCENARIOS[name].throughput_ratio
    assert report.shift.drop_ratio == pytest.approx(1 - ratio, abs=0.01)
    if name == "ib_link_bad":  # the founding story's figures
        assert report.shift.before == pytest.approx(GOOD_TOKENS_PER_SECOND, rel=0.005)
        assert report.shift.after == pytest.approx(BAD_TOKENS_PER_SECOND, rel=0.005)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_planted_cause_ranks_first(reports: dict[str, Report], name: str) -> None:
    report = reports[name]
    cause, node, device = EXPECTED[name]
    assert report.causes, f"{name}: nothing stood out; checked {report.checked}"
    first = report.causes[0]
    assert (first.cause, first.instance) == (cause, node), report.causes[:3]
    assert device in first.device, first
    assert first.score >= THRESHOLD
    for f in report.causes[1:]:  # the rest above the threshold: the same incident
        assert f.cause == cause or node in (f.instance, *f.device.split()), f
    assert len(report.footprint.instances) == 4
    assert len(report.footprint.gpus) == 32  # 4 nodes x 8 GPUs, from pod attribution


def test_healthy_is_no_fabric_cause(reports: dict[str, Report]) -> None:
    report = reports["healthy"]
    assert report.throughput.series is not None
    assert report.shift is None  # the job never slowed: the window's halves are compared
    assert report.causes == []
    checked = {c.check: c.devices for c in report.checked}
    assert checked["symbol_errors"] >= 32 and checked["nvlink_errors"] == 32


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_query_plan_gives_the_same_answer(
    lab_cache: ScenarioCache, reports: dict[str, Report], name: str
) -> None:
    """One instance (and one pod) per query, as a 1,024-node job's plan cuts it into groups
    of 64: every check is per device, so the groups' answers together are the same answer,
    score for score; asked with gzip, every request counted by the run's ledger."""
    s = lab_cache.get(name, TEST_HOURS, TEST_STEP)
    ledger = RunLedger(60.0)
    client = PrometheusClient(ClientSettings(s.url), hook=ledger)
    split = explain(client, JobSpec(JOB_NAME, NAMESPACE), s.start, s.end, max_names=1)

    def answer(r: Report) -> list[tuple[str, str, str, float]]:
        return [(f.cause, f.instance, f.device, round(f.score, 9)) for f in r.findings]

    assert answer(split) == answer(reports[name])
    assert [(c.check, c.devices, round(c.worst, 9)) for c in split.checked] == [
        (c.check, c.devices, round(c.worst, 9)) for c in reports[name].checked
    ]
    assert ledger.requests > 4 * len(split.checked)  # four instances: four queries a check
    assert 0 < ledger.wire_bytes < ledger.body_bytes  # Prometheus answered gzip


def test_nccl_socket_fallback_names_the_transport_change_and_hardware_stays_quiet(
    reports: dict[str, Report],
) -> None:
    """The seed's "some runs are slow" case: the previous run's NCCL connected the nodes over
    NET/IB with GPUDirect RDMA on each GPU's rail, this run's over NET/Socket (the pods'
    own NCCL_DEBUG=INFO lines); no hardware fault. Explain puts the transport change first
    on every pod, with the numbers of the lines, and no hardware cause stands out."""
    report = reports["nccl_socket_fallback"]
    ev = _every_pod_names_the_transport(report, drop=0.34)
    # 8 ranks x 4 channels x (send + receive) per pod, all over sockets now
    assert "share of NCCL's network channel connections over NET/Socket: 0 -> 100%" in ev
    assert "NCCL channel connections over NET/Socket: 0 -> 64" in ev
    assert (
        "share of NCCL's network channel connections over NET/IB with GPUDirect RDMA: "
        "100 -> 0%" in ev
    )
    assert "HCAs NCCL's channels use: 8 -> 0" in ev
    _hardware_stays_quiet(report)


def test_scenarios_without_a_transport_change_keep_the_nccl_checks_quiet(
    reports: dict[str, Report],
) -> None:
    """Every scenario's pods print the same NCCL init lines (IB with GPUDirect RDMA on each
    rail): the NCCL checks have data everywhere and stand out only where the run changed."""
    for name, report in reports.items():
        checked = {c.check: c for c in report.checked}
        assert checked["nccl_socket_share"].devices == 4, name
        if name not in ("nccl_socket_fallback", "nccl_hca_off_numa"):
            worst = max(checked[c].worst for c in checked if c.startswith("nccl_"))
            assert worst < THRESHOLD, (name, worst)
        # every run's channels are judged (the lab's GPUs and rails all have NUMA nodes)
        assert checked["nccl_hca_off_numa_share"].devices == 4, name


def test_nccl_hca_off_numa_names_the_numa_shift_and_hardware_stays_quiet(
    reports: dict[str, Report],
) -> None:
    """The run after the restart sends each GPU's traffic through the rail of the GPU four
    places on: NET/IB with GPUDirect RDMA as before, the same count of HCAs, only their
    NUMA nodes differ. Explain names the NUMA share first on every pod, with its numbers,
    the other transport checks stay below 1 and so does the hardware."""
    report = reports["nccl_hca_off_numa"]
    ev = _every_pod_names_the_transport(report, drop=0.20)
    share = (
        "share of NCCL's NET/IB channel connections through an HCA on another NUMA node than "
        "their GPU: 0 -> 100%"
    )
    assert share in ev, ev
    checked = {c.check: c for c in report.checked}
    for name in ("nccl_socket_share", "nccl_gdr_share", "nccl_hcas"):
        assert checked[name].worst < THRESHOLD, checked[name]
    _hardware_stays_quiet(report)


def _every_pod_names_the_transport(report: Report, *, drop: float) -> tuple[str, ...]:
    """The drop is the scenario's, only ``nccl_transport`` stands out, on each of the four
    pods; the first finding's evidence lines."""
    assert report.shift is not None
    assert report.shift.drop_ratio == pytest.approx(drop, abs=0.01)
    causes = report.causes
    assert {f.cause for f in causes} == {"nccl_transport"}, [(f.cause, f.device) for f in causes]
    assert sorted(f.device for f in causes) == [f"{pod_name(i)} on node-{i:02d}" for i in range(4)]
    return tuple(causes[0].evidence)


def _hardware_stays_quiet(report: Report) -> None:
    checked = {c.check: c for c in report.checked}
    for name in ("symbol_errors", "xmit_wait_share", "nvlink_errors", "pci_width", "probe_busbw"):
        assert checked[name].devices > 0 and checked[name].worst < THRESHOLD, checked[name]
