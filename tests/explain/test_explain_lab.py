"""``fabricscope explain`` on the shared scenario lab (tests/lab: every step rendered by the
real agent from the DGX fixture tree, backfilled with promtool, served by a real
Prometheus): for every fault scenario the planted cause ranks first and nothing unrelated
stands out; healthy gives "no fabric cause found"; wrong NUMA gives misplacement. Nothing
stands out in the halves of any scenario's fault-free stretch (the noise model); every
evidence line's printed PromQL returns its figures and ``--plot`` draws them in their unit;
a saturated counter's evidence is named unavailable.

Nothing is given but the job and the window, as an SRE would run it: explain finds the drop
in the job's throughput (the agent's series from the pods' CRI logs, namespace ``training``,
job_name ``llm`` from the pods' owner) and compares before and after it. The scenarios are
the ones tests/deploy/test_dashboards.py queries, built once per session (``lab_cache``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from exporter.explain import plot, render
from exporter.explain.checks import CHECKS_BY_NAME, THRESHOLD
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec
from exporter.explain.evidence import Scope, evaluate, key
from exporter.explain.plan import RunLedger
from exporter.explain.report import Report, explain
from exporter.explain.shared import DERIVED
from tests.explain.reproduce import assert_every_figure_reproduces
from tests.lab.backfill import TEST_HOURS, TEST_STEP, ScenarioCache, ServedScenario
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


def test_on_a_dra_cluster_explain_finds_the_same_fault_through_claims(
    lab_cache: ScenarioCache, reports: dict[str, Report]
) -> None:
    """ib_link_bad where the job's GPUs and rails come only from ResourceClaims (the real
    agent resolving them through the kubelet's dynamic_resources, the drivers' CDI specs and
    the NVIDIA driver's minors: tests/lab/dra.py): the same footprint, the same cause first."""
    s = lab_cache.get("ib_link_bad_dra", TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    report = explain(client, JobSpec(JOB_NAME, NAMESPACE), s.start, s.end)
    plugin = reports["ib_link_bad"]
    assert report.footprint.gpus == plugin.footprint.gpus and len(report.footprint.gpus) == 32
    assert report.footprint.hcas == plugin.footprint.hcas and len(report.footprint.hcas) == 32
    cause, node, device = EXPECTED["ib_link_bad"]
    first = report.causes[0]
    assert (first.cause, first.instance) == (cause, node) and device in first.device
    rows = client.series(["fabricscope_pod_gpu_info", "fabricscope_pod_rdma_info"], s.start, s.end)
    assert {(r["__name__"], r["claim"]) for r in rows} == {
        (name, f"{pod_name(i)}-{what}")
        for i in range(4)
        for name, what in (
            ("fabricscope_pod_gpu_info", "gpus"),
            ("fabricscope_pod_rdma_info", "rails"),
        )
    }


def test_healthy_is_no_fabric_cause(reports: dict[str, Report]) -> None:
    report = reports["healthy"]
    assert report.throughput.series is not None
    assert report.shift is None  # the job never slowed: the window's halves are compared
    assert report.causes == []
    checked = {c.check: c.devices for c in report.checked}
    assert checked["symbol_errors"] >= 32 and checked["nvlink_errors"] == 32


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_checks_computed_from_shared_reads_equal_their_templates(
    lab_cache: ScenarioCache, reports: dict[str, Report], name: str
) -> None:
    """rail_share and xmit_wait_share are computed from the ports' data and wait rates, the
    capacity checks from their rate and width, the port-state checks from its average, each
    asked once (exporter.explain.shared): on every scenario each device's
    figures and score equal those of their templates asked of Prometheus."""
    s = lab_cache.get(name, TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    r = reports[name]
    scope = Scope(r.footprint.instances, NAMESPACE, r.footprint.pods)
    checks = [CHECKS_BY_NAME[n] for n in DERIVED]
    assert all(DERIVED[c.name].template == c.template for c in checks)  # in use

    def figures(derive: bool) -> list[dict[tuple[str, ...], tuple[object, ...]]]:
        results = evaluate(client, scope, r.periods, checks=checks, derive=derive)
        return [
            {key(m.check, m.labels): (m.baseline, m.slow, m.score) for m in res.measurements}
            for res in results
        ]

    computed, asked = figures(True), figures(False)
    assert computed == asked
    assert all(len(f) >= 32 for f in asked)  # every port of the four nodes
    assert any(v[1] for f in asked for v in f.values())  # not all zero


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


# --- no crying wolf: the noise model, coverage, blind evidence ------------------------------


def _halves(s: ServedScenario, stretch: tuple[float, float], at: float) -> Report:
    """explain over ``stretch`` of a scenario, split at ``at`` of it."""
    start, end = stretch
    client = PrometheusClient(ClientSettings(s.url))
    change = start + at * (end - start)
    return explain(client, JobSpec(JOB_NAME, NAMESPACE), start, end, change_at=change)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_split_halves_where_nothing_changed_nothing_stands_out(
    lab_cache: ScenarioCache, name: str
) -> None:
    """Every series of every scenario, two halves of its stretch before the fault: no
    check scores 1 on any device, and the checks did judge data ("no fabric cause found").
    nvlink_errors holds node-00's rail at a steady 10 symbol errors a second from start to
    end (the issue's port, which stood out at 2.66-3.70 at 3 of 4 split points) and its
    faulty GPU at a steady, noisy NVLink error rate after the fault: there the stretch
    after the fault is split too."""
    s = lab_cache.get(name, TEST_HOURS, TEST_STEP)
    stretches = [(s.start, s.fault_start - s.step)]
    if name == "nvlink_errors":
        stretches.append((s.fault_start + 2 * s.step, s.end))
    steady = []
    for stretch, at in (
        [(x, at) for x in stretches for at in (0.3, 0.5, 0.7)]
        if name == "nvlink_errors"
        else [(stretches[0], 0.5)]
    ):
        report = _halves(s, stretch, at)
        worst = max(report.checked, key=lambda c: c.worst)
        assert worst.worst < THRESHOLD, (name, at, worst, report.findings[:2])
        assert report.verdict == "no fabric cause found", (name, at, report.reason)
        assert report.exit_code == 0
        steady += [
            m
            for f in report.findings
            for m in f.measurements
            if (m.check.name, m.labels.get("instance"), m.labels.get("device"))
            == ("symbol_errors", "node-00", "mlx5_0")
        ]
    if name == "nvlink_errors":
        # where the steady port's rate rose a little, its significance level alone would
        # have made it stand out; its own noise holds it below 1, and the line says so
        assert any(m.naive_score >= THRESHOLD for m in steady), steady
        for m in steady:
            assert m.baseline is not None and 500 < m.baseline < 700  # 600/min, as planted
            if m.naive_score >= THRESHOLD:
                assert "(within its baseline's noise: +-" in m.text, m.text


def test_a_window_beginning_before_the_data_is_cut_to_it(lab_cache: ScenarioCache) -> None:
    """The issue's run: the window began 10 minutes before any series; rate() over the
    baseline spread its counts over the empty part and the steady port read 78.5 -> 594/min
    (9.0). The window is the part the job's data covers (said in the report), so the steady
    port reads 600 -> 600 and only the planted cause stands out."""
    s = lab_cache.get("nvlink_errors", TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    for change in (None, s.fault_start):
        report = explain(
            client, JobSpec(JOB_NAME, NAMESPACE), s.start - 600, s.end, change_at=change
        )
        assert report.data_note.startswith("the job's data covers only 45m"), report.data_note
        assert report.periods.base_start >= s.start
        assert [f.cause for f in report.causes] == ["nvlink"], report.causes
        assert report.verdict == "causes found"


def test_a_long_window_over_minutes_of_data_says_so(lab_cache: ScenarioCache) -> None:
    """``--window 6h`` over the first minutes of data: never a silent "no significant drop"
    in the window; the report names how much of the window the data covers and judges that
    part (or says it could not)."""
    s = lab_cache.get("healthy", TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    end = s.start + 8 * s.step
    report = explain(client, JobSpec(JOB_NAME, NAMESPACE), end - 6 * 3600, end)
    assert report.data_note.startswith("the job's data covers only "), report.data_note
    assert " of the 6h window" in report.data_note
    assert report.causes == []
    text = render.text(report)
    assert f"note: {report.data_note}" in text
    assert "no significant drop in the job's data" in text


def test_a_saturated_counter_is_named_and_the_port_still_ranks(reports: dict[str, Report]) -> None:
    """roce_incast: the incast rail's 32-bit port_xmit_wait counters saturate within a
    minute of the incast on every node. Each of those ports' xmit_wait evidence says
    "evidence unavailable (port_xmit_wait saturated since T)", in the table and the JSON,
    and the receiver still ranks first on its other evidence."""
    report = reports["roce_incast"]
    first = report.causes[0]
    assert (first.cause, first.instance) == ("roce_congestion", "node-02")
    blind = [e for e in first.evidence if "evidence unavailable" in e]
    assert blind and blind[0].startswith("xmit_wait share"), first.evidence
    assert "(port_xmit_wait saturated since " in blind[0]
    checked = {c.check: c for c in report.checked}
    assert checked["xmit_wait_share"].unavailable == 4  # mlx5_9 on every node
    text = render.text(report)
    assert blind[0][:60] in text
    doc = json.loads(render.to_json(report))
    assert blind[0] in doc["findings"][0]["evidence"]
    named = [m for m in doc["findings"][0]["measurements"] if m["unavailable"]]
    assert named and named[0]["check"] == "xmit_wait_share"


def test_the_rail_share_median_leaves_out_the_port_standing_down(
    reports: dict[str, Report],
) -> None:
    """ib_rate_drop: node-01's mlx5_11 stands DOWN from the start. The median the slow
    port is held to is of the ports that moved data: its share reads 0.38 (a quarter, as
    planted, against the job's slowed peers), not the ~0.55 of a median counting the DOWN
    port's zero."""
    report = reports["ib_rate_drop"]
    share = [
        m
        for f in report.findings
        for m in f.measurements
        if m.check.name == "rail_share" and m.labels.get("device") == "mlx5_5"
    ]
    assert share and share[0].slow is not None
    # a quarter of its own rate against peers at the job's 0.66: 1 / (4 x 0.66); counting
    # the DOWN port's zero, the median falls between this port and a healthy one: ~0.55
    assert share[0].slow == pytest.approx(1 / (4 * 0.66), abs=0.03)
    assert share[0].baseline == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_evidence_line_of_every_cause_reproduces(
    lab_cache: ScenarioCache, reports: dict[str, Report], name: str
) -> None:
    """The printed PromQL of each figure of each cause, run on the same Prometheus at the
    printed time, returns the printed figure (within 5 %); the figure is in the line."""
    s = lab_cache.get(name, TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    report = reports[name]
    checked = assert_every_figure_reproduces(client, report)
    assert checked >= 2 * len(report.causes), name


def _mean_in(series: plot.Series, lo: float, hi: float) -> float:
    vals = [v for t, v in zip(series.times, series.values, strict=True) if lo <= t <= hi]
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.nan


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_plot_draws_each_causes_evidence_in_its_unit(
    lab_cache: ScenarioCache, reports: dict[str, Report], name: str, tmp_path: Path
) -> None:
    """``--plot`` draws, for each cause it shows, the device's series of its strongest
    evidence line, in the line's unit: over each period its mean is the printed figure
    (within a quarter, the drawn range being a few steps, not the period), and the y axis
    names the unit."""
    s = lab_cache.get(name, TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    report = reports[name]
    drawn = plot.panels(client, report)
    assert len(drawn) == min(plot.TOP, len(report.causes))
    for panel in drawn:
        m = panel.measurement
        assert m is not None and len(panel.series) == 1, panel
        assert m.check.axis_label in panel.ylabel
        if m.check.mode == "events":
            continue
        for figure, window in ((m.baseline, m.base_window), (m.slow, m.slow_window)):
            assert figure is not None and window is not None
            # a few steps in, so the drawn range lies inside the period
            lo = window.at - window.seconds + panel.seconds
            mean = _mean_in(panel.series[0], lo, window.at)
            scale = max(abs(figure), m.check.significant * m.check.scale)
            assert abs(mean - figure) <= 0.25 * scale, (panel.promql, figure, mean)
    if name in ("ib_rate_drop", "roce_incast"):  # two PNGs to look at
        png = tmp_path / f"{name}.png"
        plot.plot(client, report, str(png))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_namespace_the_job_s_own_series_give_it(lab_cache: ScenarioCache) -> None:
    """--namespace is optional: with --job alone, or with --nodes, the namespace comes from
    the job's throughput series, the pods and their GPUs are found and the same checks run
    as with it given (it judged 35 of 56 checks and said "no fabric cause found" before)."""
    s = lab_cache.get("nccl_socket_fallback", TEST_HOURS, TEST_STEP)
    client = PrometheusClient(ClientSettings(s.url))
    given = explain(client, JobSpec(JOB_NAME, NAMESPACE), s.start, s.end)
    nodes = tuple(sorted(given.footprint.instances))
    for job in (JobSpec(JOB_NAME), JobSpec(JOB_NAME, nodes=nodes)):
        report = explain(client, job, s.start, s.end)
        assert report.job.namespace == NAMESPACE
        assert report.footprint.gpus == given.footprint.gpus and report.footprint.gpus
        assert report.judged_checks == given.judged_checks
        assert report.causes[0].cause == "nccl_transport", report.causes[:2]
        assert report.verdict == "causes found" and report.warning == ""
