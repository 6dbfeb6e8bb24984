"""Pure parts of explain: scores per mode, exact-name matchers, NCCL settings across pods."""

from __future__ import annotations

import argparse
import math
import re

import pytest

from exporter.explain.checks import CHECKS_BY_NAME
from exporter.explain.client import Sample
from exporter.explain.evidence import Periods, Scope, evaluate, nccl_env_differences, score


@pytest.mark.parametrize(
    ("check", "base", "slow", "ratio", "expected"),
    [
        ("symbol_errors", 0.0, 1 / 60, 1.0, 1.0),  # rate: exactly the significance level
        ("symbol_errors", 5.0, 5.0, 1.0, 0.0),  # a standing error rate is not today's cause
        ("symbol_errors", 5.0, 1.0, 1.0, 0.0),  # better is not worse
        ("link_downed", 2.0, 2.0, 0.5, 1.0),  # events: baseline scaled to the slow period
        ("pci_width", 16.0, 8.0, 1.0, math.log2(5)),  # drop: half the lanes
        ("pci_width", None, 8.0, 1.0, 0.0),  # nothing to drop from
        ("gpu_lost", 0.0, 1.0, 1.0, math.log2(3)),  # rise
        ("cpu_gpu_numa", 1.0, 1.0, 1.0, math.log2(5)),  # level: a standing misplacement
        ("symbol_errors", 0.0, math.nan, 1.0, 0.0),  # no data in the slow period
        # NCCL: every network channel moved to sockets; the run's pods are new (no baseline)
        ("nccl_socket_share", 0.0, 1.0, 1.0, math.log2(11)),
        # a new pod alone has no baseline (compare() gives it the job's: see below)
        ("nccl_socket_share", None, 1.0, 1.0, 0.0),
        ("nccl_socket_share", 1.0, 1.0, 1.0, 0.0),  # a job that always ran on sockets
        ("nccl_gdr_share", 1.0, 0.0, 1.0, math.log2(6)),  # GPUDirect RDMA lost
        ("nccl_hcas", 8.0, 1.0, 1.0, math.log2(1 + 0.875 / 0.25)),  # 8 rails -> 1 HCA
        ("nccl_network_warnings", 0.0, 5.0, 1.0, math.log2(1 + 5 / 3)),  # 5 an hour
        # no baseline: no change can be scored, in any mode but level (the x8 link:
        # "none -> 1" scored 1.58 when the window began before the agents' data)
        ("pci_width_degraded", None, 1.0, 1.0, 0.0),
        ("symbol_errors", None, 300.0, 1.0, 0.0),
        ("link_downed", None, 2.0, 1.0, 0.0),
        ("gpu_pcie_generation_busy", None, 1.0, 1.0, 0.0),
        ("cpu_gpu_numa", None, 1.0, 1.0, math.log2(5)),  # level needs none
        # the new capacity checks
        ("port_rate", 50e9, 12.5e9, 1.0, math.log2(7)),  # 4X -> 1X: three quarters lost
        ("port_width", 4.0, 1.0, 1.0, math.log2(7)),
        ("port_lane_speed", 12.5e9, 6.25e9, 1.0, math.log2(5)),  # NDR -> HDR
        ("nic_pci_speed", 32e9, 8e9, 1.0, math.log2(7)),  # the 32 -> 8 GT/s
        ("rail_share", 1.0, 0.38, 1.0, math.log2(1 + 0.62 / 0.25)),
        ("port_rate_degraded", 0.0, 1.0, 1.0, math.log2(5)),
    ],
)
def test_score(check: str, base: float | None, slow: float, ratio: float, expected: float) -> None:
    assert score(CHECKS_BY_NAME[check], base, slow, ratio) == pytest.approx(expected)


def test_no_baseline_is_reported_not_scored() -> None:
    from exporter.explain.evidence import compare

    check = CHECKS_BY_NAME["pci_width_degraded"]
    labels = {"instance": "node-b", "pci_bus_id": "0000:3b:00.0"}
    result = compare(check, [], [Sample(labels, 1.0)], 1.0)
    (m,) = result.measurements
    assert m.score == 0.0 and m.no_baseline and result.no_baseline == 1
    assert m.text.endswith("none -> 1 (no baseline: not scored)")
    with_base = compare(check, [Sample(labels, 0.0)], [Sample(labels, 1.0)], 1.0)
    assert with_base.measurements[0].score > 1 and with_base.no_baseline == 0


def test_a_new_pod_is_held_to_the_jobs_baseline_a_new_device_to_none() -> None:
    from exporter.explain.evidence import compare

    share = CHECKS_BY_NAME["nccl_socket_share"]
    old = [Sample({"instance": "n0", "pod": f"llm-{i}"}, 0.0) for i in range(2)]
    new = [Sample({"instance": "n0", "pod": f"llm-x{i}"}, 1.0) for i in range(2)]
    result = compare(share, old, new, 1.0)
    scored = [m for m in result.measurements if m.slow is not None]
    assert len(scored) == 2 and all(m.job_baseline for m in scored)
    assert all(m.score == pytest.approx(math.log2(11)) for m in scored)
    assert scored[0].text.endswith("0 -> 100% (baseline: the job's pods before)")
    assert compare(share, [], new, 1.0).no_baseline == 2  # no pod of the job before: none
    width = CHECKS_BY_NAME["pci_width_degraded"]  # devices never borrow a baseline
    a = Sample({"instance": "n0", "pci_bus_id": "0000:3b:00.0"}, 0.0)
    b = Sample({"instance": "n1", "pci_bus_id": "0000:3b:00.0"}, 1.0)
    assert compare(width, [a], [b], 1.0).no_baseline == 1


def test_selectors_are_exact_alternations() -> None:
    scope = Scope(("node-01", "gpu.node+1", 'we"ird'), "ns", ("llm-0",))
    sel = scope.selector(CHECKS_BY_NAME["symbol_errors"])
    assert sel == 'instance=~"gpu\\\\.node\\\\+1|node-01|we\\"ird"'
    # what Prometheus's RE2 receives after PromQL string unescaping matches only the names
    pattern = sel.split('"', 1)[1].rsplit('"', 1)[0].replace('\\"', '"').replace("\\\\", "\\")
    assert re.fullmatch(pattern, "gpu.node+1") and not re.fullmatch(pattern, "gpuXnode+1")
    assert scope.selector(CHECKS_BY_NAME["cpu_gpu_numa"]) == 'namespace="ns",pod=~"llm-0"'


def _env(pod: str, var: str, value: str) -> Sample:
    return Sample({"pod": pod, "variable": var, "value": value}, 1.0)


def test_nccl_env_differences() -> None:
    samples = [
        _env("a", "NCCL_IB_HCA", "=mlx5_0,mlx5_1"),
        _env("b", "NCCL_IB_HCA", "=mlx5_0,mlx5_1"),
        _env("c", "NCCL_IB_HCA", "=mlx5_0"),
        _env("a", "NCCL_SOCKET_IFNAME", "eth0"),
        _env("b", "NCCL_SOCKET_IFNAME", "eth0"),
        _env("c", "NCCL_SOCKET_IFNAME", "eth0"),
        _env("a", "NCCL_IB_DISABLE", "1"),  # set on one pod only
    ]
    diffs = {d.variable: dict(d.values) for d in nccl_env_differences(samples)}
    assert diffs == {
        "NCCL_IB_DISABLE": {"1": ("a",), "<unset>": ("b", "c")},
        "NCCL_IB_HCA": {"=mlx5_0": ("c",), "=mlx5_0,mlx5_1": ("a", "b")},
    }


def test_time_arguments() -> None:
    from exporter.cli.argtypes import duration as parse_duration
    from exporter.explain.times import parse_time

    now = 1_800_000_000.0
    assert parse_time("now", now) == now
    assert parse_time("2h", now) == parse_time("-2h", now) == now - 7200
    assert parse_time("1795500000", now) == 1795500000.0
    assert parse_time("2026-11-24T14:20:00Z", now) == parse_time("2026-11-24T14:20:00", now)
    assert parse_time("2026-11-24T15:20:00+01:00", now) == parse_time("2026-11-24T14:20:00Z")
    assert parse_duration("90m") == 5400
    with pytest.raises(argparse.ArgumentTypeError, match="not a time"):
        parse_time("yesterday", now)


def test_events_are_counted_back_over_the_guard_step() -> None:
    """The event that caused a change (a link going down) happens at the change point; an
    ``increase()`` over the slow period alone misses it when the range's first sample is
    already past it (found live: tests/test_lab_live.py). Event checks reach back over the
    guard step between the baseline and the slow period; rates and levels do not, and the
    baseline is scaled by the longer period."""
    asked: list[tuple[str, float]] = []

    class Recorder:
        def query(self, expr: str, at: float) -> list[Sample]:
            asked.append((expr, at))
            return []

    periods = Periods(0.0, 970.0, 1000.0, 2000.0)  # 30 s guard step
    assert (periods.events_seconds, periods.slow_seconds) == (1030, 1000)
    scope = Scope(("node-01",), "", ())
    checks = [CHECKS_BY_NAME["link_downed"], CHECKS_BY_NAME["symbol_errors"]]
    evaluate(Recorder(), scope, periods, checks=checks)  # type: ignore[arg-type]
    slow = {expr.split("(")[1].split("{")[0]: expr for expr, at in asked if at == 2000.0}
    assert slow["fabricscope_infiniband_port_link_downed_total"].endswith("[1030s])")
    assert slow["fabricscope_infiniband_port_symbol_errors_total"].endswith("[1000s])")
