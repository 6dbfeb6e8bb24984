"""The runner: failure isolation, timeouts without thread pile-up, per-sampler status."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from agent.core.errors import NoData
from agent.core.runner import ERROR_REASONS, Runner, SamplerSpec
from agent.core.sysfs import ReadIssue
from tests.cycles import cyclic_garbage


@dataclass(frozen=True, slots=True)
class FakeSnapshot:
    value: int
    issues: tuple[ReadIssue, ...] = ()


class Counting:
    """A sampler that returns its call count; behaviour per call set by ``plan``."""

    def __init__(self, name: str, plan: list[str] | None = None) -> None:
        self.name = name
        self.plan = plan or []
        self.calls = 0
        self.release = threading.Event()

    def sample(self) -> FakeSnapshot:
        self.calls += 1
        step = self.plan[self.calls - 1] if self.calls <= len(self.plan) else "ok"
        if step == "raise":
            raise RuntimeError("boom")
        if step == "nodata":
            raise NoData("no such hardware")
        if step == "hang":
            self.release.wait(10)
        if step == "issues":
            return FakeSnapshot(
                self.calls, (ReadIssue("a/b", "io", "EIO"), ReadIssue("c", "parse", "x"))
            )
        return FakeSnapshot(self.calls)


def test_exception_in_one_sampler_does_not_affect_another() -> None:
    bad, good = Counting("bad", ["raise"]), Counting("good")
    runner = Runner([SamplerSpec(bad, 1, 1), SamplerSpec(good, 1, 1)])
    st = runner.run_once()
    assert not st["bad"].success and st["bad"].snapshot is None
    assert st["bad"].error_count("exception") == 1
    assert st["good"].success and st["good"].snapshot == FakeSnapshot(1)
    assert st["good"].error_count("exception") == 0


def test_nodata_is_success_without_hardware() -> None:
    s = Counting("ib", ["nodata"])
    st = Runner([SamplerSpec(s, 1, 1)]).run_once()["ib"]
    assert st.success and not st.hardware_present and st.snapshot is None
    assert dict(st.errors_total) == dict.fromkeys(ERROR_REASONS, 0)


def test_timeout_is_counted_and_a_hung_call_is_never_doubled() -> None:
    s = Counting("slow", ["hang"])
    runner = Runner([SamplerSpec(s, 0.2, 0.1)])
    t0 = time.monotonic()
    st = runner.run_sampler("slow")
    assert time.monotonic() - t0 < 1.0
    assert not st.success and st.error_count("timeout") == 1 and st.snapshot is None
    threads_before = threading.active_count()
    # while the first call hangs, further passes are skipped, not stacked
    for _ in range(5):
        st = runner.run_sampler("slow")
    assert s.calls == 1
    assert st.error_count("still_running") == 5
    assert threading.active_count() == threads_before
    s.release.set()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        st = runner.run_sampler("slow")
        if st.success:
            break
        time.sleep(0.01)
    assert st.success and s.calls == 2 and st.snapshot == FakeSnapshot(2)


def test_read_issues_are_counted_by_reason_across_passes() -> None:
    s = Counting("x", ["issues", "issues", "ok"])
    runner = Runner([SamplerSpec(s, 1, 1)])
    for _ in range(3):
        st = runner.run_sampler("x")
    assert dict(st.read_errors_total) == {"io": 2, "parse": 2}
    assert st.snapshot == FakeSnapshot(3)


def test_failure_withdraws_the_previous_snapshot() -> None:
    s = Counting("x", ["ok", "raise"])
    runner = Runner([SamplerSpec(s, 1, 1)])
    assert runner.run_sampler("x").snapshot == FakeSnapshot(1)
    st = runner.run_sampler("x")
    assert st.snapshot is None and not st.success
    assert st.last_success_timestamp_seconds is not None


def test_background_schedule_runs_each_sampler_repeatedly_and_stops() -> None:
    seen: list[str] = []
    a, b = Counting("a"), Counting("b")
    runner = Runner([SamplerSpec(a, 0.05, 0.05), SamplerSpec(b, 0.05, 0.05)], on_update=seen.append)
    runner.start()
    deadline = time.monotonic() + 5
    while (a.calls < 3 or b.calls < 3) and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.stop()
    assert a.calls >= 3 and b.calls >= 3
    assert {"a", "b"} <= set(seen)
    calls = a.calls
    time.sleep(0.2)
    assert a.calls == calls  # stopped


def test_failing_update_callback_is_isolated() -> None:
    def bad_callback(name: str) -> None:
        raise ValueError(name)

    s = Counting("x")
    st = Runner([SamplerSpec(s, 1, 1)], on_update=bad_callback).run_once()["x"]
    assert st.success


def test_file_issue_transitions_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    s = Counting("x", ["issues", "issues", "ok"])
    runner = Runner([SamplerSpec(s, 1, 1)])
    with caplog.at_level("INFO", logger="agent.core.runner"):
        for _ in range(3):
            runner.run_sampler("x")
    cannot = [r for r in caplog.records if "cannot use a/b" in r.getMessage()]
    again = [r for r in caplog.records if "a/b readable again" in r.getMessage()]
    assert len(cannot) == 1 and len(again) == 1


def test_duplicate_names_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Runner([SamplerSpec(Counting("a")), SamplerSpec(Counting("a"))])


def test_one_info_line_per_sampler_at_start_and_recovered_only_after_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first pass says what each sampler found, or why it has nothing, at INFO; a good
    pass after no hardware is "hardware appeared", never "recovered"; "recovered" follows a
    failure only; each line once, not every pass."""
    caplog.set_level("INFO", logger="agent.core.runner")
    quiet = Counting("quiet", ["nodata", "ok", "ok"])
    flaky = Counting("flaky", ["ok", "raise", "ok", "ok"])
    runner = Runner([SamplerSpec(quiet, 1, 1), SamplerSpec(flaky, 1, 1)], announce=True)
    runner.run_once()
    mine = ("sampler quiet", "sampler flaky")
    first = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "INFO" and r.getMessage().startswith(mine)
    ]
    # the samplers run side by side: their lines come in either order, each once
    assert sorted(first) == [
        "sampler flaky: nothing found",
        "sampler quiet: nothing to sample: no such hardware",
    ]
    caplog.clear()
    for _ in range(3):
        runner.run_once()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(mine)]
    assert lines.count("sampler quiet: hardware appeared: nothing found") == 1
    assert not any("quiet recovered" in line for line in lines)
    assert sum("sampler flaky recovered" in line for line in lines) == 1
    assert sum("sampler flaky failed" in line for line in lines) == 1


def test_one_shot_commands_keep_the_start_lines_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """topo and snapshot print their own result: their runner says nothing at INFO."""
    caplog.set_level("INFO", logger="agent.core.runner")
    Runner([SamplerSpec(Counting("quiet1", ["nodata"]), 1, 1)]).run_once()
    assert not [r for r in caplog.records if r.getMessage().startswith("sampler quiet1")]


def test_a_failed_pass_leaves_no_cycle_to_the_collector() -> None:
    # the exception a pass raised holds its traceback, which holds the pass's frame, which held
    # the box the exception was put in: one cycle per failed pass until the box is emptied
    s = Counting("flaky", ["nodata", "raise", "nodata"])
    runner = Runner([SamplerSpec(s, 1, 1)])
    runner.run_sampler("flaky")  # the first thread of the process: not a pass's garbage

    def two_failed_passes() -> None:
        runner.run_sampler("flaky")
        runner.run_sampler("flaky")

    left = [type(o).__qualname__ for o in cyclic_garbage(two_failed_passes)]
    assert "NoData" not in left and "RuntimeError" not in left and "frame" not in left, left
    assert runner.status("flaky").error_count("exception") == 1


class Spending:
    """A sampler whose pass burns ``burn`` seconds of its thread's CPU, then sleeps ``nap``."""

    def __init__(self, name: str, burn: float, nap: float) -> None:
        self.name, self.burn, self.nap = name, burn, nap

    def sample(self) -> FakeSnapshot:
        end = time.thread_time() + self.burn
        while time.thread_time() < end:
            pass
        time.sleep(self.nap)
        return FakeSnapshot(0)


def test_each_sampler_is_charged_the_cpu_of_its_own_passes_not_their_wall_time() -> None:
    """fabricscope_sampler_cpu_seconds_total: a pass's thread's CPU, summed over passes; a pass
    that sleeps is not charged its sleep, and one sampler's CPU is not another's."""
    busy, idle = Spending("busy", 0.05, 0.0), Spending("idle", 0.0, 0.1)
    runner = Runner([SamplerSpec(busy, 1, 5), SamplerSpec(idle, 1, 5)])
    runner.run_once()
    st = runner.run_once()
    assert 0.1 <= st["busy"].cpu_seconds_total < 0.5
    assert st["idle"].cpu_seconds_total < 0.05  # 0.2 s asleep over two passes
    assert st["idle"].duration_seconds is not None and st["idle"].duration_seconds >= 0.1


class Where:
    """A sampler that notes the thread each of its passes ran on."""

    name = "where"

    def __init__(self) -> None:
        self.threads: list[int] = []

    def sample(self) -> FakeSnapshot:
        self.threads.append(threading.get_ident())
        return FakeSnapshot(len(self.threads))


def _alive(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == name)


def test_a_samplers_passes_share_one_thread_which_ends_with_the_runner() -> None:
    """One pass thread a sampler, kept between passes (a thread started per pass cost about
    0.6 ms of CPU each), never the schedule's own thread; stop() ends it."""
    s = Where()
    runner = Runner([SamplerSpec(s, 0.02, 1)])
    runner.start()
    deadline = time.monotonic() + 5
    while len(s.threads) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(s.threads) >= 5 and len(set(s.threads)) == 1
    assert _alive("sample-where") == 1 and _alive("sampler-where") == 1
    runner.stop()
    deadline = time.monotonic() + 5
    while _alive("sample-where") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _alive("sample-where") == 0 and _alive("sampler-where") == 0


def test_one_shot_runs_leave_no_pass_thread_behind() -> None:
    s = Where()
    runner = Runner([SamplerSpec(s, 1, 1)])
    runner.run_once()
    runner.run_once()
    assert len(s.threads) == 2
    deadline = time.monotonic() + 5
    while _alive("sample-where") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _alive("sample-where") == 0
