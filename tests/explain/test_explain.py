"""``fabricscope explain`` against a real Prometheus serving the scenario lab's TSDB
(tests/explain_lab.py: series rendered by the real agent from fixture trees and a recorded
NVML, backfilled with promtool). Each scenario plants one cause in a 4-node job."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from exporter.explain import render
from exporter.explain.checks import CHECKS, THRESHOLD
from exporter.explain.client import ClientSettings, PrometheusClient, Sample
from exporter.explain.discover import JobSpec, inventory
from exporter.explain.report import Report, explain
from exporter.explain.switches import UPLINK_CHECKS
from tests import explain_lab
from tests.agentrun import fabricscope
from tests.explain.reproduce import (
    assert_every_figure_reproduces,
    assert_every_printed_query_reproduces,
)
from tests.promharness import Prometheus, start_prometheus


@dataclass(frozen=True)
class Lab:
    prom: Prometheus
    slots: dict[str, explain_lab.Slot]

    def client(self) -> PrometheusClient:
        return PrometheusClient(ClientSettings(self.prom.url))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    work = tmp_path_factory.mktemp("explain-lab")
    tsdb, slots = explain_lab.build(work / "build")
    # start_prometheus serves <workdir>/data-0 on its first attempt: the backfilled blocks
    (work / "prom").mkdir()
    shutil.move(str(tsdb), str(work / "prom" / "data-0"))
    with start_prometheus(work / "prom", []) as prom:
        yield Lab(prom, {s.scenario.name: s for s in slots})


def run(lab: Lab, name: str) -> Report:
    slot = lab.slots[name]
    return explain(lab.client(), JobSpec("llm", "training"), slot.start, slot.end)


@pytest.mark.parametrize(
    "name",
    [
        "ib_link_bad",
        "roce_incast",
        "nvlink_errors",
        "pcie_x8_nic",
        "wrong_numa",
        "nccl_env_differs",
        "nccl_rank_stuck",
    ],
)
def test_the_planted_cause_ranks_first_and_nothing_unrelated_stands_out(
    lab: Lab, name: str
) -> None:
    report = run(lab, name)
    planted = explain_lab.SCENARIOS[name].planted
    assert planted is not None
    first = report.findings[0]
    assert planted.device in first.device
    if planted.cause == "nccl_config":  # a job-wide finding: the odd pod is in its evidence
        assert first.cause == "nccl_config" and first.instance == ""
        assert first.evidence == (
            "NCCL_IB_HCA==mlx5_0 on llm-1; NCCL_IB_HCA==mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,"
            "mlx5_9,mlx5_10,mlx5_11 on llm-0, llm-2, llm-3",
        )
    else:
        assert (first.cause, first.instance) == (planted.cause, planted.node), report.findings[:3]
    assert first.score >= THRESHOLD
    # anything else above the threshold is the same incident: the planted cause elsewhere
    # (an incast's senders) or another symptom on the planted node
    for f in report.causes[1:]:
        assert f.cause == planted.cause or f.instance == planted.node, f
    assert len(report.footprint.instances) == 4
    assert report.footprint.pods == ("llm-0", "llm-1", "llm-2", "llm-3")


@pytest.mark.parametrize("name", ["ib_link_bad", "roce_incast", "nvlink_errors", "pcie_x8_nic"])
def test_the_drop_is_found_where_it_was_planted(lab: Lab, name: str) -> None:
    report = run(lab, name)
    slot = lab.slots[name]
    assert report.shift is not None
    assert abs(report.shift.at - slot.change) <= 120  # within two 60 s samples
    assert report.shift.drop_ratio == pytest.approx(1 - 36769.6582 / 55803.1245, abs=0.02)


def test_the_rank_nccl_names_is_the_cause_with_its_nodes_own_evidence(lab: Lab) -> None:
    """The node that asks the job (node-00) names the rank; explain moves it to the node that
    owns its host address (node-02) and joins that GPU's XID to it."""
    report = run(lab, "nccl_rank_stuck")
    first = report.causes[0]
    assert (first.cause, first.device) == ("nccl_rank", "node-02 GPU 1")
    assert first.evidence[0].startswith("NCCL's RAS named this GPU's rank")
    assert any("XID" in e and "node-02 GPU 1" in e for e in first.evidence[1:]), first.evidence
    # the XID keeps its own place, below the rank it explains
    assert [f.cause for f in report.causes[1:]] == ["gpu"]
    assert all(f.instance == "node-02" for f in report.causes)


def test_healthy_job_no_fabric_cause_with_what_was_checked(lab: Lab) -> None:
    report = run(lab, "healthy")
    assert report.shift is None
    assert report.causes == []
    checked = {c.check: c for c in report.checked}
    # the checks really looked at data: per-port and per-GPU series of all four nodes
    assert checked["symbol_errors"].devices == 48
    assert checked["nvlink_errors"].devices == 8
    assert checked["probe_busbw"].devices == 4
    assert all(c.worst < THRESHOLD for c in report.checked)


def test_wrong_numa_only_is_misplacement_without_a_drop(lab: Lab) -> None:
    report = run(lab, "wrong_numa")
    assert report.shift is None  # misplaced from the start: nothing dropped
    assert [f.cause for f in report.causes] == ["misplacement"]
    assert report.causes[0].device == "llm-2 on node-02"


def test_cli_table_json_and_plot(lab: Lab, tmp_path: Path) -> None:
    slot = lab.slots["ib_link_bad"]
    png = tmp_path / "explain.png"
    args = [
        "explain",
        "--prometheus.url",
        lab.prom.url,
        "--namespace",
        "training",
        "--job",
        "llm",
        "--since",
        f"{slot.start:.0f}",
        "--until",
        f"{slot.end:.0f}",
        "--grafana.url",
        "https://grafana.example",
    ]
    table = fabricscope([*args, "--plot", str(png)])
    assert table.returncode == 0, table.stderr
    assert (
        " 1   " in table.stdout and "InfiniBand/RoCE link errors: node-02 mlx5_3/1" in table.stdout
    )
    assert "symbol errors: " in table.stdout and "/min" in table.stdout
    assert 'symbol_errors_total{instance="node-02",device="mlx5_3",port="1"}' in table.stdout
    assert "https://grafana.example/d/fabricscope-node/?" in table.stdout
    assert "var-node=node-02" in table.stdout and "viewPanel=3" in table.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    out = fabricscope([*args, "--format", "json"])
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["verdict"] == "causes found"
    top = doc["findings"][0]
    assert (top["cause"], top["instance"], top["stands_out"]) == ("ib_link", "node-02", True)
    assert doc["throughput"]["metric"] == "fabricscope_throughput_tokens_per_second"
    # the PromQL a finding shows returns its strongest line's slow figure, at its time
    shown = lab.client().query(top["promql"], top["promql_at"])
    first = top["measurements"][0]
    assert len(shown) == 1 and shown[0].value == pytest.approx(first["slow"], rel=0.05)
    assert first["slow_query"]["promql"] == top["promql"] and first["unit"] == "/min"
    # the table carries the JSON's evidence lines, and whole events
    for line in top["evidence"]:
        assert line[:70] in " ".join(table.stdout.split()), line
    events = [m for m in top["measurements"] if m["check"] == "link_error_recovery"]
    assert events and float(events[0]["slow"]).is_integer(), events
    assert events[0]["slow_query"]["promql"].startswith("round(increase(")


def test_cli_healthy_says_no_fabric_cause(lab: Lab) -> None:
    slot = lab.slots["healthy"]
    out = fabricscope(
        [
            "explain",
            "--prometheus.url",
            lab.prom.url,
            "--namespace",
            "training",
            "--job",
            "llm",
            "--since",
            f"{slot.start:.0f}",
            "--until",
            f"{slot.end:.0f}",
        ]
    )
    assert out.returncode == 0, out.stderr
    # every check of the table, the NCCL settings and the uplinks; 39 have data in this lab
    # (the below-its-rate check reads a folded zero as 0 since the series budget folds it):
    # the 32 of the first lab and the 7 the agent's default-detail families give it since
    # (port rate, link width, lane speed, NIC PCIe speed and its below-both-ends flag, the
    # GPU's PCIe generation flag, the workload's NCCL finding counts); the switch end, the
    # uplinks, XID events and NCCL's own log lines have none
    checks = len(CHECKS) + 1 + len(UPLINK_CHECKS)
    assert f"no fabric cause found: 39 of {checks} checks compared data of both periods, on 4 " in (
        out.stdout
    )
    for unjudged in ("symbol errors at the switch end of the cable", "XID errors"):
        assert f"{unjudged} [no data]" in out.stdout
    for judged in ("port rate", "lane speed", "NIC PCIe link speed", "running processes"):
        assert f"{judged} [48 devices" in out.stdout or f"{judged} (share of time) [8 " in (
            out.stdout
        )
    assert "symbol errors [48 devices; max 0.00]" in out.stdout


def test_cli_missing_series_one_line_exit_2(lab: Lab) -> None:
    slot = lab.slots["healthy"]
    args = ["explain", "--prometheus.url", lab.prom.url, "--namespace", "training"]
    args += ["--job", "nosuchjob", "--since", f"{slot.start:.0f}", "--until", f"{slot.end:.0f}"]
    out = fabricscope(args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "no throughput series for job_name='nosuchjob' in namespace 'training'" in out.stderr
    # with the change given, the job still has no nodes: also one line
    out = fabricscope([*args, "--change-at", f"{slot.change:.0f}"])
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "found no nodes for job 'nosuchjob'" in out.stderr


def test_bare_metal_nodes_and_a_given_change(lab: Lab) -> None:
    """A Slurm-style job: nodes named, no namespace; the change given instead of found."""
    slot = lab.slots["pcie_x8_nic"]
    report = explain(
        lab.client(),
        JobSpec("llm", "", None, ("node-00", "node-01")),
        slot.start,
        slot.end,
        change_at=slot.change,
    )
    assert report.change_given and report.shift is None
    assert report.footprint.instances == ("node-00", "node-01")
    assert report.causes[0].cause == "pcie" and report.causes[0].instance == "node-01"


def test_a_window_before_the_data_is_cut_to_the_jobs_data(lab: Lab) -> None:
    """The issue's run: the window began before the agents' data, no drop was found, the
    halves were compared and the baseline half held nothing; the DGX tree's standing x8
    switch uplink (0000:38:00.0) scored "none -> 1", 1.58, as a new cause. The window is
    now the part the job's data covers (and the report says so): its halves are compared,
    both hold data, nothing stands out."""
    slot = lab.slots["healthy"]
    start = slot.start - 8000  # the window's halves would split before the first sample
    report = explain(lab.client(), JobSpec("llm", "training"), start, slot.end)
    assert report.shift is None and report.periods.base_start >= slot.start
    assert report.data_note.startswith("the job's data covers only 2h of the 4h13m window")
    assert report.causes == [] and report.verdict == "no fabric cause found"
    checked = {c.check: c for c in report.checked}
    assert checked["pci_width_degraded"].no_baseline == 0 and checked["pci_width"].judged >= 4
    assert all(c.worst < THRESHOLD for c in report.checked)


def test_a_change_before_the_data_could_not_judge(lab: Lab) -> None:
    """A change given where the job's data holds no baseline: one line, exit 1 ("could not
    judge"), not a verdict. A job printing no throughput, its nodes given, has no window
    of its own to cut: every device that has data only after the change is "no baseline",
    none scores, and with nothing compared the verdict is "could not judge"."""
    slot = lab.slots["healthy"]
    start = slot.start - 8000
    args = ["explain", "--prometheus.url", lab.prom.url, "--namespace", "training"]
    args += ["--job", "llm", "--since", f"{start:.0f}", "--until", f"{slot.end:.0f}"]
    out = fabricscope([*args, "--change-at", f"{slot.start - 3600:.0f}"])
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.count("\n") == 1 and "leaves less than two steps" in out.stderr
    assert "the job's data covers only 2h of the 4h13m window" in out.stderr
    nodes = ("node-00", "node-01", "node-02", "node-03")
    job = JobSpec("no-such-job", "", None, nodes)
    report = explain(lab.client(), job, start, slot.end, change_at=start + 4000)
    assert report.periods.base_end < slot.start and report.causes == []
    checked = {c.check: c for c in report.checked}
    assert checked["pci_width_degraded"].no_baseline >= 4  # the x8 uplink on every node
    assert checked["pci_width_degraded"].worst == 0.0
    assert report.verdict == "could not judge" and report.exit_code == 1
    assert report.reason.startswith(
        f"only 0 of {len(CHECKS) + 1 + len(UPLINK_CHECKS)} checks compared data"
    )


def test_unknown_nodes_are_named_in_one_warning_line(lab: Lab) -> None:
    slot = lab.slots["ib_link_bad"]
    nodes = ("node-00", "node-01", "node-02", "node-03", "node-2x")
    report = explain(lab.client(), JobSpec("llm", "training", nodes=nodes), slot.start, slot.end)
    assert report.warning.startswith("warning: no fabricscope hardware series in the window")
    assert "--nodes node-2x (a typo" in report.warning and "node-01" not in report.warning
    assert report.causes[0].instance == "node-02"  # the real nodes are still answered for
    args = ["explain", "--prometheus.url", lab.prom.url, "--namespace", "training"]
    args += ["--job", "llm", "--nodes", ",".join(nodes), "--format", "json"]
    args += ["--since", f"{slot.start:.0f}", "--until", f"{slot.end:.0f}"]
    out = fabricscope(args)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "node-2x" in warnings[0]
    doc = json.loads(out.stdout)
    assert doc["warnings"] == [report.warning]
    assert doc["throughput"]["drop"]["median_shift_sigmas"] > 4
    assert "robust_sigma" not in out.stdout
    assert all("no_baseline" in c for c in doc["checked"])
    known = explain(lab.client(), JobSpec("llm", "training"), slot.start, slot.end)
    assert known.warning == ""


@pytest.mark.parametrize("name", sorted(explain_lab.SCENARIOS))
def test_every_evidence_line_of_every_cause_reproduces(lab: Lab, name: str) -> None:
    """As on the shared lab (tests/explain/test_explain_lab.py): each figure of each cause's
    evidence, its printed PromQL run at the printed time, returns the figure (within 5 %)."""
    assert_every_figure_reproduces(lab.client(), run(lab, name))


@pytest.mark.parametrize("name", sorted(explain_lab.SCENARIOS))
def test_every_printed_query_of_the_text_output_reproduces(lab: Lab, name: str) -> None:
    """The text output, as a person reads it: each ``promql:`` line, run at the time printed
    under it, returns the figure printed there (the baseline's too); every measurement the
    output shows has one (not only the strongest)."""
    report = run(lab, name)
    out = render.text(report)
    checked = assert_every_printed_query_reproduces(lab.client(), out)
    # the first cause's every shown measurement (its figures) printed and checked
    first = report.causes[0].measurements[: render.EVIDENCE] if report.causes else ()
    figures = sum((m.slow is not None) + (m.baseline is not None) for m in first)
    assert checked >= figures, out
    assert out.count("promql: ") >= len([m for m in first if m.slow is not None])


class _Counting(PrometheusClient):
    """A real client that counts its instant queries."""

    queries = 0

    def query(self, expr: str, at: float) -> list[Sample]:
        self.queries += 1
        return super().query(expr, at)


def test_device_names_come_from_the_index_and_name_as_the_samples_did(lab: Lab) -> None:
    """The inventory (the names: netdev, PCI role, HCA or GPU of a bus address, the port
    count) is asked of Prometheus's series index, not its samples, and names every device
    as the samples over the window name it (``count by (...) (last_over_time(...))``)."""
    slot = lab.slots["ib_link_bad"]
    client = _Counting(ClientSettings(lab.prom.url))
    nodes = [f"node-{n:02d}" for n in range(4)]
    inv = inventory(client, nodes, slot.start, slot.end)
    assert client.queries == 0
    sel = 'instance=~"node-00|node-01|node-02|node-03"'
    d = f"{int(slot.end - slot.start)}s"

    def last(family: str, labels: str) -> list[Sample]:
        return client.query(
            f"count by ({labels}) (last_over_time({family}{{{sel}}}[{d}]))", slot.end
        )

    ports = last("fabricscope_infiniband_port_info", "instance, netdev, device, port")
    roles = last("fabricscope_pci_device_info", "instance, pci_bus_id, role")
    hcas = last("fabricscope_infiniband_device_info", "instance, pci_bus_id, device")
    gpus = last("fabricscope_gpu_info", "instance, pci_bus_id, gpu")
    want = {
        (s.labels["instance"], s.labels["device"], s.labels["port"]): s.labels["netdev"]
        for s in ports
        if "netdev" in s.labels
    }
    assert inv.netdevs == want and len(want) == 4 * 12
    assert inv.port_count == sum(s.value for s in ports) == 4 * 12
    assert inv.pci_roles == {
        (s.labels["instance"], s.labels["pci_bus_id"]): s.labels.get("role", "") for s in roles
    }
    assert len(inv.pci_roles) == 4 * 54
    names = {(s.labels["instance"], s.labels["pci_bus_id"]): s.labels["device"] for s in hcas}
    names |= {
        (s.labels["instance"], s.labels["pci_bus_id"]): f"GPU {s.labels['gpu']}" for s in gpus
    }
    assert inv.pci_names == names
    assert inv.instances == frozenset(nodes)
