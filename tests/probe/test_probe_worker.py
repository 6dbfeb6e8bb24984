"""The probe worker: real worker processes, gloo over 127.0.0.1, and its pure helpers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from agent.probe.measure import worker
from agent.probe.measure.launch import free_port, run_local, worker_env
from agent.probe.measure.records import (
    CPU_DEFAULT_SIZES,
    ProbeRecord,
    WorkerSpec,
    parse_records,
    spec_to_json,
    to_json,
)

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "127.0.0.1"
# bounded waits: torch import ~1 s, gloo init ~0.1 s; generous for a loaded 2-core CI box
WALL_LIMIT = 60.0


def spec(kind: str = "all_reduce", world_size: int = 2, **changes: object) -> WorkerSpec:
    base = WorkerSpec(
        kind=kind,
        rank=0,
        world_size=world_size,
        master_addr=LOCAL,
        master_port=0,
        backend="gloo",
        warmup=2,
        iterations=5,
        timeout_seconds=10.0,
        peer="peer-b",
        src="here:0",
        dst="peer-b:0",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def run_worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.probe.measure.worker", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WALL_LIMIT,
        check=False,
    )


def assert_good(rec: ProbeRecord, world_size: int, factor: float) -> None:
    assert rec.error is None
    assert rec.correct is True
    assert rec.world_size == world_size
    assert rec.backend == "gloo"
    assert rec.ranks == tuple((rec.ranks[0][0], None) for _ in range(world_size))
    assert rec.time_seconds is not None
    assert rec.time_seconds > 0
    alg = rec.algbw_bytes_per_second
    assert alg == pytest.approx(rec.size_bytes / rec.time_seconds)
    assert alg is not None
    assert rec.busbw_bytes_per_second == pytest.approx(alg * factor)
    assert (rec.peer, rec.src, rec.dst) == ("peer-b", "here:0", "peer-b:0")


# --- real probes over gloo ---------------------------------------------------------------


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_reduce_is_correct_with_nccl_tests_busbw(world_size: int) -> None:
    records = run_local(spec(world_size=world_size), world_size)
    assert [r.size_bytes for r in records] == list(CPU_DEFAULT_SIZES)  # gloo defaults
    for rec in records:
        assert_good(rec, world_size, 2 * (world_size - 1) / world_size)
        assert (rec.kind, rec.iterations, rec.warmup) == ("all_reduce", 5, 2)


def test_sendrecv_exchanges_and_checks_both_ways() -> None:
    records = run_local(spec("sendrecv", sizes=(4096, 256 << 10)), 2)
    assert [r.size_bytes for r in records] == [4096, 256 << 10]
    for rec in records:
        assert rec.kind == "sendrecv"
        assert_good(rec, 2, 1.0)


def test_latency_is_a_mean_time_of_an_eight_byte_all_reduce() -> None:
    (rec,) = run_local(spec("latency", iterations=50), 2)
    assert (rec.kind, rec.size_bytes, rec.correct, rec.error) == ("latency", 8, True, None)
    assert rec.time_seconds is not None
    assert 0 < rec.time_seconds < 1.0
    assert rec.algbw_bytes_per_second is None
    assert rec.busbw_bytes_per_second is None


@pytest.mark.parametrize("kind", ["all_reduce", "sendrecv"])
def test_corrupted_data_is_a_wrong_result(kind: str) -> None:
    env = {**os.environ, worker.CORRUPT_ENV: "1"}
    records = run_local(spec(kind, sizes=(4096, 65536)), 2, env=env)
    assert [r.size_bytes for r in records] == [4096, 65536]
    # rank 1 puts 3 instead of 2: every element of both ranks' sums is off; in sendrecv
    # every element rank 0 receives is off, and none of what rank 1 receives
    ranks_off = 2 if kind == "all_reduce" else 1
    for rec in records:
        assert rec.correct is False
        assert rec.error is not None
        assert rec.error.reason == "wrong_result"
        assert rec.error.detail.startswith(f"{rec.size_bytes // 4 * ranks_off} of")
        assert rec.time_seconds is not None  # the measurement itself ran


def tcp_listeners(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            addr, _, hex_port = cols[1].partition(":")
            if cols[3] == "0A" and int(hex_port, 16) == port:
                found.add(addr)
    return found


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_alone_records_peer_unreachable_within_the_timeout(
    rank: int, tmp_path: Path
) -> None:
    # rank 0 waits for a rank 1 that never starts; rank 1 dials a rank 0 that is not there
    spec_file = tmp_path / "spec.json"
    port = free_port()
    spec_file.write_text(
        spec_to_json(spec(rank=rank, master_port=port, timeout_seconds=2.0, sizes=(4096, 8192)))
    )
    began = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.probe.measure.worker", "--spec-file", str(spec_file)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    listeners: set[str] = set()
    while rank == 0 and not listeners and proc.poll() is None:
        listeners = tcp_listeners(port)  # rank 0's store, while it waits for rank 1
        if time.monotonic() - began > WALL_LIMIT:
            proc.kill()
        time.sleep(0.02)
    out, err = proc.communicate(timeout=WALL_LIMIT)
    elapsed = time.monotonic() - began
    # the store listens on master_addr (127.0.0.1) only, not on every interface
    assert listeners == ({"0100007F"} if rank == 0 else set())
    assert proc.returncode == 0, err
    records, problems = parse_records(out)
    assert problems == []
    assert [r.size_bytes for r in records] == [4096, 8192]
    for rec in records:
        assert rec.reason == "peer_unreachable"
        assert (rec.correct, rec.time_seconds, rec.ranks) == (None, None, ())
    assert 2.0 <= elapsed < 20.0


def test_a_peer_that_leaves_mid_probe_fails_the_rest() -> None:
    # rank 1 only knows the first size: it finishes, tears down and exits while rank 0
    # starts the second size
    port = free_port()
    both = spec(master_port=port, timeout_seconds=5.0, sizes=(4096, 8192, 16384))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "agent.probe.measure.worker", "--spec", spec_to_json(s)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in (both, replace(both, rank=1, sizes=(4096,)))
    ]
    outs = [p.communicate(timeout=WALL_LIMIT) for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    records, problems = parse_records(outs[0][0])
    assert problems == []
    assert [r.size_bytes for r in records] == [4096, 8192, 16384]
    assert records[0].correct is True
    assert {r.reason for r in records[1:]} <= {"peer_unreachable", "timeout"}
    assert records[1].reason == records[2].reason
    assert records[2].error is not None
    assert records[2].error.detail.startswith("not measured after an earlier failure")


def test_sizes_above_the_memory_bound_are_refused_without_allocating() -> None:
    # 1 TiB could not be allocated here at all: an init_failure record, not gpu_busy, shows
    # nothing was tried; and rank 0 alone returns at once: no rendezvous was attempted
    huge = spec(sizes=(1 << 40,), timeout_seconds=30.0, master_port=free_port())
    began = time.monotonic()
    done = run_worker("--spec", spec_to_json(huge))
    assert time.monotonic() - began < 15.0
    assert done.returncode == 0, done.stderr
    (rec,), problems = parse_records(done.stdout)
    assert problems == []
    assert rec.reason == "init_failure"
    assert rec.error is not None
    assert "above max_memory_bytes 1073741824 B; not allocated" in rec.error.detail

    mixed = run_local(spec(sizes=(4096, 1 << 20), max_memory_bytes=1 << 20), 2)
    assert [(r.size_bytes, r.reason) for r in mixed] == [(4096, None), (1 << 20, "init_failure")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--spec", "{"], "invalid spec: spec is not JSON"),
        (["--spec", '{"kind":"all_reduce"}'], "missing spec field(s): rank, world_size"),
        (
            ["--spec", spec_to_json(spec(master_port=1)).replace('"rank":0', '"rank":5')],
            "rank 5 is not in [0, world_size)",
        ),
        (["--spec", spec_to_json(spec())], "master_port 0"),
        (["--spec-file", "/nonexistent/spec.json"], "No such file"),
        ([], "one of the arguments --spec --spec-file is required"),
    ],
)
def test_a_malformed_spec_is_a_usage_error(args: list[str], message: str) -> None:
    done = run_worker(*args)
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stdout == ""


# --- run_local when workers die or hang (no torch needed) --------------------------------


def test_run_local_records_a_crashed_worker(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    fake.chmod(0o755)
    records = run_local(spec(sizes=(4096, 8192)), 2, python=str(fake))
    assert [(r.size_bytes, r.reason, r.backend) for r in records] == [
        (4096, "crashed", "gloo"),
        (8192, "crashed", "gloo"),
    ]
    assert records[0].error is not None
    # Both ranks crash at once; the record names whichever the launcher saw exit first.
    assert re.fullmatch(
        r"worker rank [01] exited with code 139: Segmentation fault", records[0].error.detail
    ), records[0].error.detail


def test_run_local_names_the_rank_that_crashed(tmp_path: Path) -> None:
    # Rank 1 dies, rank 0 would wait for it forever: the record names rank 1, and rank 0
    # is stopped without waiting for the deadline.
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        "case \"$*\" in *'\"rank\":1,'*) echo 'NCCL WARN bad' >&2; exit 134;; esac\n"
        "exec sleep 60\n"
    )
    fake.chmod(0o755)
    began = time.monotonic()
    records = run_local(spec(sizes=(4096,)), 2, python=str(fake), deadline_seconds=30.0)
    assert time.monotonic() - began < 10.0
    assert [(r.size_bytes, r.reason) for r in records] == [(4096, "crashed")]
    assert records[0].error is not None
    assert records[0].error.detail == "worker rank 1 exited with code 134: NCCL WARN bad"


def test_run_local_kills_workers_at_the_deadline(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    began = time.monotonic()
    records = run_local(spec("latency"), 2, python=str(fake), deadline_seconds=0.5)
    assert time.monotonic() - began < 10.0
    assert [(r.size_bytes, r.reason) for r in records] == [(8, "timeout")]


def test_run_local_keeps_what_rank_0_printed_before_it_died(tmp_path: Path) -> None:
    good = worker.measured_record(
        spec(), "gloo", 4096, time_seconds=1e-3, mismatches=0, ranks=(("h", None),) * 2
    )
    fake = tmp_path / "python"
    line = to_json(good)
    fake.write_text(f"#!/bin/sh\necho '{line}'\necho '{line[:20]}'\nexit 1\n")
    fake.chmod(0o755)
    records = run_local(spec(sizes=(4096, 8192)), 2, python=str(fake))
    assert records[0] == good
    assert (records[1].size_bytes, records[1].reason) == (8192, "crashed")


# --- the worker's promises about its environment -----------------------------------------


def test_the_agent_side_of_the_probe_never_imports_torch() -> None:
    code = (
        "import sys, agent.probe, agent.probe.measure.records, agent.probe.measure.formulas, "
        "agent.probe.measure.worker;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_resident_agent_never_imports_matplotlib() -> None:
    """matplotlib is the matrix command's (the heatmap): the agent's modules, the probe
    service, the CLI module and the exporter load without it."""
    code = (
        "import sys, agent.probe.sampler, agent.probe.render.matrix, agent.probe.render.heatmap,"
        " exporter.cli.main, exporter.cli.probe, exporter.app;"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_library_prints_go_to_stderr_not_between_records() -> None:
    code = (
        "from agent.probe.measure.worker import _records_stream;"
        "out = _records_stream(); print('NCCL INFO noise', flush=True);"
        "out.write('record\\n'); out.flush()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "record\n"
    assert "NCCL INFO noise" in done.stderr


def test_nccl_env_defaults_are_set_but_never_override() -> None:
    env = {"NCCL_NVLS_ENABLE": "1", "NCCL_BUFFSIZE": "4194304"}
    worker.apply_env_defaults(env)
    assert env == {
        "NCCL_NVLS_ENABLE": "1",
        "NCCL_BUFFSIZE": "4194304",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    fresh: dict[str, str] = {}
    worker.apply_env_defaults(fresh)
    assert fresh["NCCL_BUFFSIZE"] == "2097152"  # the memory-bound default
    child = worker_env({"PYTHONPATH": "/x"}, "gloo")
    assert child["NCCL_NVLS_ENABLE"] == "0"
    assert child["PYTHONPATH"] == f"{ROOT}{os.pathsep}/x"


# --- pure helpers -------------------------------------------------------------------------


INIT_FAILURES = [
    # (exception class names, message, reason); messages as torch 2.13 / gloo word them
    (
        {"DistStoreError"},
        "Timed out after 3 seconds waiting for clients. 1/2 clients joined.",
        "peer_unreachable",
    ),
    (
        {"DistNetworkError"},
        "The client socket has timed out after 2000ms while trying to connect to (a, 1).",
        "peer_unreachable",
    ),
    (
        {"DistBackendError"},
        "NCCL error in: ProcessGroupNCCL.cpp:1, unhandled cuda error",
        "init_failure",
    ),
    ({"RuntimeError"}, "CUDA error: invalid device ordinal", "init_failure"),
]
RUN_FAILURES = [
    (
        {"RuntimeError"},
        "[unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete",
        "timeout",
    ),
    (
        {"RuntimeError"},
        "[pair.cc:553] Connection closed by peer [127.0.0.1]:35548.",
        "peer_unreachable",
    ),
    (
        {"OutOfMemoryError", "RuntimeError"},
        "CUDA out of memory. Tried to allocate 1 GiB",
        "gpu_busy",
    ),
    ({"DistBackendError"}, "NCCL error: unhandled system error", "crashed"),
    # NCCL called directly (agent.probe.measure.nccl.NcclError)
    (
        {"NcclError"},
        "ncclGroupEnd: ncclRemoteError: peer 1 closed the connection",
        "peer_unreachable",
    ),
    ({"NcclError"}, "ncclAllReduce: ncclUnhandledCudaError", "crashed"),
]


@pytest.mark.parametrize(("names", "message", "reason"), INIT_FAILURES)
def test_init_reason(names: set[str], message: str, reason: str) -> None:
    assert worker.init_reason(frozenset(names), message) == reason


@pytest.mark.parametrize(("names", "message", "reason"), RUN_FAILURES)
def test_run_reason(names: set[str], message: str, reason: str) -> None:
    assert worker.run_reason(frozenset(names), message) == reason


def test_init_method_brackets_ipv6() -> None:
    assert worker.init_method("10.0.0.1", 29500) == "tcp://10.0.0.1:29500"
    assert worker.init_method("fd00::1", 29500) == "tcp://[fd00::1]:29500"


def test_rank_identity_is_fixed_size_and_round_trips() -> None:
    for host, device in [("node-a", 3), ("n", None), ("x" * 1000, 7), ("h\u00e9", 0)]:
        data = worker.encode_rank(host, device)
        assert len(data) == worker.RANK_ID_BYTES
        got_host, got_device = worker.decode_rank(data)
        assert host.startswith(got_host)
        assert got_device == device
    with pytest.raises(ValueError):
        worker.decode_rank(b'["a", true]'.ljust(worker.RANK_ID_BYTES, b"\0"))


def test_measured_record_applies_the_formulas_and_the_check() -> None:
    ranks = (("a", 0), ("b", 1), ("c", 2), ("d", 3))
    good = worker.measured_record(
        spec(world_size=4), "nccl", 1 << 20, time_seconds=1e-4, mismatches=0, ranks=ranks
    )
    assert good.algbw_bytes_per_second == pytest.approx((1 << 20) / 1e-4)
    assert good.busbw_bytes_per_second == pytest.approx((1 << 20) / 1e-4 * 1.5)
    bad = worker.measured_record(
        spec("sendrecv", world_size=4),
        "nccl",
        1 << 20,
        time_seconds=1e-4,
        mismatches=5,
        ranks=ranks,
    )
    assert (bad.correct, bad.reason) == (False, "wrong_result")
    assert bad.busbw_bytes_per_second == bad.algbw_bytes_per_second
    lat = worker.measured_record(
        spec("latency"), "gloo", 8, time_seconds=2e-5, mismatches=0, ranks=()
    )
    assert (lat.time_seconds, lat.algbw_bytes_per_second, lat.correct) == (2e-5, None, True)


def test_oversize_detail() -> None:
    assert worker.oversize_detail(1 << 30, 2 << 30) is None
    detail = worker.oversize_detail((1 << 30) + 4, 2 << 30)
    assert detail is not None
    assert "needs 2147483656 B (two buffers)" in detail
