"""The agent's own cost on /metrics: process_* of the main process and of each supervised
child, read from /proc (real processes: this one, and a real child running the recorded
2x H200 NVML replay)."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from agent.core.ceiling import data_bytes
from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.core.procstat import PAGE, TICKS, boot_time, parse_stat, read_process
from agent.core.runner import SamplerSpec
from exporter.app import AgentApp

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"

#: /proc/PID/stat of `cat` on this machine (Linux 6.x), and the same with a hostile command
#: name: spaces and a ")" inside the parentheses
CAT = (
    "31356 (cat) R 31344 31344 3593 0 -1 4194304 126 0 0 0 7 3 0 0 20 0 1 0 118849 "
    "3133440 379 18446744073709551615 94476543934464 94476543954345 0 0 0 0 0 0 0 0 0 17 0"
)


@pytest.mark.parametrize("comm", ["cat", "a b) c", ") ("])
def test_parse_stat_reads_cpu_start_and_rss_whatever_the_command_name(comm: str) -> None:
    line = CAT.replace("(cat)", f"({comm})")
    assert parse_stat(line) == (10, 118849, 379)


def test_parse_stat_rejects_a_short_line() -> None:
    with pytest.raises((ValueError, IndexError)):
        parse_stat("12 (x) R 1 2")


def test_read_process_counts_this_process_fds_and_memory() -> None:
    before = read_process()
    assert before is not None and before.pid == os.getpid()
    statm_rss = int(Path("/proc/self/statm").read_text().split()[1]) * PAGE
    assert abs(before.rss_bytes - statm_rss) < 8 << 20
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(10)]
    try:
        during = read_process()
        assert during is not None and during.open_fds == (before.open_fds or 0) + 10
    finally:
        for fd in fds:
            os.close(fd)
    booted = boot_time()
    assert booted is not None and before.start_time_seconds is not None
    assert booted < before.start_time_seconds <= time.time()
    assert before.cpu_seconds * TICKS >= 1  # an interpreter that imported pytest spent CPU


def test_reading_a_process_interns_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child reads its own /proc entry after every pass (and the agent reads a child's
    memory every 50 ms while it waits): pathlib would intern the pid's text each time, and
    each interned string that dies uses up a slot of the interpreter's interned-string table,
    which is rebuilt larger when the slots run out (half a MiB for good in the NVML child after
    ~10,000 passes). Reading a process interns no string."""
    interned: list[str] = []
    real = sys.intern

    def spy(text: str) -> str:
        interned.append(text)
        return real(text)

    monkeypatch.setattr(sys, "intern", spy)
    Path(f"/proc/{os.getpid()}/stat")  # the check can fail: pathlib interns the parts
    assert interned
    interned.clear()
    assert read_process() is not None
    assert read_process(pid=os.getppid()) is not None
    assert data_bytes() is not None and data_bytes(os.getppid()) is not None
    assert interned == []


def test_a_process_gone_is_none(tmp_path: Path) -> None:
    assert read_process(pid=2**22 + 1) is None
    assert read_process(pid=1, proc=tmp_path) is None  # no /proc there


def _value(body: str, name: str, child: str) -> float:
    m = re.search(rf'^{name}{{child="{child}"}} (\S+)$', body, re.M)
    assert m, f"{name}{{child={child!r}}} missing"
    return float(m.group(1))


def test_the_agent_exports_its_own_and_each_childs_cost() -> None:
    """The main process unlabelled (child=""), the NVML child labelled; the child's figures are
    its own (its pid's RSS), and a replaced child shows a new start time."""
    spec = ChildSpec("agent.nvml.record:replay_sampler", {"recording": str(RECORDING)})
    isolated = IsolatedSampler("nvml", spec, timeout_seconds=20, backoff_seconds=0.0)
    app = AgentApp([SamplerSpec(isolated, 1.0, 30.0)], memory_limit_bytes=256 << 20)
    try:
        app.runner.run_once()
        body = app.cache.body().decode()
        pid = isolated.pid
        assert pid is not None
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        assert abs(_value(body, "process_resident_memory_bytes", "nvml") - rss) < 4 << 20
        assert _value(body, "process_resident_memory_bytes", "") > 10 << 20
        assert _value(body, "process_open_fds", "nvml") >= 3
        assert _value(body, "process_cpu_seconds_total", "") > 0
        started = _value(body, "process_start_time_seconds", "nvml")
        assert "fabricscope_agent_memory_limit_bytes 2.68435456e+08" in body
        os.kill(pid, signal.SIGKILL)
        app.runner.run_once()  # crashed: no child runs, so no child series
        body = app.cache.body().decode()
        assert 'process_resident_memory_bytes{child="nvml"}' not in body
        deadline = time.monotonic() + 30
        while isolated.pid in (None, pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # past the backoff: the next pass starts a new child
            app.runner.run_once()
        body = app.cache.body().decode()
        assert isolated.pid not in (None, pid)
        assert _value(body, "process_start_time_seconds", "nvml") >= started
        assert _value(body, "process_resident_memory_bytes", "nvml") > 0
    finally:
        isolated.close()
