"""Intra-node transports judged against the NVLinks: NCCL's channel lines between two GPUs that
NVML shows joined by NVLink, on real lines recorded on a lent 4x H100 (NVSwitch, NV18 between
every pair; tests/fixtures/nccl-logs/nccl-2.28.9-h100x4-*.log) and the NVML recording of the
same machine (tests/fixtures/nvml/h100x4.recording.json): P2P over the NVLinks is healthy; SHM
and NET/Socket between those GPUs are the finding, the series and the alert's input."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ThroughputFile, ThroughputSettings
from agent.node_findings import collect
from agent.nvml.record import ReplayNvml, load
from agent.nvml.sampler import NvmlSampler
from agent.samplers import nvlink_pairs
from agent.throughput.findings import findings
from agent.throughput.nccl import parse_nccl_line
from agent.throughput.nccl_run import MAX_COMM_RANKS, MAX_RANK_CHANNELS, NcclRun
from agent.throughput.records import ThroughputSnapshot
from agent.throughput.sampler import ThroughputSampler

ROOT = Path(__file__).resolve().parents[2]
NCCL = ROOT / "tests" / "fixtures" / "nccl-logs"
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h100x4.recording.json"
UID = "6f0e2a9c-25aa-4c43-8d6c-6a3a8f2f11aa"
GPUS = ("0000:00:06.0", "0000:00:07.0", "0000:00:08.0", "0000:00:09.0")
#: the rings NCCL built in the recorded runs: 0-1, 1-2, 2-3, 3-0
RING = ((GPUS[0], GPUS[1]), (GPUS[0], GPUS[3]), (GPUS[1], GPUS[2]), (GPUS[2], GPUS[3]))


@pytest.fixture(scope="module")
def nvlinks() -> tuple[tuple[str, str, int], ...]:
    pairs = nvlink_pairs(NvmlSampler(lambda: ReplayNvml(load(RECORDING))).sample())
    assert pairs is not None
    return pairs


def test_the_recorded_machine_joins_every_pair_by_18_nvlinks(
    nvlinks: tuple[tuple[str, str, int], ...],
) -> None:
    # what nvidia-smi topo -m printed on the same machine (nccl-2.28.9-h100x4-topo-m.txt)
    topo = (NCCL / "nccl-2.28.9-h100x4-topo-m.txt").read_text()
    assert topo.count("NV18") == 12
    assert nvlinks == tuple((a, b, 18) for i, a in enumerate(GPUS) for b in GPUS[i + 1 :])


def sample_file(
    tmp_path: Path, name: str, nvlinks: tuple[tuple[str, str, int], ...] | None
) -> ThroughputSnapshot:
    settings = ThroughputSettings(
        files=(ThroughputFile(str(NCCL / name), "ddp"),), pod_logs=str(tmp_path / "none")
    )
    return ThroughputSampler(settings, nvlinks=lambda: nvlinks, once=True).sample()


@pytest.mark.parametrize(
    ("name", "transport", "per_pair"),
    [
        ("nccl-2.28.9-h100x4-ddp-p2p.log", "P2P/CUMEM", 24),
        ("nccl-2.28.9-h100x4-ddp-shm.log", "SHM", 4),
        ("nccl-2.28.9-h100x4-ddp-socket.log", "NET/Socket", 4),
    ],
)
def test_each_ring_pair_is_judged_by_the_transport_nccl_chose(
    tmp_path: Path,
    nvlinks: tuple[tuple[str, str, int], ...],
    name: str,
    transport: str,
    per_pair: int,
) -> None:
    snap = sample_file(tmp_path, name, nvlinks)
    (s,) = snap.nccl
    assert s.nvlink_channels == tuple((a, b, transport, per_pair) for a, b in RING)
    kinds = [(f.kind, f.subject) for f in findings(snap)]
    if transport.startswith("P2P/"):
        assert kinds == []
    else:
        assert kinds == [("nccl_nvlink_bypassed", f"ddp:{a}-{b}") for a, b in RING]
        assert f"over {transport} instead of P2P" in findings(snap)[0].detail
    node = collect(tp=snap)
    assert "throughput" in node.areas_checked and "throughput" not in node.areas_missing
    assert node.counts()["nccl_nvlink_bypassed"] == (0 if transport.startswith("P2P/") else 4)


def test_nothing_is_judged_without_nvml_or_between_gpus_without_nvlink(tmp_path: Path) -> None:
    name = "nccl-2.28.9-h100x4-ddp-shm.log"
    (s,) = sample_file(tmp_path, name, None).nccl
    assert s.nvlink_channels == ()
    # a node where only GPUs 0 and 1 share NVLinks: the other ring pairs are not judged
    (s,) = sample_file(tmp_path, name, ((GPUS[0], GPUS[1], 18),)).nccl
    assert s.nvlink_channels == ((GPUS[0], GPUS[1], "SHM", 4),)


def split_by_process(text: str) -> dict[str, list[str]]:
    """The lines of one recorded job, each given to the log of the process that printed it
    (ranks 0-1 in one pod, 2-3 in another: what two containers with two GPUs each write)."""
    out: dict[str, list[str]] = {"a": [], "b": []}
    pids: list[int] = []
    for line in text.splitlines():
        parsed = parse_nccl_line(line)
        if parsed is None or parsed.pid is None:
            continue
        if parsed.pid not in pids:
            pids.append(parsed.pid)
        out["a" if parsed.dev in (0, 1) else "b"].append(line)
    return out


def test_two_containers_on_one_node_are_judged_together(
    tmp_path: Path, nvlinks: tuple[tuple[str, str, int], ...]
) -> None:
    # the mission's case: each container sees only its own ranks' lines; the pair that joins
    # a rank of one to a rank of the other is judged from both logs' Init START lines
    parts = split_by_process((NCCL / "nccl-2.28.9-h100x4-ddp-socket.log").read_text())
    pods = tmp_path / "pods"
    for pod, lines in parts.items():
        d = pods / f"training_llm-{pod}_{pod}{UID[1:]}" / "trainer"
        d.mkdir(parents=True)
        (d / "0.log").write_text(
            "".join(f"2026-11-26T14:29:30.0Z stdout F {line}\n" for line in lines)
        )
    settings = ThroughputSettings(pod_logs=str(pods), pods="all")
    snap = ThroughputSampler(settings, nvlinks=lambda: nvlinks).sample()
    by_pod = {s.pod: s.nvlink_channels for s in snap.nccl}
    # each pod's own lines: its channel lines name both ranks; the other rank's GPU comes
    # from the other pod's Init START
    assert by_pod["llm-a"] == (
        (GPUS[0], GPUS[1], "NET/Socket", 4),
        (GPUS[0], GPUS[3], "NET/Socket", 2),
        (GPUS[1], GPUS[2], "NET/Socket", 2),
    )
    assert by_pod["llm-b"] == (
        (GPUS[0], GPUS[3], "NET/Socket", 2),
        (GPUS[1], GPUS[2], "NET/Socket", 2),
        (GPUS[2], GPUS[3], "NET/Socket", 4),
    )


def test_a_plain_file_vouches_for_a_pair_only_on_one_host(
    tmp_path: Path, nvlinks: tuple[tuple[str, str, int], ...]
) -> None:
    # a Slurm job's output file can hold every node's lines: ranks whose Init START lines
    # name different hosts are not taken for GPUs of this node (the recorded lines, with the
    # host of ranks 2 and 3 renamed as another node's would read)
    text = (NCCL / "nccl-2.28.9-h100x4-ddp-shm.log").read_text()
    other = [
        line.replace("vm:", "vm2:", 1)
        if (p := parse_nccl_line(line)) is not None and p.dev in (2, 3)
        else line
        for line in text.splitlines()
    ]
    path = tmp_path / "job.log"
    path.write_text("\n".join(other) + "\n")
    settings = ThroughputSettings(files=(ThroughputFile(str(path), "x"),), pod_logs="/none")
    (s,) = ThroughputSampler(settings, nvlinks=lambda: nvlinks, once=True).sample().nccl
    assert s.nvlink_channels == ((GPUS[0], GPUS[1], "SHM", 4), (GPUS[2], GPUS[3], "SHM", 4))


def test_rank_state_is_bounded() -> None:
    run = NcclRun()
    for i in range(MAX_COMM_RANKS + 500):
        line = (
            f"h:{i}:{i} [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank {i} nranks 9999 "
            f"cudaDev 0 nvmlDev 0 busId 60 commId 0x{i:x} - Init START"
        )
        parsed = parse_nccl_line(line)
        assert parsed is not None
        run.feed(parsed, None)
        for peer in range(3):
            ch = parse_nccl_line(
                f"h:{i}:{i} [0] NCCL INFO Channel 0{peer} : {i}[0] -> {peer}[1] via SHM/direct"
            )
            assert ch is not None
            run.feed(ch, None)
    assert len(run.comm_gpus) == MAX_COMM_RANKS
    assert len(run.rank_channels) <= MAX_RANK_CHANNELS


SNAPSHOT = ROOT / "tests" / "fixtures" / "snapshots" / "h100x4.tar.gz"


@pytest.mark.parametrize(
    ("name", "transport", "per_pair", "findings_n"),
    [
        ("nccl-2.28.9-h100x4-ddp-shm.log", "SHM", 4, 4),
        ("nccl-2.28.9-h100x4-ddp-p2p.log", "P2P/CUMEM", 24, 0),
    ],
)
def test_the_agent_on_the_recorded_machine_and_its_recorded_job(
    tmp_path: Path, name: str, transport: str, per_pair: int, findings_n: int
) -> None:
    """``fabricscope agent --once`` replaying the snapshot of the same lent 4x H100 (its sysfs
    and its NVML recording, taken by ``fabricscope snapshot``) and reading the job's log: the
    NVLink pairs come from the replayed NVML, the channels from the real lines."""
    from tests.agentrun import fabricscope
    from tests.promharness import promtool_check_metrics

    res = fabricscope(
        [
            "agent",
            "--once",
            f"--snapshot={SNAPSHOT}",
            f"--throughput.file={NCCL / name}=ddp",
            "--log.level=error",
        ]
    )
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("fabricscope_nccl_nvlink_")]
    want = sorted(
        f'fabricscope_nccl_nvlink_peer_channels{{container="",job_name="ddp",namespace="",'
        f'pci_bus_id="{a}",peer_pci_bus_id="{b}",pod="",transport="{transport}"}} {per_pair}.0'
        for a, b in RING
    )
    assert sorted(lines) == want
    assert f'fabricscope_findings{{kind="nccl_nvlink_bypassed"}} {findings_n}.0' in res.stdout
    promtool_check_metrics(res.stdout)
