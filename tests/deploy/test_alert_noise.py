"""The fleet alert budget, small: ``bench/alert_noise.py``'s week on 24 nodes (the real
agent's series for each node state, the week's background in event windows, seven
planted faults, every shipped rule evaluated by a real Prometheus, the alerts through a real
Alertmanager running deploy/alertmanager/alertmanager.yml; docs/performance.md has the
1,000-node week).

Every planted fault raises an alert that names it within its stated time; the background
raises no critical and no warning but its fleet-wide decisions (ACS redirect on every
node's PCIe switch ports, a few nodes' NIC firmware behind the rest: one alert each, not one
per node or bridge); single flaps, application
XIDs and drains are info, recorded without a notification, and counters stopped on most
nodes are one info alert for the fleet. The week renders NVLink state and errors, a busy
GPU's PCIe generation, both ends of each InfiniBand cable (the ibpeer sampler), the NCCL
probe at the chart's defaults on the nodes no job holds, what the agent reads from healthy
jobs' NCCL logs and the samplers' (absent) read errors, and their alerts stay quiet on it.
The Fleet dashboard's panels stay bounded.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import alert_noise  # noqa: E402
import fleet_nccl  # noqa: E402
import fleet_probe  # noqa: E402
import fleet_week  # noqa: E402

NODES = 24
DAYS = 7.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> alert_noise.Run:
    return alert_noise.run(
        NODES, DAYS, 60.0, 35, tmp_path_factory.mktemp("alert-noise"),
        sample=1.0, job_size=4, log=lambda _: None,
    )  # fmt: skip


def counted(r: alert_noise.Run) -> list[alert_noise.Episode]:
    return [e for e in r.episodes if e.end >= r.history.start + fleet_week.WARMUP]


def background(r: alert_noise.Run) -> list[alert_noise.Episode]:
    return [e for e in counted(r) if not e.fault]


def test_every_planted_fault_alerts_within_its_stated_time(fleet: alert_noise.Run) -> None:
    planted = {f.kind: f for f in fleet.history.plan.faults}
    assert set(planted) == set(alert_noise.STATED_S)
    for kind, f in planted.items():
        mine = [e for e in counted(fleet) if e.fault == kind]
        assert mine, f"{kind} raised no alert"
        first = min(e.start for e in mine) - (fleet.history.start + f.at)
        assert not alert_noise.late(kind, first), (kind, first)
    # the lost GPU pages once, as lost: its XID 79 is not a second page
    lost = [e for e in fleet.episodes if e.fault == "lost_gpu"]
    assert {e.alert for e in lost} == {"FabricscopeGpuLost"}


#: the background's fleet-wide decisions: one warning each, for the whole class
FLEET_WIDE = ("FabricscopeAcsP2pRedirectFleetwide", "FabricscopeNicFirmwareMixed")


def test_the_background_never_pages_but_for_fleet_wide_decisions(
    fleet: alert_noise.Run,
) -> None:
    pages = [e for e in background(fleet) if e.severity in ("warning", "critical")]
    assert sorted((e.alert, e.severity) for e in pages) == [(a, "warning") for a in FLEET_WIDE], (
        Counter(e.alert for e in pages)
    )
    # one alert for the whole fleet or class, naming how many nodes: none per node
    acs, fw = sorted(pages, key=lambda e: e.alert)
    assert acs.labels.get("vendor")
    assert not [e for e in counted(fleet) if e.alert == "FabricscopeAcsP2pRedirectEnabled"]
    assert "instance" not in fw.labels and fw.labels["hca_type"] == "MT4129", fw.labels
    old = {n.name for n in fleet.history.plan.nodes if n.rail_fw}
    assert old and fleet.week.background[
        next(k for k in fleet.week.background if k.startswith("nodes whose compute rails"))
    ] == len({n for n in old if n in fleet.week.fleet_nodes})


def test_single_flaps_are_info_records_of_twenty_minutes(fleet: alert_noise.Run) -> None:
    flaps = [e for e in background(fleet) if e.alert.startswith("FabricscopeInfinibandLink")]
    assert flaps, "the week's single flaps raised nothing at all"
    assert {(e.alert, e.severity) for e in flaps} == {("FabricscopeInfinibandLinkFlapped", "info")}
    for e in flaps:  # a flap in a window's last 20 minutes is cut off by the window's end
        assert e.end - e.start + fleet.history.step <= 30 * 60, e
        if e.end < fleet.history.end:
            assert e.end - e.start + fleet.history.step >= 15 * 60, e


def test_application_xids_never_page(fleet: alert_noise.Run) -> None:
    xids = [e for e in counted(fleet) if e.labels.get("reason") in ("13", "31", "43", "45")]
    assert xids, "the background's application XIDs raised nothing at all"
    assert {(e.alert, e.severity) for e in xids} == {("FabricscopeGpuApplicationXid", "info")}


def test_drained_nodes_are_cordoned_not_down(fleet: alert_noise.Run) -> None:
    drained = {n.name for n in fleet.history.plan.nodes if n.cordons}
    assert drained, "the sample holds no drain"
    names = {e.alert for e in background(fleet) if e.labels.get("instance") in drained}
    assert "FabricscopeNodeCordoned" in names
    assert "FabricscopeAgentDown" not in names


def test_counters_stopped_fleet_wide_are_one_info_alert_naming_how_many(
    fleet: alert_noise.Run,
) -> None:
    """About 60 % of the nodes have stopped 32-bit counters (the chart's default reads sysfs
    and clears none): one decision, one info alert whose value is the number of nodes."""
    per_node = [e for e in counted(fleet) if e.alert == "FabricscopeInfinibandCounterSaturated"]
    assert not per_node, Counter(e.labels["instance"] for e in per_node).most_common(3)
    fleetwide = [
        e for e in counted(fleet) if e.alert == "FabricscopeInfinibandCounterSaturatedFleetwide"
    ]
    assert [(e.severity, "instance" in e.labels) for e in fleetwide] == [("info", False)]
    stopped = fleet.week.background["nodes with saturated 32-bit counters"]
    assert stopped > len(fleet.week.fleet_nodes) / 2, stopped


def test_alertmanager_notifies_the_faults_and_one_ticket_per_fleet_wide_decision(
    fleet: alert_noise.Run,
) -> None:
    d = fleet.delivery
    assert d is not None
    tickets = [b for b in d.bodies if b["receiver"] == "fabricscope-ticket"]
    pages = [b for b in d.bodies if b["receiver"] == "fabricscope-page"]
    # pages: the lost GPU, the hung rank, the pause storm (the criticals)
    assert sorted({b["groupLabels"]["alertname"] for b in pages}) == [
        "FabricscopeGpuLost", "FabricscopeNcclRankUnresponsive", "FabricscopePfcPauseStorm"
    ]  # fmt: skip
    background_tickets = [b for b in tickets if b["groupLabels"]["alertname"] in FLEET_WIDE]
    assert sorted(b["groupLabels"]["alertname"] for b in background_tickets) == list(FLEET_WIDE)
    faults = {f.node for f in fleet.history.plan.faults}
    for b in tickets:
        if b in background_tickets:
            continue
        inst = b["groupLabels"].get("instance")
        job = {a["labels"].get("job_name") for a in b["alerts"]}
        fault_jobs = {n.job for n in fleet.history.plan.nodes if n.name in faults}
        assert inst in faults or job <= fault_jobs, b["groupLabels"]
    notified = {a["labels"]["severity"] for b in d.bodies for a in b["alerts"]}
    assert notified <= {"critical", "warning"}
    assert d.recorded, "info alerts were recorded"


def test_fleet_panels_stay_bounded(fleet: alert_noise.Run) -> None:
    for row in fleet.panels:
        assert row["series"] <= 25, row


def test_the_week_models_what_every_alert_reads(fleet: alert_noise.Run) -> None:
    """Every shipped alert's figure in docs/alerts.md is measured, not "not in the week's
    history": the slice's history holds what each one reads, or the alert fired over it (as
    bench/alert_noise.py counts it: FabricscopeThroughputDrop reads four units, the history
    writes tokens/s, the first)."""
    modelled = alert_noise.modelled(fleet.families)
    fired = {e.alert for e in counted(fleet)} | {e.alert for e in background(fleet)}
    assert len(modelled) >= 51
    assert [a for a, ok in modelled.items() if not ok and a not in fired] == []


def test_the_week_renders_healthy_nvlinks_and_busy_gpus_pcie_generation(
    fleet: alert_noise.Run,
) -> None:
    """A healthy node at the chart's detail exports no per-link NVLink series (every link
    trained, no replay, recovery or CRC-flit error): the NVLink alerts read their per-GPU
    folds, every link up, and stay quiet; a GPU running the job's processes reports its PCIe
    generation (the recorded H200's Gen5 of 5: not degraded) and none alerts."""
    fams = fleet.families
    assert {"fabricscope_gpu_nvlinks_up", "fabricscope_gpu_nvlink_errors_total"} <= fams
    assert not {"fabricscope_nvlink_up", "fabricscope_nvlink_errors_total"} & fams
    assert "fabricscope_gpu_pcie_link_generation_degraded" in fams
    quiet = {"FabricscopeNvlinkDown", "FabricscopeNvlinkErrorsRising",
             "FabricscopeGpuPcieGenerationDegradedUnderLoad"}  # fmt: skip
    assert not [e for e in fleet.episodes if e.alert in quiet]


def test_the_week_renders_both_ends_of_each_cable(fleet: alert_noise.Run) -> None:
    """The ibpeer sampler's series (the real sampler on recorded answers): every node names
    its cables' far ends; the switch ends count symbol errors at the ports' drawn bit-error
    rates, judged as a rate, so the healthy background's (up to 10^-13) raise nothing; the
    planted bad cable's switch end alerts, naming the node and port."""
    assert "fabricscope_infiniband_peer_info" in fleet.families
    assert "fabricscope_infiniband_peer_port_symbol_errors_total" in fleet.families
    noisy = [n for n in fleet.history.plan.nodes if n.peer_noisy_ports]
    assert noisy, "no switch end counts symbol errors"
    peer = {
        "FabricscopeInfinibandPeerErrorsRising",
        "FabricscopeInfinibandPeerChanged",
        "FabricscopeInfinibandLinkWidthDegraded",
        "FabricscopeInfinibandLinkSpeedDegraded",
    }
    assert not [e for e in background(fleet) if e.alert in peer]
    cable = next(f for f in fleet.history.plan.faults if f.kind == "bad_cable")
    mine = [e for e in counted(fleet) if e.alert == "FabricscopeInfinibandPeerErrorsRising"]
    assert [e.fault for e in mine] == ["bad_cable"], mine
    assert mine[0].labels["instance"] == cable.node


#: the probe's alerts and the NCCL-log alerts (bench/fleet_probe.py, bench/fleet_nccl.py)
PROBE_ALERTS = {
    "FabricscopeProbeBadLink", "FabricscopeProbeBadNode", "FabricscopeProbeBusbwDrop",
    "FabricscopeProbeInterNodeBusbwLow", "FabricscopeProbeIntraNodeBusbwLow",
    "FabricscopeProbeRunsFailing", "FabricscopeProbeWrongResult",
}  # fmt: skip
NCCL_LOG_ALERTS = {
    "FabricscopeNcclHcaOffGpuNuma", "FabricscopeNcclIbWithoutGdr",
    "FabricscopeNcclNetworkWarningsRising", "FabricscopeNcclSocketTransport",
}  # fmt: skip


def test_the_week_renders_the_probe_on_idle_nodes_and_it_stays_quiet(
    fleet: alert_noise.Run,
) -> None:
    """The probe at the chart's defaults runs on the nodes whose GPUs no job holds (the event
    windows' nodes, between jobs): node pairs every round and an intra-node all_reduce every
    hour, from enough nodes for the rules' fleet medians (4); its alerts read those series
    (the localisation records included) and none fires on the healthy background."""
    assert len(PROBE_ALERTS) == 7
    assert fleet.families >= fleet_probe.FAMILIES
    assert {
        "fabricscope:probe_pair_ok:last1h", "fabricscope:probe_node_passes:last1h"
    } <= fleet.families  # fmt: skip
    pairs = fleet_probe.pair_rounds(fleet.history.plan, 35)
    probing = {n for n, runs in pairs.items() if runs}
    assert len(probing) >= 4, probing
    busy = {n.name for n in fleet.history.plan.nodes if n.job and not n.job_gone}
    assert not probing & busy, "a node whose GPUs run a job probed"
    assert not [e for e in fleet.episodes if e.alert in PROBE_ALERTS]


def test_the_week_renders_healthy_jobs_nccl_logs_and_they_stay_quiet(
    fleet: alert_noise.Run,
) -> None:
    """Every job's pod exports what the agent reads from a healthy job's NCCL log (NET/IB with
    GDRDMA, P2P inside the node, no warning, no HCA off its GPU's NUMA node), through the
    week's job churn; the nodes have a GPUDirect RDMA path; the NCCL-log alerts stay quiet."""
    assert fleet.families >= fleet_nccl.FAMILIES
    assert fleet_nccl.JOB_TRANSPORTS == (("NET/IB", True), ("P2P/IPC", False))
    assert fleet_nccl.HEALTHY_WARNINGS == 0 and fleet_nccl.GPUDIRECT_AVAILABLE is True
    assert not [e for e in fleet.episodes if e.alert in NCCL_LOG_ALERTS]


def test_a_healthy_agent_reads_every_file_and_read_errors_stay_quiet(
    fleet: alert_noise.Run,
) -> None:
    """The real agent on the healthy node exports its samplers' success and no read error (the
    counter is born with its first error): FabricscopeSamplerReadErrors reads that absence
    over the week and stays quiet; without the agent's own series it is not modelled."""
    assert "fabricscope_sampler_success" in fleet.families
    assert "fabricscope_sampler_read_errors_total" not in fleet.families
    assert alert_noise.modelled(fleet.families)["FabricscopeSamplerReadErrors"]
    assert not alert_noise.modelled(fleet.families - {"fabricscope_sampler_success"})[
        "FabricscopeSamplerReadErrors"
    ]
    assert not [e for e in fleet.episodes if e.alert == "FabricscopeSamplerReadErrors"]


def test_a_record_of_what_is_wrong_counts_as_rendered_where_its_reads_are() -> None:
    """fabricscope:probe_bad_node:last1h records only bad nodes, nothing over a healthy fleet:
    the week models FabricscopeProbeBadNode where the probe's own series are in the history."""
    assert not alert_noise.modelled(set())["FabricscopeProbeBadNode"]
    probe = {"fabricscope_probe_busbw_bytes_per_second", "fabricscope_probe_success"}
    assert alert_noise.modelled(probe)["FabricscopeProbeBadNode"]
    assert alert_noise.modelled(probe)["FabricscopeProbeBadLink"]
    assert not alert_noise.modelled({"fabricscope_probe_success"})["FabricscopeProbeBadLink"]


def test_a_folded_family_counts_as_rendered_only_beside_its_fold() -> None:
    """fabricscope_nvlink_up is absent on a healthy node below full detail: the week models
    FabricscopeNvlinkDown where its per-GPU fold is in the history, not otherwise."""
    base = {"fabricscope_gpu_nvlink_errors_total"}
    assert not alert_noise.modelled(base)["FabricscopeNvlinkDown"]
    assert alert_noise.modelled(base | {"fabricscope_gpu_nvlinks_up"})["FabricscopeNvlinkDown"]
    assert alert_noise.modelled(base)["FabricscopeNvlinkErrorsRising"]
    assert not alert_noise.modelled(set())["FabricscopeNvlinkErrorsRising"]


def test_the_committed_week_is_a_thousand_nodes_within_budget() -> None:
    """bench/results/alert_noise.json (the README's table) is the 1,000-node week, and it
    meets the budget: every planted fault alerted within its stated time, the background's
    warnings and criticals at most 1 per 1,000 node-days, none critical."""
    week = json.loads((ROOT / "bench" / "results" / "alert_noise.json").read_text())
    assert (week["nodes"], week["days"]) == (1000, 7.0), week["command"]
    assert week["command"].startswith("python bench/alert_noise.py --nodes 1000 --days 7")
    assert {f["fault"] for f in week["faults"]} == set(alert_noise.STATED_S)
    for f in week["faults"]:
        assert f["alerts"], f
        assert not alert_noise.late(f["fault"], f["first_alert_after_s"]), f
    assert week["background_pages_per_1000_node_days"] <= 1.0
    assert week["background_critical"] == 0
    assert week["alertmanager"]["notifications"], "no notification counted"
