"""Past one Prometheus: ``fabricscope explain``, the recording rules and the alert rules run
unchanged against VictoriaMetrics (Debian's 1.79: the single-node server, ``vmctl``,
``vmalert``), on the scenario lab's data.

Each scenario's blocks (the ones ``tests/test_explain_lab.py`` and the dashboards test query
in Prometheus, built once per session) are imported into a fresh VictoriaMetrics with
``vmctl prometheus``, raw series only; ``vmalert`` then replays every shipped rule file over
the scenario's window, writing the recording rules' series and ``ALERTS`` into it. Then:
explain asked of VictoriaMetrics ranks the planted cause first, as it does on Prometheus;
every fleet recording rule gives the label sets Prometheus's (promtool-backfilled) give, with
values that agree within what MetricsQL's rate/increase (no extrapolation to the window's
edges) changes; and the alerts firing at the end of the window are the ones Prometheus's
query engine gives with the rule manager's ``for`` (``tests/rule_eval.py``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec
from exporter.explain.report import explain
from tests.explain.test_explain_lab import EXPECTED
from tests.lab.backfill import TEST_HOURS, TEST_STEP, ScenarioCache, ServedScenario
from tests.lab.scenarios import JOB_NAME, NAMESPACE
from tests.rule_eval import RULES, api, evaluate, load_rules
from tests.vmharness import VictoriaMetrics, check_rules, start_victoria_metrics

#: a fault in a port's counters, one in a NIC's PCIe link, and none
SCENARIOS = ("ib_link_bad", "pcie_x8_nic", "healthy")


@dataclass
class Both:
    lab: ServedScenario
    vm: VictoriaMetrics


@pytest.fixture(scope="module", params=SCENARIOS)
def both(
    request: pytest.FixtureRequest,
    lab_cache: ScenarioCache,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Both]:
    lab = lab_cache.get(request.param, TEST_HOURS, TEST_STEP)
    # every series a query can see over the window, per metric: the same on both before any
    # comparison (an import VictoriaMetrics 1.79 answers with a series short was seen once
    # in many runs: imported again, its duplicate samples deduplicated)
    visible = (
        "count by (__name__) "
        f'(last_over_time({{__name__=~"[^:]+"}}[{lab.end - lab.start + 60:.0f}s]))'
    )
    want = _at_end(lab.url, visible, lab.end)
    with start_victoria_metrics(
        tmp_path_factory.mktemp(f"vm-{request.param}"), ["-dedup.minScrapeInterval=1ms"]
    ) as vm:
        for _ in range(3):
            vm.import_tsdb(lab.tsdb, raw_only=True)
            if _at_end(vm.url, visible, lab.end) == want:
                break
        assert _at_end(vm.url, visible, lab.end) == want
        vm.replay_rules(sorted(RULES.glob("*.rules.yaml")), lab.start, lab.end)
        yield Both(lab, vm)


def test_vmalert_accepts_every_rule_file_as_shipped() -> None:
    check_rules(sorted(RULES.glob("*.rules.yaml")))


def test_explain_ranks_the_planted_cause_first(both: Both) -> None:
    name = both.lab.scenario.name
    job = JobSpec(JOB_NAME, NAMESPACE)
    on_vm = explain(
        PrometheusClient(ClientSettings(both.vm.url)), job, both.lab.start, both.lab.end
    )
    on_prom = explain(
        PrometheusClient(ClientSettings(both.lab.url)), job, both.lab.start, both.lab.end
    )
    assert on_vm.throughput.metric == on_prom.throughput.metric
    if name not in EXPECTED:  # healthy: no cause on either
        assert on_vm.shift is None and on_prom.shift is None
        assert on_vm.causes == on_prom.causes == []
        return
    assert on_vm.shift is not None and on_prom.shift is not None
    assert on_vm.shift.at == pytest.approx(on_prom.shift.at, abs=TEST_STEP)
    cause, node, device = EXPECTED[name]
    top = on_vm.causes[0]
    assert (top.cause, top.instance) == (cause, node), on_vm.causes[:3]
    assert device in top.device
    assert [c.cause for c in on_vm.causes] == [c.cause for c in on_prom.causes]


def _at_end(url: str, query: str, end: float) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s["metric"].items())): float(s["value"][1])
        for s in api(url, "/api/v1/query", {"query": query, "time": f"{end:.0f}"})
    }


def _medians(
    url: str, query: str, start: float, end: float
) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    span = {"start": f"{start:.0f}", "end": f"{end:.0f}", "step": "60"}
    for s in api(url, "/api/v1/query_range", {"query": query, **span}):
        labels = tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__"))
        out[labels] = statistics.median(float(v) for _, v in s["values"])
    return out


def test_recording_rules_agree(both: Both) -> None:
    """Each fleet record over the scenario's last half hour, per node: the same nodes, and
    medians within 10 % (MetricsQL's rate() and increase() do not extrapolate to the
    window's edges, and vmalert's replay may evaluate a step apart from promtool's)."""
    records = [r for r in load_rules() if not r.alert and r.file == "fleet.rules.yaml"]
    assert records
    start, end = both.lab.end - 1800, both.lab.end
    for r in records:
        prom = _medians(both.lab.url, r.name, start, end)
        vm = _medians(both.vm.url, r.name, start, end)
        assert set(vm) == set(prom), r.name
        for labels, value in prom.items():
            assert math.isclose(vm[labels], value, rel_tol=0.1, abs_tol=0.05), (
                r.name, labels, vm[labels], value,
            )  # fmt: skip


def test_alerts_agree(both: Both) -> None:
    end = both.lab.end
    step = both.lab.step
    expected: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for r in load_rules():
        if not r.alert:
            continue
        for e in evaluate(both.lab.url, r, both.lab.start, end, step):
            if e.end >= end - step:
                expected.add((e.alert, tuple(sorted(e.labels.items()))))
    # vmalert's ALERTS carry the rule's group as alertgroup; Prometheus's do not
    firing = {
        (
            dict(labels)["alertname"],
            tuple(
                (k, v)
                for k, v in labels
                if k not in ("__name__", "alertname", "alertstate", "alertgroup")
            ),
        )
        for labels in _at_end(both.vm.url, 'ALERTS{alertstate="firing"}', end)
    }
    assert firing == expected
    if both.lab.scenario.name != "healthy":
        assert expected, "the planted fault raised no alert"


def test_every_dashboard_query_runs(both: Both) -> None:
    """Every panel of every dashboard answers on VictoriaMetrics (MetricsQL accepts the
    PromQL, the Fleet dashboard's ``@ end()`` included), with series wherever Prometheus has
    some."""
    from tests.deploy.test_dashboards import generate, substitute

    empty = []
    for board in generate.BOARDS:
        for p in board.panels:
            for expr, _ in p.targets:
                q = substitute(expr, board, both.lab.scenario)
                if p.kind == "timeseries":
                    span = {"start": f"{both.lab.start:.0f}", "end": f"{both.lab.end:.0f}"}
                    params = {"query": q, **span, "step": "60"}
                    path = "/api/v1/query_range"
                else:
                    params, path = {"query": q, "time": f"{both.lab.end:.0f}"}, "/api/v1/query"
                on_vm = api(both.vm.url, path, params)
                if not on_vm and api(both.lab.url, path, params):
                    empty.append(f"{board.uid}: {p.title}")
    assert not empty, empty
