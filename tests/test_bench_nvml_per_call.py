"""bench/bench_nvml.py --per-call: every call the sampler makes into the API is timed and
counted per pass, and a pass's CPU is split into what the calls took and the rest (run here
over the 2x H200 recording; on a GPU node over live NVML)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_nvml  # noqa: E402

from agent.nvml.record import RecordingNvml, ReplayNvml, load  # noqa: E402
from agent.nvml.sampler import NvmlSampler  # noqa: E402

RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"


def test_per_call_counts_every_call_of_each_pass_and_splits_its_cpu() -> None:
    timed = bench_nvml.TimedNvml(ReplayNvml(load(str(RECORDING))))
    api = RecordingNvml(timed)  # type: ignore[arg-type]
    sampler = NvmlSampler(lambda: api, watch_xid=False)
    try:
        records, snap = bench_nvml.run_passes(api, sampler, 20, timed)
    finally:
        sampler.close()
    assert len(records) == 21 and all(r.timing is not None for r in records)
    later = [r.timing for r in records[1:] if r.timing is not None]
    report = bench_nvml.per_call_report(records[1:])
    by_fn = report["by_function"]
    assert isinstance(by_fn, dict)
    # every link of every GPU has its state asked each pass: 2 GPUs x 18 NVLinks
    up = sum(1 for g in snap.gpus for link in g.nvlinks if link.up)
    assert up == 36
    assert by_fn["nvlink_state"]["calls_per_pass"] == 36.0
    # each pass's calls as the recording proxy counted them, function by function
    assert sum(sum(c.values()) for c, _, _ in later) == sum(
        n for r in records[1:] for fn, n in r.calls.items() if fn != "NVML_NVLINK_MAX_LINKS"
    )
    cpu = [v["cpu_ms_per_pass"] for v in by_fn.values()]
    assert cpu == sorted(cpu, reverse=True)  # heaviest first
    assert report["in_calls_cpu_ms_median"] > 0
    assert report["pass_cpu_ms_median"] >= report["in_calls_cpu_ms_median"] * 0.5


def test_timed_api_passes_constants_through_and_times_only_calls() -> None:
    class Inner:
        LIMIT = 18

        def device_count(self) -> int:
            return 2

    timed = bench_nvml.TimedNvml(Inner())  # type: ignore[arg-type]
    assert timed.LIMIT == 18
    assert timed.device_count() == 2
    calls, cpu, wall = timed.take()
    assert calls == {"device_count": 1} and set(cpu) == set(wall) == {"device_count"}
    assert timed.take()[0] == {}  # taken: the next pass starts from nothing


def test_passes_come_pause_seconds_apart_and_the_xid_watch_is_the_agents() -> None:
    """``--pause`` spaces the passes (the agent's come an interval apart, cold); ``--xid``
    watches XID events as the agent does, so an event queued before a pass is counted."""
    import time

    replay = ReplayNvml(load(str(RECORDING)))
    api = RecordingNvml(replay)
    sampler = NvmlSampler(lambda: api, watch_xid=True)
    replay.feed_xid(1, 79)
    t0 = time.monotonic()
    records, snap = bench_nvml.run_passes(api, sampler, 2, None, 0.2)
    elapsed = time.monotonic() - t0
    sampler.close()
    assert len(records) == 3
    assert elapsed >= 0.4  # two pauses, between the three passes
    assert [(x.gpu, x.xid, x.count) for x in snap.xid_errors] == [(1, 79, 1)]
