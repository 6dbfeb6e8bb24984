"""NCCL's own lines through the throughput sampler, end to end: container logs in the
kubelet's layout (CRI format) whose messages are real NCCL lines (tests/fixtures/nccl-logs),
a restarted container whose next run chose another transport, hostile lines at the tailer's
bound, and ``fabricscope agent --once --throughput.file`` linted by promtool."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.config import ThroughputSettings
from agent.throughput.records import WARNING_KINDS, NcclSeries, ThroughputSnapshot
from agent.throughput.sampler import ThroughputSampler
from exporter.metrics.spec import Families
from exporter.metrics.throughput import render
from tests.agentrun import throughput_once
from tests.promharness import promtool_check_metrics

ROOT = Path(__file__).resolve().parents[2]
NCCL = ROOT / "tests" / "fixtures" / "nccl-logs"
UID = "6f0e2a9c-25aa-4c43-8d6c-6a3a8f2f11aa"


def cri(msg: str, ts: str = "2026-11-20T10:00:00.5Z") -> str:
    return f"{ts} stdout F {msg}\n"


def log_of(root: Path, n: int = 0) -> Path:
    d = root / f"training_llm-0_{UID}" / "trainer"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{n}.log"


def fixture_as_cri(name: str, ts: str = "2026-11-20T10:00:00.5Z") -> str:
    text = (NCCL / name).read_text(encoding="utf-8")
    return "".join(cri(line, ts) for line in text.splitlines())


def only(snap: ThroughputSnapshot) -> NcclSeries:
    (s,) = snap.nccl
    return s


def sampler(pod_logs: Path) -> ThroughputSampler:
    return ThroughputSampler(ThroughputSettings(pod_logs=str(pod_logs), pods="all"))


def test_container_log_gives_transports_hcas_and_init_time(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    log_of(pods).write_text(
        fixture_as_cri("nccl-2.2x-sglang-4289.log")
        + fixture_as_cri("nccl-2.2x-ibext_v8-nccl-1814.log", "2026-11-20T10:00:07Z")
        + cri("\t Train throughput/tokens_per_sec: 55803.1245", "2026-11-20T10:05:00Z")
    )
    snap = sampler(pods).sample()
    s = only(snap)
    assert (s.namespace, s.pod, s.container) == ("training", "llm-0", "trainer")
    assert s.channels == (("NET/IB", False, 6), ("NET/IB", True, 5), ("P2P/IPC", False, 4))
    # the second list (mlx5_bond_*) was printed last: the IBext_v8 channels map through it
    assert dict(s.hca_channels) == {
        "mlx5_0": 3,
        "mlx5_2": 2,
        "mlx5_bond_4": 2,
        "mlx5_bond_5": 1,
        "mlx5_bond_6": 1,
        "mlx5_bond_7": 1,
        "mlx5_bond_8": 1,
    }
    assert s.inits == 3 and s.last_init_timestamp_seconds == pytest.approx(1795168807.0)
    assert dict(s.warnings)["ib_completion"] == 2
    assert s.ib_errors == (("retry_exc_err", "129", 1), ("wr_flush_err", "249", 1))
    # the NCCL lines are not throughput lines; the Composer line still is
    (tp,) = snap.series
    assert tp.tokens_per_second == 55803.1245 and tp.lines_parsed == 1


def test_restarted_container_is_a_new_run(tmp_path: Path) -> None:
    """The previous run's channels ran over IB with GPUDirect RDMA; the container restarts
    and its next run's NCCL finds no IB device and falls back to sockets: the channel gauges
    describe the new run only, the warning counters carry on."""
    pods = tmp_path / "pods"
    s = sampler(pods)
    log_of(pods).write_text(
        fixture_as_cri("nccl-2.2x-sglang-4289.log") + fixture_as_cri("nccl-2.18-nccl-928.log")
    )
    first = only(s.sample())
    assert ("NET/IB", True, 5) in first.channels
    assert dict(first.warnings)["ib_completion"] == 3
    log_of(pods, 1).write_text(
        fixture_as_cri("nccl-2.19.3-nccl-1267.log")
        + fixture_as_cri("nccl-2.18.3-nccl-tests-166.log")
    )
    second = only(s.sample())
    assert second.channels == (("NET/Socket", False, 6), ("SHM", False, 3))
    assert second.hca_channels == ()
    assert second.version == "2.18.3"
    assert dict(second.warnings)["ib_completion"] == 3  # a counter: never goes back


def test_render_follows_the_catalog(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    log_of(pods).write_text(fixture_as_cri("nccl-2.2x-sglang-4289.log"))
    out = Families()
    render(sampler(pods).sample(), out)
    fams = {spec.name: dict(samples) for spec, samples in out.items()}
    j = ("training", "llm-0", "trainer", "")
    assert fams["fabricscope_nccl_channels"] == {
        (*j, "NET/IB", "1"): 5.0,
        (*j, "P2P/IPC", "0"): 4.0,
    }
    assert fams["fabricscope_nccl_hca_channels"] == {(*j, "mlx5_0"): 3.0, (*j, "mlx5_2"): 2.0}
    assert set(fams["fabricscope_nccl_warnings_total"]) == {(*j, k) for k in WARNING_KINDS}
    assert fams["fabricscope_nccl_lines_total"] == {j: 11.0}  # with the Init START line
    assert "fabricscope_nccl_info" not in fams  # this excerpt has no version line


def test_hostile_nccl_lines_in_a_container_log(tmp_path: Path) -> None:
    """Lines at and over the tailer's bound, NCCL markers repeated, invalid UTF-8: the pass
    completes, the real lines around them still count, nothing else is invented."""
    pods = tmp_path / "pods"
    path = log_of(pods)
    with path.open("wb") as f:
        f.write(cri("NCCL INFO Channel 00 : " * 40_000).encode())  # ~ 920 KB, under the bound
        f.write(cri("x" * (1 << 20) + " NCCL WARN socketProgress").encode())  # over: skipped
        f.write(
            b"2026-11-20T10:00:00.5Z stdout F h:7:7 [0] NCCL INFO NET/IB : Using [0]ml\xffx:1/IB\n"
        )
        f.write(cri("h:7:7 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0").encode())
        f.write(
            cri(
                "h:7:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA"
            ).encode()
        )
    snap = ThroughputSampler(
        ThroughputSettings(pod_logs=str(pods), pods="all", max_line_bytes=1 << 20), once=True
    ).sample()
    s = only(snap)
    assert s.channels == (("NET/IB", True, 1),)
    assert s.hca_channels == (("mlx5_0", 1),)
    errors = dict(snap.errors_total)
    assert errors["line_too_long"] == 1 and errors["invalid_utf8"] == 1


def test_once_on_a_plain_file_lints(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    shutil.copy(NCCL / "nccl-2.2x-ibext_v8-nccl-1814.log", log)
    proc = throughput_once([f"{log}=llm"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    promtool_check_metrics(proc.stdout)
    assert (
        'fabricscope_nccl_channels{container="",gdr="0",job_name="llm",namespace="",pod="",'
        'transport="NET/IB"} 6' in proc.stdout
    )
    assert (
        'fabricscope_nccl_ib_completion_errors_total{container="",job_name="llm",namespace="",'
        'pod="",status="retry_exc_err",vendor_error="129"} 1' in proc.stdout
    )
    assert 'fabricscope_nccl_communicator_inits_total{container="",job_name="llm"' in proc.stdout


def test_nccl_lines_are_parsed_in_the_supervised_child(tmp_path: Path) -> None:
    """The agent reads and parses logs in the throughput sampler's child process
    (agent.core.isolation): the NCCL series come back with the snapshot, equal to the ones
    parsed in process, and a restart seen by the same child starts a new run."""
    from agent.throughput.child import isolated_sampler
    from agent.throughput.records import ThroughputInputs

    pods = tmp_path / "pods"
    log_of(pods).write_text(fixture_as_cri("nccl-2.2x-sglang-4289.log"))
    inputs = ThroughputInputs(frozenset({("training", "llm-0")}), None)
    settings = ThroughputSettings(pod_logs=str(pods))
    child = isolated_sampler(settings, 10.0, lambda: inputs)
    try:
        snap = child.sample()
        local = ThroughputSampler(settings, gpu_pods=lambda: inputs.gpu_pods).sample()
        assert snap.nccl == local.nccl
        assert only(snap).channels == (("NET/IB", True, 5), ("P2P/IPC", False, 4))
        log_of(pods, 1).write_text(fixture_as_cri("nccl-2.18.3-nccl-tests-166.log"))
        assert only(child.sample()).channels == (("NET/Socket", False, 6), ("SHM", False, 3))
        # the NUMA map travels with the inputs: the child judges each GPU's HCAs
        inputs = ThroughputInputs(frozenset({("training", "llm-0")}), None, NUMA_1814)
        log_of(pods, 2).write_text(fixture_as_cri("nccl-2.2x-ibext_v8-nccl-1814.log"))
        assert only(child.sample()).hca_numa == (("mlx5_bond_4", 2, 0), ("mlx5_bond_8", 1, 1))
    finally:
        child.close()


# --- which HCA each GPU's channels use: the NUMA judgement ---------------------------------

#: nccl#1814's node as the NUMA map would have it on a two-socket server (GPU 0 at 18:00.0 on
#: node 0, GPU 4 at 9b:00.0 on node 1): mlx5_bond_4 next to GPU 4, mlx5_bond_8 on node 1
#: while GPU 0 is on node 0. Only the layout is assumed here; the lines are real.
NUMA_1814 = (("0000:18:00.0", 0), ("0000:9b:00.0", 1), ("mlx5_bond_4", 1), ("mlx5_bond_8", 1))


def test_channels_through_an_hca_off_their_gpus_numa_node(tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    log_of(pods).write_text(fixture_as_cri("nccl-2.2x-ibext_v8-nccl-1814.log"))
    settings = ThroughputSettings(pod_logs=str(pods), pods="all")
    snap = ThroughputSampler(settings, numa=lambda: NUMA_1814).sample()
    s = only(snap)
    assert s.gpu_hca_channels == (
        ("0000:18:00.0", "mlx5_bond_8", 1),
        ("0000:9b:00.0", "mlx5_bond_4", 2),
    )
    assert s.hca_numa == (("mlx5_bond_4", 2, 0), ("mlx5_bond_8", 1, 1))
    out = Families()
    render(snap, out)
    fams = {spec.name: dict(samples) for spec, samples in out.items()}
    j = ("training", "llm-0", "trainer", "")
    assert fams["fabricscope_nccl_hca_channels_off_gpu_numa"] == {
        (*j, "mlx5_bond_4"): 0.0,
        (*j, "mlx5_bond_8"): 1.0,
    }
    # no NUMA map (no PCI/InfiniBand sampler), or a node the platform does not report: not
    # judged, so no series (absent, never a 0 that would say "local")
    for numa in (None, (("0000:9b:00.0", 1), ("mlx5_bond_8", 1))):
        snap = ThroughputSampler(settings, numa=lambda numa=numa: numa).sample()
        assert only(snap).hca_numa == ()
        out = Families()
        render(snap, out)
        assert "fabricscope_nccl_hca_channels_off_gpu_numa" not in {
            spec.name for spec, _ in out.items()
        }


def test_the_numa_map_comes_from_the_pci_and_infiniband_samplers(dgx_sys_root: Path) -> None:
    """On the DGX-class tree (real H100 + ConnectX-7 layout): every GPU and RDMA device
    with the NUMA node sysfs gives it, and a judgement of that tree's GPU 0 and its NICs."""
    from agent.core.sysfs import SysfsReader
    from agent.infiniband.sampler import InfinibandSampler
    from agent.pci.sampler import PciSampler
    from agent.samplers import numa_nodes
    from agent.throughput.nccl_join import hca_numa

    pci = PciSampler(SysfsReader(dgx_sys_root)).sample()
    ib = InfinibandSampler(SysfsReader(dgx_sys_root)).sample()
    numa = dict(numa_nodes(pci, ib) or ())
    gpus = {d.address: d.numa_node for d in pci.by_role("gpu")}
    assert {a: numa[a] for a in gpus} == gpus and set(gpus.values()) == {0, 1}
    assert {d.name: numa[d.name] for d in ib.devices} == {d.name: d.numa_node for d in ib.devices}
    assert numa_nodes(None, None) is None
    gpu0 = min(gpus)
    local = sorted(d.name for d in ib.devices if d.numa_node == gpus[gpu0])
    remote = sorted(d.name for d in ib.devices if d.numa_node != gpus[gpu0])
    assert local and remote
    pairs = {(gpu0, local[0]): 3, (gpu0, remote[0]): 2}
    assert hca_numa(pairs, numa) == tuple(sorted(((local[0], 3, 0), (remote[0], 2, 2))))


def test_an_agent_started_mid_job_keeps_the_transports_from_the_logs_head(tmp_path: Path) -> None:
    """A DaemonSet rollout restarts the agent while a job runs: its log already holds the
    init lines and 2 MiB of training output after them. The head (first MiB) still gives the
    transports, HCAs and GPUs; its WARN lines move no counter (history: a counter that jumps
    at an agent's start would read as a burst); a warning written after the start counts."""
    pods = tmp_path / "pods"
    log = log_of(pods)
    filler = cri("\t Train throughput/tokens_per_sec: 55803.1245") * ((2 << 20) // 70)
    log.write_text(fixture_as_cri("nccl-2.2x-ibext_v8-nccl-1814.log") + filler)
    assert log.stat().st_size > 2 << 20
    settings = ThroughputSettings(pod_logs=str(pods), pods="all")
    sampler = ThroughputSampler(settings, numa=lambda: NUMA_1814)
    s = only(sampler.sample())
    assert s.channels == (("NET/IB", False, 6),)
    assert s.hca_numa == (("mlx5_bond_4", 2, 0), ("mlx5_bond_8", 1, 1))
    assert dict(s.warnings)["ib_completion"] == 0 and s.inits == 0 and s.lines == 0
    with log.open("a") as f:
        f.write(
            cri(
                "hostname-test:984:1357 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion "
                "from peer 172.36.143.59<44206> with status=12 opcode=129 len=65536 vendor err "
                "129 (Recv) localGid ::ffff:29.87.88.182 remoteGids::ffff:29.87.4.221"
            )
        )
    s = only(sampler.sample())
    assert dict(s.warnings)["ib_completion"] == 1 and s.lines == 1
    assert s.channels == (("NET/IB", False, 6),)  # the head is not read again
