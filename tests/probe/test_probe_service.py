"""The probe service: two agents probing each other over gloo on loopback (127.0.0.1 and
127.0.0.2, one port), intra-node probes, failures (a silent peer, a guest killed mid-collective,
a wrong secret), safety (busy GPUs, GPU locks, the budget), ageing, the launcher's process
group kill, and the rendered metrics with exact values."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from agent.config import ProbeSettings
from agent.core.errors import ConfigError
from agent.kubernetes.allocation import UNKNOWN_REASONS, GpuAllocation
from agent.nvml.api import NvmlCallError
from agent.probe.measure.launch import WorkerRun, free_port, launch_workers
from agent.probe.measure.records import ProbeError, ProbeRecord, WorkerSpec
from agent.probe.measure.worker import measured_record
from agent.probe.rendezvous.server import RendezvousStats
from agent.probe.run.addresses import parse_hostport, probe_id, requested_slot
from agent.probe.run.budget import GpuBudget
from agent.probe.run.devices import GpuSlot, GpuViewSampler, NvmlBusyGpus, discover_slots
from agent.probe.run.results import SKIP_REASONS, ProbeRun, ProbeSnapshot
from agent.probe.run.service import ProbeService
from agent.probe.schedule.membership import StaticMembers
from exporter.metrics.exposition import render_text
from exporter.metrics.probe import render
from exporter.metrics.spec import Families

A, B = "127.0.0.1", "127.0.0.2"
SECRET = secrets.token_bytes(32)
CPU2 = (GpuSlot(0, None), GpuSlot(1, None))
WALL = 60.0  # bound on any wait here; a healthy run needs a few seconds


def fast(**changes: object) -> ProbeSettings:
    base = ProbeSettings(
        enabled=True,
        round_seconds=1.0,
        intra_seconds=0.0,
        timeout_seconds=20.0,
        sizes=(4096,),
        pair_kinds=("sendrecv",),
        iterations=3,
        warmup=1,
        max_age_seconds=3600.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def wait_for(what: str, pred: Callable[[], bool], timeout: float = WALL) -> float:
    began = time.monotonic()
    while not pred():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - began


def worker_children() -> list[psutil.Process]:
    """Probe workers this test process started and that still live (zombies are gone)."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if (
                proc.status() != psutil.STATUS_ZOMBIE
                and "agent.probe.measure.worker" in proc.cmdline()
            ):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


class Members:
    """A membership whose list the test changes."""

    def __init__(self, *hosts: str) -> None:
        self.hosts = tuple(sorted(hosts))

    def members(self) -> tuple[str, ...]:
        return self.hosts


class NoLaunch:
    def __call__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        deadline_seconds: float,
        abort: threading.Event | None = None,
    ) -> WorkerRun:
        raise AssertionError(f"no worker should start, got {specs[0].kind}")


class FakeLaunch:
    """Prints a correct record per size at once (no torch): for tests of bookkeeping."""

    def __init__(self) -> None:
        self.specs: list[WorkerSpec] = []

    def __call__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        deadline_seconds: float,
        abort: threading.Event | None = None,
    ) -> WorkerRun:
        self.specs.extend(specs)
        spec = specs[0]
        ranks = tuple(("h", None) for _ in range(spec.world_size))
        recs = tuple(
            measured_record(spec, "gloo", s, time_seconds=1e-3, mismatches=0, ranks=ranks)
            for s in spec.sizes
        )
        return WorkerRun(recs, 0.5)


@pytest.fixture
def make_service() -> Iterator[Callable[..., ProbeService]]:
    made: list[ProbeService] = []

    def make(node: str = A, **kw: object) -> ProbeService:
        kw.setdefault("settings", fast())
        kw.setdefault("backend", "gloo")
        kw.setdefault("slots", CPU2)
        settings = kw.pop("settings")
        svc = ProbeService(settings, node_id=node, **kw)  # type: ignore[arg-type]
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop()
    assert wait_for("workers to exit", lambda: not worker_children(), 10.0) < 10.0


def pair(make: Callable[..., ProbeService], **kw: object) -> tuple[ProbeService, ProbeService]:
    """Host A (started: its rendezvous listens) and guest B (not started: the test runs its
    rounds), both members, one port."""
    port = free_port(A)
    members = StaticMembers([A, B])
    host_kw = {k[5:]: v for k, v in kw.items() if k.startswith("host_")}
    guest_kw = {k[6:]: v for k, v in kw.items() if k.startswith("guest_")}
    host = make(A, secret=SECRET, members=members, listen=(A, port), **host_kw)
    guest = make(B, secret=SECRET, members=members, listen=(B, port), **guest_kw)
    host.start()
    return host, guest


def total(snap: ProbeSnapshot, collective: str, reason: str) -> int:
    return sum(n for c, r, n in snap.runs_total if (c, r) == (collective, reason))


def skipped(snap: ProbeSnapshot, reason: str) -> int:
    return dict(snap.skipped_total)[reason]


# --- end to end over gloo ---------------------------------------------------------------


def test_two_agents_measure_each_other_on_their_schedule(
    make_service: Callable[..., ProbeService],
) -> None:
    port = free_port(A)
    members = StaticMembers([A, B])
    a = make_service(A, secret=SECRET, members=members, listen=(A, port))
    b = make_service(B, secret=SECRET, members=members, listen=(B, port))
    a.start()
    b.start()

    def measured(svc: ProbeService, peer: str) -> bool:
        return any(r.peer == peer and r.reason is None for r in svc.snapshot().runs)

    wait_for("a sendrecv result on both sides", lambda: measured(a, B) and measured(b, A))
    for svc, peer in ((a, B), (b, A)):
        # one run per device pair measured so far: the rotation moves on every round
        run = next(r for r in svc.snapshot().runs if r.peer == peer and r.reason is None)
        assert run.collective == "sendrecv"
        # the guest picks a CPU slot by rotation and asks the host for the same one
        assert run.gpu == run.peer_gpu and run.gpu in ("0", "1")
        (rec,) = run.records
        assert (rec.size_bytes, rec.correct, rec.world_size) == (4096, True, 2)
        assert rec.ranks == ((A, None), (B, None))
        assert rec.busbw_bytes_per_second == rec.algbw_bytes_per_second  # sendrecv: x 1
        assert rec.busbw_bytes_per_second is not None and rec.busbw_bytes_per_second > 0
        assert rec.src.startswith(f"{svc.node_id}:") and rec.peer == peer
    snap = a.snapshot()
    assert snap.rendezvous is not None and snap.rendezvous.accepted_total >= 1
    assert snap.rendezvous.refused("auth_failure") == 0
    assert snap.members == 2
    assert snap.gpu_seconds_total > 0
    run = next(r for r in snap.runs if r.peer == B and r.reason is None)
    text = render_text(families(snap)).decode()
    labels = f'collective="sendrecv",gpu="{run.gpu}",peer="{B}",peer_gpu="{run.peer_gpu}"'
    assert f"fabricscope_probe_success{{{labels}}} 1.0" in text
    assert f'fabricscope_probe_busbw_bytes_per_second{{{labels},size_bytes="4096"}}' in text
    a.stop()
    b.stop()
    assert worker_children() == []


def test_two_agents_probe_while_500_idle_connections_press_on_the_rendezvous(
    make_service: Callable[..., ProbeService],
) -> None:
    """500 connections from 127.0.0.3 that send nothing and reconnect as soon as they are
    closed (tests/slowloris.py) hold at most their address's share of the host's pending
    slots; the guest at 127.0.0.2 still authenticates and the probe completes. (Before the
    per-address cap, 200 such connections made the host refuse others as too_many_pending.)"""
    port = free_port(A)
    members = StaticMembers([A, B])
    a = make_service(A, secret=SECRET, members=members, listen=(A, port))
    b = make_service(B, secret=SECRET, members=members, listen=(B, port))
    a.start()  # the host of the pair (lower address): its rendezvous listens now
    attacker = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "slowloris.py"),
            "--host",
            A,
            "--port",
            str(port),
            "--source",
            "127.0.0.3",
            "--idle",
            "500",
            "--trickle",
            "0",
            "--silent",
            "--duration",
            str(WALL),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None
        assert attacker.stdout.readline() == "ready\n"
        b.start()
        wait_for(
            "a sendrecv result on both sides",
            lambda: (
                any(r.peer == B and r.reason is None for r in a.snapshot().runs)
                and any(r.peer == A and r.reason is None for r in b.snapshot().runs)
            ),
        )
        stats = a.snapshot().rendezvous
        assert stats is not None
        assert stats.accepted_total >= 1
        assert stats.refused("too_many_pending") > 500  # the attack was on, and turned away
        assert stats.refused("auth_failure") == 0
    finally:
        attacker.terminate()
        attacker.wait(WALL)


def test_intra_node_all_reduce_over_three_gloo_ranks(
    make_service: Callable[..., ProbeService],
) -> None:
    svc = make_service(A, slots=tuple(GpuSlot(i, None) for i in range(3)))
    run = svc.run_intra()
    assert run is not None
    assert run.reason is None, run.records
    assert (run.collective, run.peer, run.gpu, run.peer_gpu) == ("all_reduce", "", "", "")
    (rec,) = run.records
    assert (rec.world_size, rec.correct, rec.backend) == (3, True, "gloo")
    alg, bus = rec.algbw_bytes_per_second, rec.busbw_bytes_per_second
    assert alg is not None and bus == pytest.approx(alg * 4 / 3)  # 2(n-1)/n
    snap = svc.snapshot()
    assert snap.runs == (run,)
    assert total(snap, "all_reduce", "ok") == 1
    # three ranks held for the run's wall time
    assert snap.gpu_seconds_total == pytest.approx(3 * run.duration_seconds)


# --- failures ---------------------------------------------------------------------------


def test_a_silent_peer_fails_by_timeout_and_the_next_round_still_runs(
    make_service: Callable[..., ProbeService],
) -> None:
    port = free_port(A)
    held: list[socket.socket] = []
    with socket.create_server((A, port)) as silent:
        silent.settimeout(0.2)
        stop = threading.Event()

        def accept_and_say_nothing() -> None:
            while not stop.is_set():
                try:
                    held.append(silent.accept()[0])
                except TimeoutError:
                    continue

        t = threading.Thread(target=accept_and_say_nothing, daemon=True)
        t.start()
        guest = make_service(
            B,
            settings=fast(timeout_seconds=2.0, round_seconds=0.5),
            secret=SECRET,
            members=StaticMembers([A, B]),
            listen=(B, port),
            launcher=NoLaunch(),
        )
        guest.start()
        took = wait_for(
            "two timed-out rounds", lambda: total(guest.snapshot(), "sendrecv", "timeout") >= 2
        )
        # read before the silent peer goes away: closing its connections resets the round
        # in flight, whose run ('unreachable') would then replace a timed-out one
        runs = guest.snapshot().runs  # one per device pair tried: the rotation moves on
        stop.set()
        t.join()
    for conn in held:
        conn.close()
    assert took < 2 * (2.0 + 0.5) + 3.0  # two rounds, each bounded by the 2 s timeout
    assert runs and {(r.peer, r.reason) for r in runs} == {(A, "timeout")}
    for run in runs:
        assert run.duration_seconds < 2.0 + 1.0
        assert run.records[0].error is not None
        assert "the peer sent nothing in time" in run.records[0].error.detail
    assert worker_children() == []


def test_a_guest_killed_mid_collective_fails_both_sides_within_the_timeout(
    make_service: Callable[..., ProbeService],
) -> None:
    # 1 MiB x 100000 sendrecv iterations: far longer than the test waits
    long = fast(sizes=(1 << 20,), iterations=100_000, warmup=0, timeout_seconds=30.0)
    host, guest = pair(make_service, host_settings=long, guest_settings=long)
    round_thread = threading.Thread(target=guest.run_pair_round, args=(7,), daemon=True)
    round_thread.start()

    def rank(r: int) -> psutil.Process | None:
        return next((p for p in worker_children() if f'"rank":{r},' in " ".join(p.cmdline())), None)

    wait_for("both ranks", lambda: rank(0) is not None and rank(1) is not None)
    victim = rank(1)
    assert victim is not None

    def collective_running() -> bool:  # the store connection plus gloo's own pair connection
        try:
            return len([c for c in victim.net_connections("tcp") if c.status == "ESTABLISHED"]) >= 2
        except psutil.NoSuchProcess:
            return True

    wait_for("the process group to form", collective_running)
    time.sleep(1.0)  # into the timed loop
    assert victim.is_running()
    os.killpg(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for("the host to record the failure", lambda: bool(host.snapshot().runs))
    host_took = time.monotonic() - killed_at
    round_thread.join(WALL)
    assert not round_thread.is_alive()
    (host_run,) = host.snapshot().runs
    (guest_run,) = guest.snapshot().runs
    assert host_run.peer == B and host_run.reason in ("peer_unreachable", "timeout", "crashed")
    assert host_took < 30.0 / 2  # the worker's own collective timeout, well before the kill
    assert guest_run.peer == A and guest_run.reason == "crashed"
    assert guest_run.records[0].error is not None
    assert "exited with code -9" in guest_run.records[0].error.detail
    assert wait_for("no workers", lambda: not worker_children(), 10.0) < 10.0


def test_a_wrong_secret_is_refused_counted_on_the_host_and_fails_the_guest(
    make_service: Callable[..., ProbeService],
) -> None:
    port = free_port(A)
    members = StaticMembers([A, B])
    host = make_service(A, secret=SECRET, members=members, listen=(A, port), launcher=NoLaunch())
    guest = make_service(
        B, secret=b"another secret, 32 bytes long ok", members=members, listen=(B, port),
        launcher=NoLaunch(),
    )  # fmt: skip
    host.start()
    guest.run_pair_round(3)
    (run,) = guest.snapshot().runs
    assert (run.peer, run.reason) == (A, "auth_failure")
    assert total(guest.snapshot(), "sendrecv", "auth_failure") == 1

    def refused() -> int:
        stats = host.snapshot().rendezvous
        return 0 if stats is None else stats.refused("auth_failure")

    wait_for("the host to count the refusal", lambda: refused() == 1, 10.0)
    assert host.snapshot().runs == ()
    stats = host.snapshot().rendezvous
    assert stats is not None and stats.accepted_total == 0


# --- safety -------------------------------------------------------------------------------


@pytest.mark.parametrize("why", ["busy", "unknown", "locked"])
def test_busy_or_locked_gpus_are_never_probed(
    why: str, make_service: Callable[..., ProbeService]
) -> None:
    busy: Callable[[], frozenset[int] | None] = {
        "busy": lambda: frozenset({0, 1}),
        "unknown": lambda: None,  # NVML cannot say: probe nothing
        "locked": frozenset,
    }[why]
    host, guest = pair(make_service, host_busy=busy, host_launcher=NoLaunch(), guest_busy_retries=0)
    if why == "locked":  # a local probe holds both devices
        assert host.locks.try_acquire([0, 1])
    assert host.run_intra() is None
    guest.run_pair_round(5)  # B's offer to A is declined
    snap = host.snapshot()
    reason = "gpu_unknown" if why == "unknown" else "gpu_busy"  # the metric tells them apart
    assert skipped(snap, reason) == 2
    assert snap.runs == ()
    assert skipped(guest.snapshot(), "peer_declined") == 1
    assert guest.snapshot().runs == ()


@pytest.mark.parametrize(
    "reason", ["kubelet_unavailable", "nvml_unavailable", "unmapped_device", "no_attribution"]
)
def test_gpus_whose_allocation_is_unknown_are_never_probed(
    reason: str, make_service: Callable[..., ProbeService], caplog: pytest.LogCaptureFixture
) -> None:
    """Fail closed: when which GPUs pods hold cannot be established, the host takes none,
    whatever NVML says, counts why, and says so once per change of state."""
    allocation = [GpuAllocation(unknown=reason)]
    host, guest = pair(
        make_service,
        host_allocated=lambda: allocation[0],
        host_launcher=NoLaunch(),
        guest_busy_retries=0,
    )
    with caplog.at_level(logging.INFO, logger="agent.probe.run.results"):
        assert host.run_intra() is None
        guest.run_pair_round(5)  # B's offer to A is declined
        assert host.run_intra() is None
        snap = host.snapshot()
        assert skipped(snap, "allocation_unknown") == 3
        assert dict(snap.allocation_unknown_total) == {
            r: 3 if r == reason else 0 for r in UNKNOWN_REASONS
        }
        assert snap.runs == () and skipped(guest.snapshot(), "peer_declined") == 1
        # known again, GPU 1 held by a pod: the intra-node probe needs two idle GPUs
        allocation[0] = GpuAllocation(frozenset({1}))
        assert host.run_intra() is None
        assert skipped(host.snapshot(), "gpu_busy") == 1
    said = [r.getMessage() for r in caplog.records if "which GPUs pods hold" in r.getMessage()]
    assert said == [
        f"probe: cannot establish which GPUs pods hold ({reason}); probing none until it can"
    ]
    assert "probe: the GPUs pods hold are known again; probing idle ones" in caplog.messages
    text = render_text(families(host.snapshot())).decode()
    assert f'fabricscope_probe_allocation_unknown_total{{reason="{reason}"}} 3.0' in text


def test_a_guest_asks_again_while_the_hosts_gpu_is_still_held(
    make_service: Callable[..., ProbeService],
) -> None:
    # the host's rank of the previous probe may still be exiting when the next offer comes
    host, guest = pair(make_service, host_launcher=FakeLaunch(), guest_launcher=FakeLaunch())
    assert host.locks.try_acquire([0, 1])
    threading.Timer(1.5, host.locks.release, args=([0, 1],)).start()
    guest.run_pair_round(2)
    assert [(r.peer, r.reason) for r in guest.snapshot().runs] == [(A, None)]
    assert skipped(guest.snapshot(), "peer_declined") == 0
    assert skipped(host.snapshot(), "gpu_busy") in (1, 2)  # declined once or twice, then ok


def test_force_probes_busy_gpus(make_service: Callable[..., ProbeService]) -> None:
    launch = FakeLaunch()
    svc = make_service(settings=fast(force=True), busy=lambda: frozenset({0, 1}), launcher=launch)
    run = svc.run_intra()
    assert run is not None and run.reason is None
    assert [s.rank for s in launch.specs] == [0, 1]


def test_no_probe_runs_over_the_budget(make_service: Callable[..., ProbeService]) -> None:
    svc = make_service(settings=fast(budget=1e-9), launcher=NoLaunch())
    assert svc.run_intra() is None
    assert skipped(svc.snapshot(), "budget") == 1
    assert {r: skipped(svc.snapshot(), r) for r in SKIP_REASONS if r != "budget"} == {
        "allocation_unknown": 0,
        "gpu_busy": 0,
        "gpu_unknown": 0,
        "no_partner": 0,
        "peer_declined": 0,
    }


def test_the_budget_is_a_token_bucket_of_gpu_seconds() -> None:
    now = [0.0]
    budget = GpuBudget(0.01, 2, 100.0, clock=lambda: now[0])  # 0.02 GPU-s per s, 2 GPU-s
    assert budget.capacity == pytest.approx(2.0)
    assert budget.allows(2.0) and not budget.allows(2.01)
    budget.spend(3.0)  # a probe may overrun its estimate
    assert budget.credit() == pytest.approx(-1.0)
    assert not budget.allows(0.5)
    now[0] = 75.0
    assert budget.credit() == pytest.approx(0.5)
    assert budget.allows(0.5)
    now[0] = 1e6
    assert budget.credit() == pytest.approx(2.0)  # never above the window's worth


def test_a_single_device_node_has_no_intra_node_partner(
    make_service: Callable[..., ProbeService],
) -> None:
    svc = make_service(slots=(GpuSlot(0, None),), launcher=NoLaunch())
    assert svc.run_intra() is None
    assert skipped(svc.snapshot(), "no_partner") == 1


# --- ageing ---------------------------------------------------------------------------------


def test_results_of_a_peer_that_left_age_out(make_service: Callable[..., ProbeService]) -> None:
    now = [1_000_000.0]
    members = Members(A, B)
    settings = fast(max_age_seconds=100.0)
    port = free_port(A)
    kw = {"settings": settings, "secret": SECRET, "launcher": FakeLaunch(), "clock": lambda: now[0]}
    host = make_service(A, members=members, listen=(A, port), **kw)
    guest = make_service(B, members=members, listen=(B, port), **kw)
    host.start()
    guest.run_pair_round(1)
    wait_for("the host's record", lambda: bool(host.snapshot().runs), 10.0)
    assert [r.peer for r in guest.snapshot().runs] == [A]
    assert [r.peer for r in host.snapshot().runs] == [B]
    members.hosts = (B, "127.0.0.3")  # A leaves
    now[0] += 99.0
    assert [r.peer for r in guest.snapshot().runs] == [A]  # not yet
    now[0] += 2.0
    for svc in (guest, host):
        snap = svc.snapshot()
        assert snap.runs == ()
        text = render_text(families(snap)).decode()
        assert "peer=" not in text  # every per-run series is gone
        assert total(snap, "sendrecv", "ok") == 1  # counters stay


# --- the launcher ----------------------------------------------------------------------------


def test_the_launcher_kills_the_workers_whole_process_group_at_the_deadline(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    fake = tmp_path / "python"
    # a "worker" that starts a child of its own and hangs: only a group kill reaches both
    fake.write_text(f"#!/bin/sh\nsleep 60 &\necho $$ $! > {pids}\nwait\n")
    fake.chmod(0o755)
    spec = WorkerSpec(
        kind="sendrecv", rank=0, world_size=2, master_addr=A, master_port=1, backend="gloo",
        sizes=(4096, 8192),
    )  # fmt: skip
    began = time.monotonic()
    # 3 s: the fake must have started and written its pids before the deadline, on a loaded
    # 2-core CI machine too
    run = launch_workers([spec], deadline_seconds=3.0, python=str(fake))
    assert time.monotonic() - began < 10.0
    assert run.killed
    assert [(r.size_bytes, r.reason) for r in run.records] == [(4096, "timeout"), (8192, "timeout")]
    for pid in map(int, pids.read_text().split()):
        assert gone(pid, within=5.0), pid


def test_a_rank_that_fails_stops_the_others_at_once(tmp_path: Path) -> None:
    """Rank 1 cannot start (as a worker asked for a GPU a 1-GPU machine lacks, on a real H200
    run): rank 0, a real gloo worker, would wait out the 60 s rendezvous; it is stopped
    within the grace and every size names rank 1's error."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *\'"rank":1,\'*) echo "RuntimeError: CUDA error: invalid device '
        'ordinal" >&2; exit 3;; esac\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    base = WorkerSpec(
        kind="sendrecv", rank=0, world_size=2, master_addr=A, master_port=free_port(A),
        backend="gloo", sizes=(4096, 8192), timeout_seconds=60.0,
    )  # fmt: skip
    began = time.monotonic()
    run = launch_workers([base, replace(base, rank=1)], deadline_seconds=120.0, python=str(fake))
    assert time.monotonic() - began < 30.0  # not the 60 s rendezvous timeout
    assert not run.killed
    assert [(r.size_bytes, r.reason) for r in run.records] == [(4096, "crashed"), (8192, "crashed")]
    error = run.records[0].error
    assert error is not None
    assert "worker rank 1 exited with code 3" in error.detail
    assert "invalid device ordinal" in error.detail


def gone(pid: int, within: float) -> bool:
    """The process has exited (or is a zombie waiting to be reaped) within ``within`` s: a
    SIGKILLed process needs a moment to die on a busy machine."""
    deadline = time.monotonic() + within
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_stopping_service_kills_its_running_workers(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\nexec sleep 60\n")
    fake.chmod(0o755)
    abort = threading.Event()
    spec = WorkerSpec(kind="latency", rank=0, world_size=2, master_addr=A, master_port=1)
    threading.Timer(0.5, abort.set).start()
    began = time.monotonic()
    run = launch_workers([spec], deadline_seconds=60.0, abort=abort, python=str(fake))
    assert time.monotonic() - began < 5.0
    assert [r.reason for r in run.records] == ["crashed"]
    assert run.records[0].error is not None
    assert "agent is stopping" in run.records[0].error.detail


# --- small parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("10.0.0.7", ("10.0.0.7", 10119)),
        ("10.0.0.7:2000", ("10.0.0.7", 2000)),
        ("node-a", ("node-a", 10119)),
        ("[fe80::1]:2000", ("fe80::1", 2000)),
        ("fe80::1", ("fe80::1", 10119)),
    ],
)
def test_parse_hostport(text: str, want: tuple[str, int]) -> None:
    assert parse_hostport(text) == want


@pytest.mark.parametrize("text", ["", ":1", "h:0", "h:70000", "h:x", "[::1"])
def test_parse_hostport_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_hostport(text)


def test_probe_ids_carry_the_requested_gpu_within_the_rendezvous_grammar() -> None:
    pid = probe_id("r12", 3)
    assert pid.startswith("r12-") and pid.endswith(".g3")
    assert requested_slot(pid) == 3
    assert requested_slot(probe_id("cli")) is None


class FakeNvml:
    """``count`` GPUs, ``busy`` ones running a process, ``modes`` their compute modes (an
    int, or the name of the NVML error to answer; absent: the default, 0)."""

    def __init__(
        self, count: int, busy: tuple[int, ...] = (), modes: dict[int, int | str] | None = None
    ) -> None:
        self.count = count
        self.busy = busy
        self.modes = modes or {}

    def init(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def device_count(self) -> int:
        return self.count

    def uuid(self, gpu: int) -> str:
        return f"GPU-{gpu}aaaa-{gpu}"

    def compute_processes(self, gpu: int) -> tuple[tuple[int, int | None], ...]:
        return ((4242, None),) if gpu in self.busy else ()

    def compute_mode(self, gpu: int) -> int:
        mode = self.modes.get(gpu, 0)
        if isinstance(mode, str):
            raise NvmlCallError("nvmlDeviceGetComputeMode", 999, mode)
        return mode


@pytest.mark.parametrize(
    ("env", "labels"),
    [
        ({}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, [1]),
        ({"CUDA_VISIBLE_DEVICES": "3,0"}, [3, 0]),
        ({"CUDA_VISIBLE_DEVICES": "2,9,1"}, [2]),  # CUDA stops at the first bad entry
        ({"CUDA_VISIBLE_DEVICES": "GPU-2aa"}, [2]),
    ],
)
def test_devices_follow_cuda_visible_devices_as_nvml_indices(
    env: dict[str, str], labels: list[int]
) -> None:
    view = GpuViewSampler(lambda: FakeNvml(4), visible=env.get("CUDA_VISIBLE_DEVICES"))
    backend, slots = discover_slots("auto", 2, view=view)
    assert backend == "nccl"
    assert [(s.label, s.device) for s in slots] == [(i, i) for i in labels]


def test_busy_gpus_are_those_running_compute_processes() -> None:
    view = GpuViewSampler(lambda: FakeNvml(4, busy=(1, 3)), visible="3,2,1")
    assert discover_slots("auto", 2, view=view)[0] == "nccl"
    assert NvmlBusyGpus(view)() == frozenset({1, 3})


def test_no_gpu_means_gloo_unless_nccl_is_asked_for() -> None:
    backend, slots = discover_slots("auto", 3, view=GpuViewSampler(lambda: FakeNvml(0)))
    assert (backend, [s.label for s in slots]) == ("gloo", [0, 1, 2])
    with pytest.raises(ConfigError, match="no NVIDIA GPU"):
        discover_slots("nccl", 2, view=GpuViewSampler(lambda: FakeNvml(0)))


def test_a_taken_probe_port_is_a_config_error(make_service: Callable[..., ProbeService]) -> None:
    with socket.create_server((A, 0)) as taken:
        port = taken.getsockname()[1]
        svc = make_service(A, secret=SECRET, listen=(A, port))
        with pytest.raises(ConfigError, match="already in use"):
            svc.start()


# --- rendering -------------------------------------------------------------------------------


def families(snap: ProbeSnapshot) -> Families:
    out = Families()
    render(snap, out)
    return out


def record(kind: str, size: int, seconds: float | None, error: ProbeError | None) -> ProbeRecord:
    bw = None if seconds is None or kind == "latency" else size / seconds
    return ProbeRecord(
        kind=kind, backend="nccl", world_size=2, size_bytes=size, iterations=20, warmup=5,
        time_seconds=seconds, algbw_bytes_per_second=bw, busbw_bytes_per_second=bw,
        correct=None if error else True, error=error,
    )  # fmt: skip


def test_render_exact_series() -> None:
    timeout = ProbeError("timeout", "worker killed")
    snap = ProbeSnapshot(
        runs=(
            ProbeRun("all_reduce", "", "", "", 1700000000.0, 7.5, None, (
                replace(record("all_reduce", 1 << 20, 2**-13, None), world_size=8,
                        busbw_bytes_per_second=1.75 * (1 << 20) * 2**13),
            )),
            ProbeRun("latency", "node-b", "3", "3", 1700000100.0, 4.0, None, (
                record("latency", 8, 2**-15, None),
            )),
            ProbeRun("sendrecv", "node-b", "3", "3", 1700000090.0, 5.0, "timeout", (
                record("sendrecv", 1 << 20, 2**-15, None),
                record("sendrecv", 1 << 30, None, timeout),
            )),
        ),
        runs_total=(("all_reduce", "ok", 4), ("sendrecv", "timeout", 1)),
        skipped_total=(("budget", 2), ("gpu_busy", 1), ("no_partner", 0), ("peer_declined", 0)),
        gpu_seconds_total=123.5,
        members=16,
        rendezvous=RendezvousStats(accepted_total=9, refused_total=(("auth_failure", 2),)),
    )  # fmt: skip
    lines = [
        line
        for line in render_text(families(snap)).decode().splitlines()
        if not line.startswith("#") and ('reason="ok"' in line or "_runs_total" not in line)
    ]
    intra = 'collective="all_reduce",gpu="",peer="",peer_gpu=""'
    pair = 'gpu="3",peer="node-b",peer_gpu="3"'
    lat, sr = f'collective="latency",{pair}', f'collective="sendrecv",{pair}'
    mib = 'size_bytes="1048576"'
    assert lines == [
        # 2^20 B / 2^-13 s = 2^33 B/s; busbw x 2(8-1)/8 = 1.75 for 8 ranks
        f"fabricscope_probe_algbw_bytes_per_second{{{intra},{mib}}} 8.589934592e+09",
        # 2^20 B / 2^-15 s = 2^35 B/s; the failed 1 GiB size has no series
        f"fabricscope_probe_algbw_bytes_per_second{{{sr},{mib}}} 3.4359738368e+10",
        'fabricscope_probe_allocation_unknown_total{reason="kubelet_unavailable"} 0.0',
        'fabricscope_probe_allocation_unknown_total{reason="no_attribution"} 0.0',
        'fabricscope_probe_allocation_unknown_total{reason="nvml_unavailable"} 0.0',
        'fabricscope_probe_allocation_unknown_total{reason="unmapped_device"} 0.0',
        f"fabricscope_probe_busbw_bytes_per_second{{{intra},{mib}}} 1.5032385536e+10",
        f"fabricscope_probe_busbw_bytes_per_second{{{sr},{mib}}} 3.4359738368e+10",
        f"fabricscope_probe_duration_seconds{{{intra}}} 7.5",
        f"fabricscope_probe_duration_seconds{{{lat}}} 4.0",
        f"fabricscope_probe_duration_seconds{{{sr}}} 5.0",
        "fabricscope_probe_gpu_seconds_total 123.5",
        f"fabricscope_probe_last_run_timestamp_seconds{{{intra}}} 1.7e+09",
        f"fabricscope_probe_last_run_timestamp_seconds{{{lat}}} 1.7000001e+09",
        f"fabricscope_probe_last_run_timestamp_seconds{{{sr}}} 1.70000009e+09",
        f"fabricscope_probe_latency_seconds{{{pair}}} 3.0517578125e-05",
        "fabricscope_probe_members 16.0",
        "fabricscope_probe_rendezvous_accepted_total 9.0",
        'fabricscope_probe_rendezvous_refused_total{reason="auth_failure"} 2.0',
        'fabricscope_probe_rendezvous_refused_total{reason="disconnected"} 0.0',
        'fabricscope_probe_rendezvous_refused_total{reason="protocol_error"} 0.0',
        'fabricscope_probe_rendezvous_refused_total{reason="timeout"} 0.0',
        'fabricscope_probe_rendezvous_refused_total{reason="too_many_pending"} 0.0',
        'fabricscope_probe_runs_total{collective="all_reduce",reason="ok"} 4.0',
        'fabricscope_probe_runs_total{collective="latency",reason="ok"} 0.0',
        'fabricscope_probe_runs_total{collective="sendrecv",reason="ok"} 0.0',
        'fabricscope_probe_skipped_total{reason="allocation_unknown"} 0.0',
        'fabricscope_probe_skipped_total{reason="budget"} 2.0',
        'fabricscope_probe_skipped_total{reason="gpu_busy"} 1.0',
        'fabricscope_probe_skipped_total{reason="gpu_unknown"} 0.0',
        'fabricscope_probe_skipped_total{reason="no_partner"} 0.0',
        'fabricscope_probe_skipped_total{reason="peer_declined"} 0.0',
        f"fabricscope_probe_success{{{intra}}} 1.0",
        f"fabricscope_probe_success{{{lat}}} 1.0",
        f"fabricscope_probe_success{{{sr}}} 0.0",
    ]
    text = render_text(families(snap)).decode()
    assert 'fabricscope_probe_runs_total{collective="sendrecv",reason="timeout"} 1.0' in text
    assert 'size_bytes="1073741824"' not in text  # the failed size has no bandwidth


def test_a_node_without_rendezvous_exports_no_rendezvous_counters() -> None:
    text = render_text(families(ProbeSnapshot())).decode()
    assert "rendezvous" not in text
    assert "fabricscope_probe_members 0.0" in text
