"""``fabricscope explain`` on the shared scenario lab (tests/lab: every step rendered by the
real agent from the DGX fixture tree, backfilled with promtool, served by a real
Prometheus): for every fault scenario the planted cause ranks first and nothing unrelated
stands out; healthy gives "no fabric cause found"; wrong NUMA gives misplacement.

The lab has no throughput series until the throughput work lands in it, so the change is
given (``change_at`` = the scenario's fault start); tests/test_explain.py covers finding
the drop in the throughput itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.explain.checks import THRESHOLD
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec
from exporter.explain.report import Report, explain
from tests.lab.backfill import build_tsdb, read_timeline, start_prometheus
from tests.lab.scenarios import JOB_NAME, NAMESPACE, SCENARIOS, pod_name

HOURS = 0.3  # 18 minutes; the cause starts at 7.2 minutes
STEP = 60.0

#: the lab's cause kinds as explain's causes, and where each finding must point
EXPECTED = {
    "ib_link_bad": ("ib_link", "node-01", "mlx5_4/1"),
    "roce_incast": ("roce_congestion", "node-02", "mlx5_9/1"),
    "nvlink_errors": ("nvlink", "node-03", "GPU 5"),
    "pcie_x8_nic": ("pcie", "node-02", "0000:3c:00.0"),
    "wrong_numa": ("misplacement", "node-03", pod_name(3)),
}


def run_scenario(name: str, tmp: Path) -> Report:
    scenario = SCENARIOS[name]
    tsdb = build_tsdb(scenario, HOURS, STEP, tmp / name)
    start, end, _, fault = read_timeline(tmp / name)
    with start_prometheus(tsdb) as url:
        client = PrometheusClient(ClientSettings(url))
        return explain(client, JobSpec(JOB_NAME, NAMESPACE), start, end, change_at=fault)


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Report]]:
    tmp = tmp_path_factory.mktemp("explain-on-lab")
    yield {name: run_scenario(name, tmp) for name in SCENARIOS}


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
    assert report.causes == []
    checked = {c.check: c.devices for c in report.checked}
    assert checked["symbol_errors"] >= 32 and checked["nvlink_errors"] == 32
