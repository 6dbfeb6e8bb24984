"""A driver library that crashes or hangs costs the NVML sampler's pass, never the agent.

Real processes and real signals: a stand-in ``libnvidia-ml.so.1`` is built here from
``tests/nvml_standin/libnvidia-ml.c`` with gcc and loaded by the real pynvml exactly as it
loads NVIDIA's (``CDLL("libnvidia-ml.so.1")`` through ``LD_LIBRARY_PATH``); on command it
dereferences NULL (SIGSEGV), calls ``abort()`` (SIGABRT) or blocks. The agent serves the
dgx-h100 fixture sysfs tree, so InfiniBand and PCI series exist beside NVML's. Without a GPU
here, the stand-in is the only way to crash the real library path; it answers for one GPU.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.core.ceiling import child_ceiling
from agent.core.errors import NoData, SamplerFailure
from agent.core.isolation import ChildSpec, IsolatedSampler, describe_exit
from agent.probe.run.devices import GpuSlot, NvmlBusyGpus, discover_slots, isolated_gpu_view
from tests.procwatch import children, data_limit, peak_rss
from tests.promharness import free_port
from tests.standin_nvml import build_standin

ROOT = Path(__file__).resolve().parents[2]
SYSFS = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"
GPU_INFO = "fabricscope_gpu_info{"
IB_SERIES = "fabricscope_infiniband_port_info{"
PCI_SERIES = "fabricscope_pci_"


@dataclass
class StandIn:
    """The built library's directory and the trigger file it reads on every pass."""

    libdir: Path
    trigger: Path

    def set(self, word: str) -> None:
        tmp = self.trigger.with_suffix(".tmp")
        tmp.write_text(word)
        tmp.replace(self.trigger)  # never half-written when the library reads it

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            LD_LIBRARY_PATH=str(self.libdir),
            FABRICSCOPE_STANDIN_TRIGGER=str(self.trigger),
            PYTHONUNBUFFERED="1",
        )


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> StandIn:
    """The stand-in library, compiled once for the module."""
    libdir = build_standin(tmp_path_factory.mktemp("nvml-standin"))
    trigger = libdir / "trigger"
    trigger.write_text("")
    return StandIn(libdir, trigger)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        body: bytes = resp.read()
    return body.decode()


def value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def errors(text: str, reason: str) -> float:
    return value(text, f'fabricscope_sampler_errors_total{{reason="{reason}",sampler="nvml"}}')


def restarts(text: str) -> float:
    return value(text, 'fabricscope_sampler_child_restarts_total{sampler="nvml"}')


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def until(
        self, what: str, check: Callable[[str], bool], timeout: float = 15.0, started: bool = True
    ) -> str:
        """Scrape until ``check(body)``; every scrape must answer, with IB and PCI series
        once ``started``."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"agent died: {self.proc.returncode}\n{self.logs()}"
            body = scrape(self.port)
            if started:
                assert IB_SERIES in body and PCI_SERIES in body, "IB/PCI series missing"
            if check(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.logs()[-3000:]}")
            time.sleep(0.05)

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_agent(
    standin: StandIn, tmp_path: Path, flags: Sequence[str], ready: Callable[[str], bool]
) -> Iterator[Agent]:
    """A real agent serving the fixture tree with NVML from the stand-in, 0.5 s passes (an
    in-process sampler's pass that times out withdraws its series: 0.25 s did on a busy
    2-core machine), and
    ``flags``; yielded once a scrape satisfies ``ready``; it must exit 0 on SIGTERM."""
    port = free_port()
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", f"--path.sysfs={SYSFS}"),
                *(f"--web.listen-address=127.0.0.1:{port}", "--sampling.interval=0.5"),
                *("--sampling.timeout=0.5", "--no-sampler.netdev", "--no-sampler.workload"),
                "--no-sampler.attribution",
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=standin.env(),
            cwd=ROOT,
        )
    running = Agent(proc, port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                running.until("the agent ready", ready, started=False)
                break
            except OSError:  # not listening yet
                assert time.monotonic() < deadline, running.logs()
                time.sleep(0.1)
        yield running
    finally:
        standin.set("")
        proc.terminate()
        assert proc.wait(10) == 0, running.logs()


@pytest.fixture
def agent(standin: StandIn, tmp_path: Path) -> Iterator[Agent]:
    """The agent with its NVML sampler, once every series is there."""
    standin.set("")
    with running_agent(
        standin, tmp_path, (), lambda b: GPU_INFO in b and IB_SERIES in b
    ) as running:
        yield running
    # the child exits with the agent: no process of ours is left behind
    assert "did not exit" not in running.logs()


def fail_and_recover(agent: Agent, standin: StandIn, word: str, reason: str, said: str) -> None:
    """Make the library ``word``; wait until that is counted (and, for a crash, until the
    restarted child crashed again); make it behave; wait until NVML's series are back."""
    body = scrape(agent.port)
    before_errors, before_restarts = errors(body, reason), restarts(body)
    standin.set(word)
    # the failure is counted and NVML's series are withdrawn, not left stale
    agent.until(
        f"{word} counted", lambda b: errors(b, reason) > before_errors and GPU_INFO not in b
    )
    if reason == "crashed":  # still failing: restarted after its backoff, crashes again
        agent.until(
            f"{word}: a restart",
            lambda b: restarts(b) > before_restarts and errors(b, reason) > before_errors + 1,
        )
    # (a hung child's successor hangs too, until its start allowance of 30 s: not waited)
    assert said in agent.logs()
    standin.set("")
    agent.until(
        f"NVML back after {word}", lambda b: GPU_INFO in b and restarts(b) > before_restarts
    )


def test_crashes_and_hangs_cost_passes_not_the_agent(agent: Agent, standin: StandIn) -> None:
    """SIGSEGV, SIGABRT and a hang in the library, one after the other: /metrics answers
    with the InfiniBand and PCI series throughout, each is counted, the child is restarted
    and NVML's series come back once the library behaves."""
    fail_and_recover(agent, standin, "segv", "crashed", "killed by SIGSEGV")
    fail_and_recover(agent, standin, "abort", "crashed", "killed by SIGABRT")
    fail_and_recover(agent, standin, "hang", "hung", "gave no answer")
    body = scrape(agent.port)
    assert errors(body, "backoff") > 0  # passes in between failed at once
    assert value(body, 'fabricscope_sampler_success{sampler="infiniband"}') == 1
    logs = agent.logs()
    assert "sampler nvml crashed: child process" in logs and "sampler nvml hung" in logs
    assert "Fatal Python error: Segmentation fault" in logs  # the child's faulthandler
    assert "Traceback" not in logs


def test_the_probes_gpu_checks_run_in_a_child_too(standin: StandIn) -> None:
    """The probe asks NVML which GPUs there are and which run compute processes: through a
    child process of its own (the agent never loads the library). A segfault there makes
    the busy check "unknown" (the probe takes no GPU), not a dead agent; the child is
    restarted after its backoff and answers again."""
    standin.set("")
    view = isolated_gpu_view(standin.env(), timeout_seconds=2.0, start_timeout_seconds=20.0)
    try:
        assert discover_slots("auto", 2, view=view) == ("nccl", (GpuSlot(0, 0),))
        first = view.pid
        assert first is not None and first != os.getpid()
        with open(f"/proc/{first}/maps") as maps:
            assert str(standin.libdir / "libnvidia-ml.so.1") in maps.read()
        busy = NvmlBusyGpus(view)
        assert busy() == frozenset()  # the stand-in's GPU runs nothing
        standin.set("segv")
        assert busy() is None  # crashed: unknown
        assert busy() is None  # backing off: still unknown, at once
        standin.set("")
        deadline = time.monotonic() + 15
        while (answer := busy()) is None:
            assert time.monotonic() < deadline, "the GPU view did not come back"
            time.sleep(0.2)
        assert answer == frozenset()
        assert view.restarts_total == 1 and view.pid not in (None, first)
    finally:
        standin.set("")
        view.close()


def test_an_nvml_crash_in_probe_discovery_leaves_the_agent_serving(
    standin: StandIn, tmp_path: Path
) -> None:
    """``agent --probe`` with a library that segfaults: the probe's device discovery runs in
    a child, which dies; the agent says why in one line, probes CPU slots (``auto``) and
    serves every other series."""
    standin.set("segv")
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32 + "\n")
    secret.chmod(0o600)
    flags = ("--no-sampler.nvml", "--probe", f"--probe.secret-file={secret}")
    where = f"--probe.listen-address=127.0.0.1:{free_port()}"
    with running_agent(
        standin, tmp_path, (*flags, where), lambda b: "fabricscope_probe_" in b and IB_SERIES in b
    ) as running:
        body = scrape(running.port)
        assert value(body, 'fabricscope_sampler_success{sampler="infiniband"}') == 1
        logs = running.logs()
        assert "probe: no GPU (NVML: " in logs and "killed by SIGSEGV" in logs, logs[-3000:]
        assert "probing 2 CPU slots with gloo" in logs
        assert "Traceback" not in logs


def test_topo_with_a_crashing_library_still_reports_the_node(standin: StandIn) -> None:
    """``fabricscope topo`` reads live NVML through a child too: a segfault there costs the
    NVML area (listed as failed, the signal in the log), not the command; the PCI and
    InfiniBand findings of the DGX tree are all printed."""
    standin.set("segv")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "exporter.cli", "topo", f"--path.sysfs={SYSFS}"],
            capture_output=True,
            env=standin.env(),
            timeout=60,
            check=False,
            cwd=ROOT,
        )
    finally:
        standin.set("")
    out, err = run.stdout.decode(), run.stderr.decode()
    assert run.returncode == 0, err[-2000:]
    assert "pci_link_width_degraded" in out and "port_down" in out
    assert "not checked (sampler failed, see the log): nvml" in out
    assert "not checked (no data): workload" in out
    assert "sampler nvml crashed: child process" in err and "killed by SIGSEGV" in err
    assert "restarting" not in err  # one pass: no restart to announce


def test_snapshot_records_nvml_in_a_child(standin: StandIn, tmp_path: Path) -> None:
    """``fabricscope snapshot`` records NVML's answers in a child process: with a working
    library the archive replays the stand-in's GPU; with one that segfaults the archive is
    still written (every sysfs file), without a recording, and the command says so."""
    args = [sys.executable, "-m", "exporter.cli", "snapshot", f"--path.sysfs={SYSFS}"]
    replay = [sys.executable, "-m", "exporter.cli", "agent", "--once", "--no-sampler.netdev"]
    for word in ("", "segv"):
        standin.set(word)
        out = tmp_path / f"snap-{word or 'ok'}.tar.gz"
        try:
            run = subprocess.run(
                [*args, "-o", str(out)], capture_output=True, env=standin.env(), timeout=120,
                check=False, cwd=ROOT,
            )  # fmt: skip
        finally:
            standin.set("")
        err = run.stderr.decode()
        assert run.returncode == 0 and out.exists(), err[-2000:]
        back = subprocess.run(
            [*replay, "--snapshot", str(out)], capture_output=True, timeout=120, check=True,
            cwd=ROOT,
        )  # fmt: skip
        metrics = back.stdout.decode()
        assert IB_SERIES in metrics and PCI_SERIES in metrics
        if word == "":
            assert "NVML recording of" in err
            assert 'model="fabricscope stand-in GPU"' in metrics
        else:
            assert "killed by SIGSEGV" in err and "no NVML recording" in err
            assert GPU_INFO not in metrics


def test_without_isolation_the_same_crash_kills_the_process(
    standin: StandIn, tmp_path: Path
) -> None:
    """The control: the stand-in's segfault is real. In-process (``--no-nvml.isolate``) it
    kills ``agent --once``; isolated, the same pass prints every other sampler's series."""
    standin.set("segv")
    try:
        args = [sys.executable, "-m", "exporter.cli", "agent", "--once", f"--path.sysfs={SYSFS}"]
        args += ["--no-sampler.netdev", "--no-sampler.workload", "--no-sampler.attribution"]
        run = subprocess.run(
            [*args, "--no-nvml.isolate"],
            capture_output=True,
            env=standin.env(),
            timeout=60,
            check=False,
        )
        assert run.returncode == -11, run.stderr.decode()[-2000:]
        run = subprocess.run(args, capture_output=True, env=standin.env(), timeout=60, check=False)
        out = run.stdout.decode()
        assert run.returncode == 0, run.stderr.decode()[-2000:]
        assert IB_SERIES in out and PCI_SERIES in out and GPU_INFO not in out
        assert errors(out, "crashed") == 1
        assert "killed by SIGSEGV" in run.stderr.decode()
    finally:
        standin.set("")


def test_a_replayed_node_in_a_child_matches_in_process() -> None:
    """The snapshot that crosses the pipe is the in-process one (the recorded 2x H200)."""
    from agent.nvml.record import replay_sampler

    spec = ChildSpec("agent.nvml.record:replay_sampler", {"recording": str(RECORDING)})
    isolated = IsolatedSampler("nvml", spec, timeout_seconds=10)
    local = replay_sampler(recording=str(RECORDING))
    try:
        for _ in range(3):
            assert isolated.sample() == local.sample()
        assert isolated.last_stats is not None and isolated.last_stats.pid == isolated.pid
        assert isolated.last_stats.rss_bytes > 0
    finally:
        isolated.close()
        local.close()
    assert isolated.pid is None


def test_no_driver_is_quiet_and_keeps_no_child(tmp_path: Path) -> None:
    """No libnvidia-ml.so.1 at all: NoData, the child is gone, and the next pass answers
    NoData without starting one (until the recheck)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    spec = ChildSpec("agent.nvml.sampler:child_sampler", {"watch_xid": False})
    isolated = IsolatedSampler("nvml", spec, timeout_seconds=10, env=env)
    with pytest.raises(NoData, match="no NVIDIA driver"):
        isolated.sample()
    assert isolated.pid is None
    t0 = time.perf_counter()
    with pytest.raises(NoData):
        isolated.sample()
    assert time.perf_counter() - t0 < 0.01 and isolated.restarts_total == 0


def test_backoff_doubles_and_fails_fast(standin: StandIn) -> None:
    """Two crashes in a row: the second restart waits twice as long; passes in between
    fail at once with reason backoff."""
    now = [0.0]
    spec = ChildSpec("agent.nvml.sampler:child_sampler", {"watch_xid": False})
    isolated = IsolatedSampler(
        "nvml", spec, timeout_seconds=10, env=standin.env(), monotonic=lambda: now[0]
    )
    standin.set("abort")
    try:
        reasons = []
        for t in (0.0, 0.5, 1.0, 2.5, 3.0):
            now[0] = t
            with pytest.raises(SamplerFailure) as failed:
                isolated.sample()
            reasons.append(failed.value.reason)
        assert reasons == ["crashed", "backoff", "crashed", "backoff", "crashed"]
        assert isolated.restarts_total == 2
        standin.set("")
        now[0] = 7.0  # the third backoff is 4 s
        assert isolated.sample().gpus[0].name == "fabricscope stand-in GPU"  # type: ignore[attr-defined]
    finally:
        standin.set("")
        isolated.close()


def test_describe_exit() -> None:
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert describe_exit(-6) == "killed by SIGABRT"
    assert describe_exit(3) == "exited with status 3"
    assert describe_exit(None) == "still running"


#: the pod limit the chart gives the agent (deploy/helm/fabricscope/values.yaml)
POD_LIMIT = 512 << 20


def test_a_leaking_library_is_stopped_at_its_ceiling(standin: StandIn, tmp_path: Path) -> None:
    """A driver library that allocates without end (the stand-in's ``leak``: 64 MiB a pass in
    8 MiB blocks, written, kept, up to 400 MiB) under the chart's 512 MiB pod limit: the
    kernel holds the NVML child to its ceiling (``RLIMIT_DATA``, its share of the limit), the
    child is ended
    and counted (``reason="memory_ceiling"``, one log line each), restarted after its
    backoff, never resident beyond its ceiling; every scrape keeps the InfiniBand and PCI
    series, and NVML's come back once the library behaves. (Without a ceiling the child
    holds the 400 MiB and nothing is counted.)"""
    ceiling = child_ceiling("nvml", POD_LIMIT)
    assert ceiling < 400 << 20
    standin.set("")
    # passes of 2 s: an in-process sampler timing out withdraws its series, and 1 s passes of
    # the fixture tree timed out on a 2-core machine under a load of 29
    flags = (f"--agent.memory-limit={POD_LIMIT}", "--sampling.interval=2s", "--sampling.timeout=2s")
    with running_agent(standin, tmp_path, flags, lambda b: GPU_INFO in b) as agent:
        (child,) = children(agent.proc.pid)
        assert data_limit(child) == ceiling
        peak = 0

        def watched(check: Callable[[str], bool]) -> Callable[[str], bool]:
            def polled(body: str) -> bool:
                nonlocal peak
                for pid in children(agent.proc.pid):
                    peak = max(peak, peak_rss(pid))
                return check(body)

            return polled

        standin.set("leak")
        agent.until(
            "a child ended at the ceiling and replaced",
            watched(lambda b: errors(b, "memory_ceiling") >= 1 and restarts(b) >= 1),
            timeout=30,
        )
        standin.set("")
        agent.until("NVML back", watched(lambda b: GPU_INFO in b), timeout=30)
        logs = agent.logs()
        said = [ln for ln in logs.splitlines() if "reached its memory ceiling" in ln]
        assert said and f"of {ceiling >> 20} MiB" in said[0], logs[-5000:]
        assert "Traceback" not in logs
        assert 0 < peak < ceiling, f"the NVML child peaked at {peak >> 20} MiB"


def test_a_library_writing_through_null_at_its_ceiling_counts_as_the_ceiling(
    standin: StandIn, tmp_path: Path
) -> None:
    """A library that grows (1 MiB every 10 ms) and writes through the NULL malloc returns at
    the ceiling (the stand-in's ``grownull``) dies by SIGSEGV, not by answering: the agent
    counts it as ``memory_ceiling`` (its counted memory, read every 50 ms, was last seen
    above 90 % of the ceiling), says so in one line, replaces it, and NVML comes back.
    (Before, the same death was ``crashed``, like any segfault. A parent thread starved for
    more than 50 ms on a loaded machine can see it lower and count ``crashed``: the test asks
    for one death counted as the ceiling among the replaced children, not for every one.)"""
    ceiling = child_ceiling("nvml", POD_LIMIT)
    standin.set("")
    flags = (f"--agent.memory-limit={POD_LIMIT}", "--sampling.interval=3s", "--sampling.timeout=3s")
    with running_agent(standin, tmp_path, flags, lambda b: GPU_INFO in b) as agent:
        standin.set("grownull")
        agent.until(
            "a child ended at the ceiling and replaced",
            lambda b: errors(b, "memory_ceiling") >= 1 and restarts(b) >= 1,
            timeout=40,
        )
        standin.set("")
        agent.until("NVML back", lambda b: GPU_INFO in b, timeout=30)
        logs = agent.logs()
        said = [ln for ln in logs.splitlines() if "killed by SIGSEGV with" in ln]
        assert said and f"memory ceiling of {ceiling >> 20} MiB in use" in said[0], logs[-5000:]
        assert "Traceback" not in logs
