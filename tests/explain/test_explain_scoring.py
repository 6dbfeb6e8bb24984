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
        def vector(self, expr: str, at: float) -> list[Sample]:
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


def test_checks_that_share_reads_ask_each_once_and_a_changed_template_as_it_is() -> None:
    """rail_share and xmit_wait_share are computed from the ports' data and wait rates,
    each asked once per period for both (three reads instead of the templates' seven);
    a check whose template is not the one its computation follows is asked as it is."""
    import dataclasses

    from exporter.explain.shared import DERIVED

    asked: list[str] = []

    class Recorder:
        def vector(self, expr: str, at: float) -> list[Sample]:
            asked.append(expr)
            return []

    periods = Periods(0.0, 970.0, 1000.0, 2000.0)
    scope = Scope(("node-01", "node-02"), "", ())
    shared = [CHECKS_BY_NAME[name] for name in ("rail_share", "xmit_wait_share")]
    assert all(DERIVED[c.name].template == c.template for c in shared)  # in use
    evaluate(Recorder(), scope, periods, checks=shared)  # type: ignore[arg-type]
    assert len(asked) == 6  # tx, rx, wait: once a period each
    assert {e.split("{")[0] for e in asked} == {
        f"rate(fabricscope_infiniband_port_{m}_total"
        for m in ("transmitted_bytes", "received_bytes", "transmit_wait")
    }
    asked.clear()
    changed = dataclasses.replace(shared[0], template=shared[0].template.replace("0.5", "0.25"))
    evaluate(Recorder(), scope, periods, checks=[changed])  # type: ignore[arg-type]
    assert len(asked) == 2 and all("quantile by (instance) (0.25," in e for e in asked)


def test_the_port_state_is_read_once_for_port_up_and_port_rate_degraded() -> None:
    """port_up averages the port's state; port_rate_degraded counted it and took its last
    value (three reads of every port a period): both now come from its average, asked once
    a period. With no degraded series port_rate_degraded is 0 for every port the state is
    read for (labels and order as its template's ``max by``); when a port has one, its
    template is asked as it is, for that period only."""
    degraded_slow: list[Sample] = []
    asked: list[tuple[str, float]] = []
    ports = [{"instance": "node-01", "device": "mlx5_0", "port": "1", "job": "agents"}]
    ports.append({**ports[0], "device": "mlx5_1"})

    class Recorder:
        def vector(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
            asked.append((expr, at))
            if expr.startswith("avg_over_time(fabricscope_infiniband_port_up{"):
                return [(p, 1.0) for p in ports]
            if " or 0 * max by" in expr:  # the template: a degraded port's share of samples
                return [({k: ports[1][k] for k in ("instance", "device", "port")}, 0.5)]
            if expr.startswith("max by (instance, device, port) (sum_over_time("):
                if at == 2000.0:
                    return [(s.labels, s.value) for s in degraded_slow]
                return []
            raise AssertionError(expr)

    periods = Periods(0.0, 970.0, 1000.0, 2000.0)
    scope = Scope(("node-01",), "", ())
    checks = [CHECKS_BY_NAME["port_up"], CHECKS_BY_NAME["port_rate_degraded"]]
    up, degraded = evaluate(Recorder(), scope, periods, checks=checks)  # type: ignore[arg-type]
    assert len(asked) == 4  # the state's average and the degraded series, once a period each
    assert [(m.baseline, m.slow) for m in up.measurements] == [(1.0, 1.0), (1.0, 1.0)]
    assert [dict(m.labels) for m in degraded.measurements] == [
        {"instance": "node-01", "device": d, "port": "1"} for d in ("mlx5_0", "mlx5_1")
    ]
    assert [(m.baseline, m.slow) for m in degraded.measurements] == [(0.0, 0.0), (0.0, 0.0)]
    asked.clear()
    degraded_slow.append(Sample({"instance": "node-01", "device": "mlx5_1", "port": "1"}, 3.0))
    _, degraded = evaluate(Recorder(), scope, periods, checks=checks)  # type: ignore[arg-type]
    templates = [(e, at) for e, at in asked if " or 0 * max by" in e]
    assert len(asked) == 5 and [at for _, at in templates] == [2000.0]  # the slow period's
    by_device = {m.labels["device"]: (m.baseline, m.slow) for m in degraded.measurements}
    assert by_device == {"mlx5_0": (0.0, None), "mlx5_1": (0.0, 0.5)}


# --- the noise model, coverage and blind evidence (pure parts) -----------------------------


def test_an_unchanged_series_never_stands_out_whatever_its_level() -> None:
    """The issue's port: a steady 600 symbol errors/min read 595 -> 604/min across the
    halves of a period where nothing changed and scored 3.23 against the check's 1/min.
    Held to its own baseline's spread and to counting noise it stays below 1; a new error
    rate of the same size on a clean link still scores as before."""
    from exporter.explain import noise

    check = CHECKS_BY_NAME["symbol_errors"]
    base, slow = 595 / 60, 604 / 60
    assert score(check, base, slow, 1.0) == pytest.approx(math.log2(1 + 9), rel=1e-6)
    # one-minute tiles of a 10/s Poisson process spread by about sqrt(600)/60 per second
    sigma = noise.combine(math.sqrt(600) / 60, noise.poisson_rate_sigma(base, 540, 540))
    assert score(check, base, slow, 1.0, sigma) < 1
    clean = noise.combine(0.0, noise.poisson_rate_sigma(0.0, 540, 540))
    assert score(check, 0.0, 9 / 60, 1.0, clean) == pytest.approx(math.log2(10))


@pytest.mark.parametrize(
    ("period", "interval", "expected"),
    [(1080.0, 60.0, 150.0), (7200.0, 15.0, 600.0), (80.0, 1.0, 7.0), (30.0, 30.0, 75.0)],
)
def test_tile_length(period: float, interval: float, expected: float) -> None:
    from exporter.explain.noise import tile_seconds

    assert tile_seconds(period, interval) == expected


def test_tiles_coverage_span_and_spread() -> None:
    from exporter.explain.noise import Tiles

    t = Tiles(60.0, ((60.0, None), (120.0, None), (180.0, 2.0), (240.0, 4.0)))
    assert t.coverage == 0.5 and t.span == (120.0, 240.0)
    assert t.spread == pytest.approx(math.sqrt(2))
    assert Tiles(60.0, ()).coverage == 0.0 and Tiles(60.0, ((60.0, None),)).span is None


def test_a_trickle_seen_zero_times_then_once_is_not_a_cause() -> None:
    """0 symbol errors in a 52 s baseline, 1 in the 67 s slow period: a 0.5/min trickle
    does that in about a quarter of windows. It scored 0.93 held to the count alone (0:
    no noise); held to the count's Poisson interval it stays far below 1, while a real
    new rate (10 in the slow period) still stands out."""
    from exporter.explain import noise

    check = CHECKS_BY_NAME["symbol_errors"]
    assert score(check, 0.0, 1 / 67, 67 / 52) == pytest.approx(0.93, abs=0.01)
    sigma = noise.poisson_rate_sigma(0.0, 52, 67)
    assert score(check, 0.0, 1 / 67, 67 / 52, sigma) < 0.5
    assert score(check, 0.0, 10 / 67, 67 / 52, sigma) >= 1.0
    # the chance claimed above, of such a trickle: P(0 in 52 s) * P(>= 1 in 67 s)
    lam = 0.5 / 60
    assert math.exp(-lam * 52) * (1 - math.exp(-lam * 67)) == pytest.approx(0.28, abs=0.01)


def test_poisson_sigmas() -> None:
    from exporter.explain import noise

    # 10 events/s over 100 s in each period: counts 1000 +- 31.6, rates +- 0.316 each (the
    # baseline count at its interval's upper end, 1000 + 31.6 + 1: 3 % more)
    upper = (1000 + math.sqrt(1000.75) + 1) / 100
    assert noise.poisson_rate_sigma(10.0, 100, 100) == pytest.approx(math.sqrt(upper / 50))
    assert noise.poisson_upper(0) == pytest.approx(1.866, abs=1e-3)
    # 4 events in the baseline, the slow period twice as long: expected 8 +- sqrt(8 + 16)
    assert noise.poisson_events_sigma(4.0, 2.0) == pytest.approx(math.sqrt(24))
    assert noise.bar(1.0, 0.1) == 1.0 and noise.bar(1.0, 1.0) == noise.Z


def test_covered_part_of_a_period_and_thin_periods() -> None:
    """A baseline whose series begins inside it is taken over the part it covers; one
    covered under MIN_COVERAGE is not scored and says so."""
    from exporter.explain.evidence import Measurement, Periods, Window
    from exporter.explain.judge import _covered
    from exporter.explain.noise import Tiles

    periods = Periods(0.0, 1200.0, 1260.0, 2460.0)
    check = CHECKS_BY_NAME["symbol_errors"]
    m = Measurement(
        check, {"instance": "n"}, 1.0, 2.0, 3.0, False, Window(1200, 1200), Window(1200, 2460)
    )
    full = Tiles(100.0, tuple((1260.0 + 100 * k, 1.0) for k in range(1, 13)))
    late = Tiles(100.0, tuple((100.0 * k, 1.0 if k > 4 else None) for k in range(1, 13)))
    out = _covered(m, late, full, periods)
    assert out.base_window == Window(800.0, 1200.0) and out.slow_window == m.slow_window
    thin = Tiles(100.0, tuple((100.0 * k, 1.0 if k > 10 else None) for k in range(1, 13)))
    out = _covered(m, thin, full, periods)
    assert out.score == 0 and not out.judged
    assert out.thin == "baseline covers 17% of its period (its series from 00:16:40 UTC)"
    assert out.text.endswith(
        "(baseline covers 17% of its period (its series from 00:16:40 UTC): not scored)"
    )


def test_printed_promql_carries_the_unit_and_whole_events() -> None:
    labels = {"instance": "node-01", "device": "mlx5_4", "port": "1"}
    sym = CHECKS_BY_NAME["symbol_errors"]
    assert sym.shown(sym.device_selector(labels), "1620s").startswith("60 * (rate(")
    down = CHECKS_BY_NAME["link_downed"]
    assert down.shown(down.device_selector(labels), "60s").startswith("round(increase(")
    assert down.display(3.01) == 3.0 and down.display(2.5) == 3.0
    rate = CHECKS_BY_NAME["port_rate"]
    assert rate.shown("x", "60s").startswith("8e-09 * (") and rate.display(50e9) == 400


def test_the_rail_share_of_one_port_divides_by_its_nodes_median() -> None:
    """The issue: the printed rail-share PromQL kept the port's own matchers inside the
    median and divided the port by itself (1.0 where the evidence said 0.38)."""
    check = CHECKS_BY_NAME["rail_share"]
    labels = {"instance": "node-01", "device": "mlx5_5", "port": "1"}
    expr = check.shown(check.device_selector(labels), "60s", check.peer_selector(labels))
    own, median = expr.split("quantile by (instance)")
    assert 'device="mlx5_5"' in own and 'device="mlx5_5"' not in median
    assert 'instance="node-01"' in median and median.rstrip(")").endswith("> 0")


def test_saturated_counters_make_their_checks_blind_and_the_rest_still_rank() -> None:
    from exporter.explain.blind import Blind, apply, pma_counters
    from exporter.explain.evidence import compare

    assert pma_counters(CHECKS_BY_NAME["xmit_wait_share"])[0] == "port_xmit_wait"
    assert pma_counters(CHECKS_BY_NAME["symbol_errors"]) == ("symbol_error",)
    assert pma_counters(CHECKS_BY_NAME["cnp_sent"]) == ()
    port = {"instance": "n1", "device": "mlx5_9", "port": "1"}
    other = {"instance": "n1", "device": "mlx5_0", "port": "1"}
    wait = compare(
        CHECKS_BY_NAME["xmit_wait_share"],
        [Sample(port, 0.0), Sample(other, 0.0)],
        [Sample(port, 0.5), Sample(other, 0.5)],
        1.0,
    )
    share = compare(CHECKS_BY_NAME["rail_share"], [Sample(port, 1.0)], [Sample(port, 0.4)], 1.0)
    blind = Blind("n1", "mlx5_9", "1", "port_xmit_wait", 1795500000.0, None)
    out = apply([wait, share], [blind])
    by_device = {m.labels["device"]: m for m in out[0].measurements}
    assert by_device["mlx5_9"].score == 0 and not by_device["mlx5_9"].judged
    assert by_device["mlx5_9"].text.endswith(
        "evidence unavailable (port_xmit_wait saturated since 06:00:00 UTC)"
    )
    assert by_device["mlx5_0"].score > 1 and out[0].counts().unavailable == 1
    assert out[1].measurements[0].score > 1  # the port's other evidence still ranks


def test_a_class_of_checks_left_out_for_lack_of_scope_could_not_judge() -> None:
    """The job runs in pods (its throughput series name them), but explain cannot say in
    which namespace, or finds no attribution for them: the verdict is "could not judge",
    naming what was left out, never "no fabric cause found"."""
    from exporter.explain.discover import Footprint, JobSpec, Throughput, scope_gaps
    from exporter.explain.discover import with_namespace as named_ns
    from exporter.explain.report import Checked, _verdict

    tp = Throughput("m", "tokens/s", "", None, ("llm-0", "llm-1"), ("n0", "n1"))
    spread = Throughput("m", "", "", None, ("llm-0",), ("n0",), namespaces=("a", "b"))
    one = Throughput("m", "", "", None, ("llm-0",), ("n0",), namespaces=("training",))
    assert named_ns(JobSpec("llm"), one).namespace == "training"
    assert named_ns(JobSpec("llm"), spread).namespace == ""
    assert named_ns(JobSpec("llm", "given"), one).namespace == "given"
    empty = Footprint(("n0", "n1"), ("llm-0", "llm-1"), (), ())
    placed = Footprint(("n0",), ("llm-0",), (("n0", "0"),), ())
    assert scope_gaps(JobSpec("llm", "training"), tp, placed) == ()
    gaps = scope_gaps(JobSpec("llm", "training"), tp, empty)
    assert gaps and "no pods found for job 'llm' in namespace 'training'" in gaps[0]
    assert "carry namespaces a, b; give --namespace" in scope_gaps(JobSpec("llm"), spread, empty)[0]
    # series naming pods but no namespace (a log file read on bare metal): not Kubernetes
    assert scope_gaps(JobSpec("llm"), tp, empty) == ()
    # bare metal (no pods in the throughput series): nothing is missing
    bare = Throughput("m", "", "", None, (), ("n0",))
    assert scope_gaps(JobSpec("llm"), bare, Footprint(("n0",), (), (), ())) == ()
    checked = tuple(Checked(f"c{i}", "ib_link", "", 2, 0.0, judged=2) for i in range(9))
    assert _verdict([], checked, 2, 2, "") == ("no fabric cause found", "")
    verdict, reason = _verdict([], checked, 2, 2, "", gaps=gaps)
    assert verdict == "could not judge" and reason == gaps[0]


@pytest.mark.parametrize(
    "name", ["symbol_errors", "link_downed", "pci_width", "cpu_gpu_numa", "nccl_socket_share"]
)
def test_counts_taken_while_comparing_equal_a_recount(name: str) -> None:
    """compare counts its devices (judged and their nodes, without baseline) and finds the
    worst score while it makes the measurements, so a 1,024-node answer needs no further
    pass over its 300,000 measurements after Prometheus's last answer: on rows of every kind
    (no baseline, no slow figure, NaN, zero, a pod borrowing the job's baseline; each mode)
    the tally is the recount of the same measurements, and a result made from them any
    other way (dataclasses.replace, blind evidence, judged again) counts them afresh."""
    import dataclasses

    from exporter.explain.evidence import CheckResult, compare

    check = CHECKS_BY_NAME[name]
    ident = "pod" if check.scope == "pod" else (check.identity or ("device",))[0]

    def row(node: int, dev: int) -> dict[str, str]:
        return {"instance": f"n{node}", ident: f"d{dev}"}

    base = [Sample(row(0, 0), 0.0), Sample(row(0, 1), 4.0), Sample(row(1, 2), math.nan)]
    base += [Sample(row(2, 4), 16.0), Sample(row(3, 6), 1.0)]
    slow = [Sample(row(0, 0), 0.0), Sample(row(0, 1), 9.0), Sample(row(1, 2), 2.0)]
    slow += [Sample(row(1, 3), 1.0), Sample(row(2, 5), math.nan), Sample(row(3, 6), 0.5)]
    result = compare(check, base, slow, 1.0)
    assert result.tally is not None
    recount = CheckResult(check, result.series, list(result.measurements))
    assert recount.tally is None
    assert result.counts() == recount.counts()
    assert result.worst() == recount.worst() == max(m.score for m in result.measurements)
    assert result.counts().judged + result.counts().no_baseline > 0
    assert dataclasses.replace(result, measurements=result.measurements[:1]).tally is None
    # a measurement marked blind after the comparison is counted by the new result
    blind = dataclasses.replace(result.measurements[0], score=0.0, unavailable="saturated")
    again = CheckResult(check, result.series, [blind, *result.measurements[1:]])
    assert again.counts().unavailable == 1


def test_a_ports_rate_and_width_are_read_once_for_the_three_capacity_checks() -> None:
    """port_rate reads a port's rate, port_width its width, and port_lane_speed divided one
    by the other in its own query: four reads of every port a period where two do. Each is
    asked once a period; the lane speed is divided as Prometheus divides (a one-to-one match
    on all labels, in the rate's order; a width of 0 gives +Inf, or NaN for a rate of 0)."""
    rates = {"mlx5_0": 50e9, "mlx5_1": 25e9, "mlx5_2": 0.0, "mlx5_3": 12.5e9}
    widths = {"mlx5_3": 1.0, "mlx5_0": 4.0, "mlx5_1": 0.0, "mlx5_2": 0.0}  # another order
    asked: list[str] = []

    def port(device: str) -> dict[str, str]:
        return {"instance": "node-01", "device": device, "port": "1"}

    class Recorder:
        def vector(self, expr: str, at: float) -> list[tuple[dict[str, str], float]]:
            asked.append(expr)
            got = rates if "rate_bytes_per_second" in expr else widths
            return [(port(d), v) for d, v in got.items()]

    periods = Periods(0.0, 970.0, 1000.0, 2000.0)
    scope = Scope(("node-01",), "", ())
    names = ("port_rate", "port_width", "port_lane_speed")
    checks = [CHECKS_BY_NAME[n] for n in names]
    results = evaluate(Recorder(), scope, periods, checks=checks)  # type: ignore[arg-type]
    assert len(asked) == 4  # rate and width, once a period each
    assert all(" / " not in e for e in asked)
    lane = {m.labels["device"]: m.slow for m in results[2].measurements}
    assert lane["mlx5_0"] == pytest.approx(12.5e9 * 8e-9)  # scaled to Gb/s as printed
    assert lane["mlx5_3"] == pytest.approx(12.5e9 * 8e-9)
    assert lane["mlx5_1"] is None and lane["mlx5_2"] is None  # +Inf, NaN: no figure
    assert [m.labels["device"] for m in results[0].measurements] == list(rates)
    asked.clear()
    evaluate(Recorder(), scope, periods, checks=checks, derive=False)  # type: ignore[arg-type]
    assert len(asked) == 6  # each check's own template, once a period


def test_a_device_unchanged_scores_as_score_says_in_every_check() -> None:
    """compare_pairs skips scoring a figure that is the same in both periods where the
    check's mode scores a difference: every check, equal and unequal figures, the same
    scores as :func:`score` gives them."""
    from exporter.explain.checks import CHECKS
    from exporter.explain.evidence import compare_pairs

    values = (0.0, 1.0, 1.5, -2.0, 16.0, 5e10, 1e-9)
    for check in CHECKS:
        base = [({"instance": f"n{i}-{j}"}, b) for i, b in enumerate(values) for j in range(2)]
        slow = [
            ({"instance": f"n{i}-{j}"}, b if j == 0 else b * 0.5 + 1)
            for i, b in enumerate(values)
            for j in range(2)
        ]
        got = compare_pairs(check, base, slow, 0.8)
        for m in got.measurements:
            i, j = (int(x) for x in m.labels["instance"][1:].split("-"))
            b = values[i]
            s = b if j == 0 else b * 0.5 + 1
            want = score(check, b, s, 0.8)
            if check.mode == "events":  # whole events, as printed
                want = score(check, math.floor(b + 0.5), math.floor(s + 0.5), 0.8)
            assert m.score == want and m.naive_score == want, (check.name, b, s)
