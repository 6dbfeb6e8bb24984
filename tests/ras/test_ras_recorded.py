"""Real RAS answers of a real job (tests/fixtures/ras/: NCCL 2.28.9, a 4-rank torchrun job on
4 H100s, rank 3 SIGSTOPped until RAS declared it dead, then resumed), replayed: parsed as
they are (NCCL 2.28.9's missing comma repaired and counted), tracked in their recorded
order and timing, and served by the stand-in RAS server to the agent's own querier, in
process and in its supervised child."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config import RasEndpointFlag, RasSettings
from agent.core.sysfs import SysfsReader
from agent.ras.parse import parse_status
from agent.ras.sampler import RasInputs, RasQuerier, RasSampler, local_rank
from agent.ras.targets import Endpoint, LocalProcess
from agent.ras.track import JobTracker, NamedRank
from tests.ras_standin import RasStandIn

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ras"
RECORDS = [json.loads(line) for line in (FIXTURES / "answers.jsonl").open()]
JSON = [r for r in RECORDS if "-json-" in r["tag"] and r["bytes"]]
#: the victim, as the recorder and job.log name it
VICTIM = (3, "192.0.2.2", 5170, 3)


def test_the_recording_is_what_its_readme_says() -> None:
    assert [r["tag"] for r in JSON] == [
        "healthy-json-status",
        "healthy-json-verbose",
        "healthy2-json-verbose",
        *(f"stopped+{n}-json-verbose" for n in (3, 10, 20, 35, 50, 80, 95, 110)),
        "resumed+3-json-verbose",
    ]
    silent = [r for r in RECORDS if r["tag"] == "stopped+65-json-verbose"]
    assert silent[0].get("replies") is None and silent[0]["bytes"] == 0


@pytest.mark.parametrize("record", JSON, ids=lambda r: r["tag"])
def test_every_recorded_answer_parses(record: dict[str, object]) -> None:
    answer = parse_status(str(record["answer"]).encode())
    assert answer.nccl_version == "2.28.9"
    (comm,) = answer.communicators
    assert comm.size == 4
    stopped = str(record["tag"]).startswith(("stopped", "resumed"))
    # NCCL 2.28.9 writes no comma in a missing rank's entry: exactly the answers with one
    assert answer.repaired is stopped
    assert [m.rank for m in comm.missing] == ([3] if stopped else [])
    for m in comm.missing:
        assert (m.rank, m.host, m.pid, m.nvml_dev) == VICTIM


def test_the_recorded_run_tracked_in_its_own_timing() -> None:
    tracker = JobTracker()
    seen = {}
    for r in JSON[2:]:  # one job's answers, at their recorded times
        seen[r["tag"]] = tracker.update(parse_status(r["answer"].encode()), float(r["t_rel"]))
    healthy = seen["healthy2-json-verbose"]
    assert healthy.named == () and healthy.mismatched_communicators == 1
    assert healthy.count_spread == 7  # 20401 .. 20408: a healthy job between two gathers
    first = seen["stopped+3-json-verbose"]
    assert [(n.rank, n.host, n.pid, n.gpu, n.state) for n in first.named] == [
        (*VICTIM, "unresponsive")
    ]
    assert first.ranks == (("dead", 0), ("responsive", 3), ("unresponsive", 1))
    assert first.timeouts == 2 and first.collection_seconds == pytest.approx(1.999)
    # the others wait on it: their counts stop (20420) from the first answer after the stop
    stalled = [seen[f"stopped+{n}-json-verbose"].counts_unchanged_seconds for n in (10, 50, 110)]
    assert stalled == pytest.approx([7.01, 47.04, 107.09], abs=0.05)
    dead = seen["stopped+80-json-verbose"]
    assert dead.ranks == (("dead", 1), ("responsive", 3), ("unresponsive", 0))
    assert dead.named[0].state == "dead"
    # resumed: the counts move again, and RAS still calls the rank dead (it never takes a
    # dead peer back): only the counts tell that the job lives
    resumed = seen["resumed+3-json-verbose"]
    assert resumed.counts_unchanged_seconds == 0.0
    assert resumed.rank_count("dead") == 1


def test_the_victim_is_named_with_its_pci_bus_id_when_it_runs_here() -> None:
    named = NamedRank(3, "unresponsive", "192.0.2.2", 5170, 3)
    here = [LocalProcess(98170, 5170, ((3, "0000:00:09.0"),), "ml", "llama-0")]
    got = local_rank(named, here, frozenset({"192.0.2.2"}))
    assert (got.pci_bus_id, got.pod, got.host_pid) == ("0000:00:09.0", "llama-0", 98170)
    # another node's process with the same pid and GPU index is not this one
    assert local_rank(named, here, frozenset({"192.0.2.3"})).pci_bus_id == ""


def test_the_recorded_answers_through_the_stand_in_to_the_querier() -> None:
    answers = [r["answer"].encode() for r in JSON[2:]]
    with RasStandIn(answers) as ras:
        q = RasQuerier(deadline_seconds=10)
        ep = Endpoint("127.0.0.1", ras.port, "", "recorded", "queried", ())
        q.accept_inputs(RasInputs((ep,), ("192.0.2.2",)))
        outcomes = [q.sample().outcomes[0] for _ in answers]
    assert all(o.error is None for o in outcomes), [o.detail for o in outcomes]
    assert ras.commands[:4] == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]
    states = [tuple(n.state for n in o.status.named) for o in outcomes if o.status]
    assert states == [()] + [("unresponsive",)] * 5 + [("dead",)] * 4


def test_the_recorded_answer_through_the_supervised_child(tmp_path: Path) -> None:
    stopped = next(r for r in JSON if r["tag"] == "stopped+35-json-verbose")
    with RasStandIn([stopped["answer"].encode()]) as ras:
        settings = RasSettings(
            interval_seconds=10,
            deadline_seconds=8,
            endpoints=(RasEndpointFlag("127.0.0.1", ras.port, "recorded"),),
        )
        sampler = RasSampler(settings, SysfsReader(tmp_path), lambda: None)
        try:
            snap = sampler.sample()
        finally:
            sampler.close()
    (job,) = snap.jobs
    assert job.status is not None and job.job_name == "recorded"
    assert [(n.rank, n.pid, n.gpu, n.state) for n in job.status.named] == [
        (3, 5170, 3, "unresponsive")
    ]
    assert snap.queries_total == 1 and snap.query_cpu_seconds_total > 0


def test_the_silent_answer_of_the_recording_is_a_timeout_after_one_retry() -> None:
    with RasStandIn([], behaviour="silent") as ras:
        q = RasQuerier(deadline_seconds=10)
        q.accept_inputs(RasInputs((Endpoint("127.0.0.1", ras.port, "", "", "queried", ()),)))
        (o,) = q.sample().outcomes
    assert o.error == "timeout" and ras.connections == 2


def test_discovery_through_the_agents_wiring(tmp_path: Path) -> None:
    """build_samplers' ras sampler finds the job from the workload sampler's latest snapshot:
    rank 0's process, in the host network, its NCCL_RAS_ADDR naming the stand-in's port."""
    from agent.config import AgentConfig, Paths, Sampling
    from agent.samplers import Latest, build_samplers
    from agent.workload.records import GpuPlacement, NcclSetting, WorkloadProcess, WorkloadSnapshot

    stopped = next(r for r in JSON if r["tag"] == "stopped+35-json-verbose")
    # this node's host network, in the kernel's formats: eth0 holds the recorded job's host
    net = tmp_path / "1" / "net"
    net.mkdir(parents=True)
    (net / "fib_trie").write_text(
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 192.0.2.2\n        /32 host LOCAL\n"
    )
    (net / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    )
    with RasStandIn([stopped["answer"].encode()]) as ras:
        procs = tuple(
            WorkloadProcess(
                pid=98167 + r,
                gpus=(GpuPlacement(r, f"0000:00:0{6 + r}.0", f"GPU-{r}", None),),
                allowed_cpus=(0,),
                pinned=False,
                nccl_env=(NcclSetting("NCCL_RAS_ADDR", f"127.0.0.1:{ras.port}"),),
                ns_pid=5167 + r,
                launch_rank=r,
                host_network=True,
            )
            for r in range(4)
        )
        snap = WorkloadSnapshot(processes=procs, has_gpus=True)
        latest = Latest()
        latest.bind(lambda name: snap if name == "workload" else None)
        config = AgentConfig(
            paths=Paths(sysfs=str(tmp_path), procfs=str(tmp_path)),
            sampling=Sampling(frozenset({"ras"})),
            ras=RasSettings(deadline_seconds=8, isolate=False),
        )
        (sampler,) = build_samplers(config, SysfsReader(tmp_path), latest=latest)
        got = sampler.sample()
    (ep,) = got.endpoints  # type: ignore[attr-defined]
    assert (ep.label, ep.state, len(ep.processes)) == (f"127.0.0.1:{ras.port}", "queried", 4)
    (job,) = got.jobs  # type: ignore[attr-defined]
    (rank,) = job.status.named
    # the rank's host is this node's eth0 address, its pid a local process's own pid: the
    # PCI bus id and host pid of its GPU process come from the workload sampler's view
    assert (rank.rank, rank.pid, rank.gpu, rank.state) == (3, 5170, 3, "unresponsive")
    assert (rank.pci_bus_id, rank.host_pid) == ("0000:00:09.0", 98170)
    assert [(a.address, a.netdev) for a in got.addresses] == [("192.0.2.2", "eth0")]  # type: ignore[attr-defined]
