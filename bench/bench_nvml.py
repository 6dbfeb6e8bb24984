"""Cost of NVML sampling passes: measured on this machine (run it on a GPU node), or modelled
from a recording with per-call costs measured on a GPU node.

Passes differ: the first reads everything; later ones read link states, the GPU-level
counters and a rotating share of the NVLink error counters (at the defaults, 1/18 of the
links' replay, recovery and CRC-flit, 1/72 of their crc_data and ecc_data), and each GPU
re-reads its static facts once per refresh period. So this reports the first pass apart,
then the median and the max over ``--passes`` later passes (default: two slow rotations,
and at least one static refresh of every GPU), NVML calls per pass (a batched
nvmlDeviceGetFieldValues is one call; its entries are counted apart), and the per-GPU cost
extrapolated to 8 GPUs x 18 NVLinks.

    python bench/bench_nvml.py [--passes N] [--json FILE]            # live NVML
    python bench/bench_nvml.py --replay tests/fixtures/nvml/h200x2.recording.json --fields

Live mode also reports this process's RSS with NVML loaded and whether it shows up among the
GPUs' compute processes (it must not: NVML needs no CUDA context). With ``--per-call`` it also
times every call of the API the sampler makes (:class:`TimedNvml`: this thread's CPU and the
wall time around each call into the binding) and reports, per function, calls and CPU per
later pass, and what of a pass's CPU no call accounts for (the sampler's own Python): where a
pass's time goes on a real node, which the per-call table below prices only in part.

Replay mode runs the same sampler over a recording (no GPU needed) and prices each pass's
calls with CPU costs measured by ``bench/nvml_fieldvalues.py`` (``MEASURED`` below: the 2x
H200 node, driver 580.159.04; ``--costs FILE`` takes that script's JSON output instead). A
call it has no measurement for is priced twice, at 0 and at the cost of
nvmlDeviceGetPcieReplayCounter (one driver round trip), and both totals are reported.
``--fields`` first adds the batched field answers the recording lacks, as
``tests/test_nvml_fixtures.with_field_values`` does (a node whose driver offers them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.nvml.api import LiveNvml, NvmlApi
from agent.nvml.record import RecordingNvml, ReplayNvml, load
from agent.nvml.sampler import NvmlSampler
from agent.nvml.snapshot import NvmlSnapshot
from bench.jsonout import emit

#: CPU seconds per call, ``bench/nvml_fieldvalues.py`` on the lent 2x H200 node (driver
#: 580.159.04, nvidia-ml-py 13.610); 200 repetitions each (50 for the batches)
MEASURED: dict[str, float] = {
    "cpu_s_per_NvLinkErrorCounter": 0.00046039670499999996,
    "cpu_s_per_NvLinkState": 1.5519299999999791e-06,
    "cpu_s_per_PcieReplayCounter": 0.00018371677000000004,
    "cpu_s_per_ComputeRunningProcesses": 1.1181114999999908e-05,
    "cpu_s_FieldValues_1": 0.00020872429999999997,  # one link-scoped field
    "cpu_s_FieldValues_108_links": 0.014518211440000001,  # 161-166 x 18 links
    "cpu_s_FieldValues_7_gpu": 0.0002328012200000007,  # 3, 4, 94, 142-145
}
#: fields that are GPU-level (cheap in a batch); every other field is priced as a link field
GPU_LEVEL_FIELDS = frozenset({3, 4, 94, 142, 143, 144, 145})
#: the NVLink traffic fields, asked over all links: priced as GPU-level fields until a run of
#: ``bench/nvml_fieldvalues.py`` measures them (``cpu_s_FieldValues_2_traffic_all_links``)
ALL_LINKS_FIELDS = frozenset({138, 139})
#: calls ``bench/nvml_fieldvalues.py`` times (its key -> the call) that the table above lacks:
#: priced from a ``--costs`` file that has them, else as unmeasured
OPTIONAL_CALLS = {
    "cpu_s_per_CurrPcieLinkGeneration": "nvmlDeviceGetCurrPcieLinkGeneration",
    "cpu_s_per_CurrPcieLinkWidth": "nvmlDeviceGetCurrPcieLinkWidth",
    "cpu_s_per_CurrentClocksEventReasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "cpu_s_per_NvLinkVersion": "nvmlDeviceGetNvLinkVersion",
    "cpu_s_per_NvLinkRemotePciInfo": "nvmlDeviceGetNvLinkRemotePciInfo",
    "cpu_s_per_DeviceCount": "nvmlDeviceGetCount",
    "cpu_s_per_MigMode": "nvmlDeviceGetMigMode",
    "cpu_s_per_GpuFabricInfo": "nvmlDeviceGetGpuFabricInfoV",
}
TARGET_GPUS, TARGET_LINKS = 8, 18


@dataclass(frozen=True)
class CostModel:
    """CPU seconds: per call of a function, and for nvmlDeviceGetFieldValues a base per call
    plus a price per entry (link-scoped or GPU-level)."""

    per_call: dict[str, float]
    field_call: float
    link_field: float
    gpu_field: float
    #: per entry of a field asked over all links (138/139, scope UINT_MAX), where measured
    all_links_field: float | None = None

    @classmethod
    def from_measured(cls, m: dict[str, float]) -> CostModel:
        """From ``bench/nvml_fieldvalues.py``'s output (or :data:`MEASURED`); a key it has
        as an error (``"error: NOT_SUPPORTED"``) stays unmeasured."""
        one, many = m["cpu_s_FieldValues_1"], m["cpu_s_FieldValues_108_links"]
        link_field = (many - one) / 107
        base = max(0.0, one - link_field)
        gpu_field = max(0.0, (m["cpu_s_FieldValues_7_gpu"] - base) / 7)
        per_call = {
            "nvmlDeviceGetNvLinkErrorCounter": m["cpu_s_per_NvLinkErrorCounter"],
            "nvmlDeviceGetNvLinkState": m["cpu_s_per_NvLinkState"],
            "nvmlDeviceGetPcieReplayCounter": m["cpu_s_per_PcieReplayCounter"],
            "nvmlDeviceGetComputeRunningProcesses": m["cpu_s_per_ComputeRunningProcesses"],
            "NVML_NVLINK_MAX_LINKS": 0.0,  # a constant of the binding, no call
        }
        for key, fn in OPTIONAL_CALLS.items():  # what newer runs of nvml_fieldvalues.py time
            if isinstance(m.get(key), float):
                per_call[fn] = m[key]
        traffic = m.get("cpu_s_FieldValues_2_traffic_all_links")
        all_links = max(0.0, (traffic - base) / 2) if isinstance(traffic, float) else None
        return cls(per_call, base, link_field, gpu_field, all_links)

    def price(
        self, calls: Counter[str], fields: Counter[int], unmeasured: float
    ) -> tuple[float, dict[str, int]]:
        """CPU seconds of one pass's calls, and the calls priced at ``unmeasured``."""
        total = 0.0
        unknown: dict[str, int] = {}
        for fn, n in calls.items():
            if fn == "nvmlDeviceGetFieldValues":
                total += n * self.field_call
            elif fn in self.per_call:
                total += n * self.per_call[fn]
            elif fn != "nvmlInit":  # once per process, not a pass's cost
                total += n * unmeasured
                unknown[fn] = n
        for field_id, n in fields.items():
            if field_id in ALL_LINKS_FIELDS and self.all_links_field is not None:
                total += n * self.all_links_field
            elif field_id in GPU_LEVEL_FIELDS or field_id in ALL_LINKS_FIELDS:
                total += n * self.gpu_field
            else:
                total += n * self.link_field
        return total, unknown


#: one pass's (calls, CPU seconds, wall seconds) per function (``--per-call``)
Timing = tuple[Counter[str], dict[str, float], dict[str, float]]


class TimedNvml:
    """An :class:`NvmlApi` that times each call into ``inner`` (``--per-call``): this thread's
    CPU (``time.thread_time``) and wall time per function, kept until :meth:`take`."""

    def __init__(self, inner: NvmlApi) -> None:
        self._inner = inner
        self.cpu: defaultdict[str, float] = defaultdict(float)
        self.wall: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> object:
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def timed(*args: object, **kwargs: object) -> object:
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                return target(*args, **kwargs)
            finally:
                self.cpu[name] += time.thread_time() - c0
                self.wall[name] += time.perf_counter() - w0
                self.calls[name] += 1

        return timed

    def take(self) -> Timing:
        """(calls, CPU seconds, wall seconds) per function since the last take."""
        out = (self.calls, dict(self.cpu), dict(self.wall))
        self.calls, self.cpu, self.wall = Counter(), defaultdict(float), defaultdict(float)
        return out


def per_call_report(records: Sequence[PassRecord]) -> dict[str, object]:
    """Per function over ``records`` (timed passes, :class:`TimedNvml`): calls, CPU and wall
    per pass, CPU per call; and the median pass's CPU that no call accounts for."""
    timed = [r.timing for r in records if r.timing is not None]
    pass_cpu = [r.cpu_seconds for r in records if r.timing is not None]
    n = len(timed)
    calls: Counter[str] = Counter()
    cpu: defaultdict[str, float] = defaultdict(float)
    wall: defaultdict[str, float] = defaultdict(float)
    for c, u, w in timed:
        calls.update(c)
        for fn, v in u.items():
            cpu[fn] += v
        for fn, v in w.items():
            wall[fn] += v
    in_calls = [sum(u.values()) for _, u, _ in timed]
    return {
        "by_function": {
            fn: {
                "calls_per_pass": round(calls[fn] / n, 2),
                "cpu_ms_per_pass": round(1e3 * cpu[fn] / n, 4),
                "wall_ms_per_pass": round(1e3 * wall[fn] / n, 4),
                "cpu_us_per_call": round(1e6 * cpu[fn] / calls[fn], 2),
            }
            for fn in sorted(cpu, key=lambda f: -cpu[f])
        },
        "pass_cpu_ms_median": round(1e3 * statistics.median(pass_cpu), 4),
        "in_calls_cpu_ms_median": round(1e3 * statistics.median(in_calls), 4),
        "outside_calls_cpu_ms_median": round(
            1e3 * statistics.median(p - c for p, c in zip(pass_cpu, in_calls, strict=True)), 4
        ),
    }


@dataclass
class PassRecord:
    cpu_seconds: float
    wall_seconds: float
    calls: Counter[str]
    fields: Counter[int]
    #: the pass's calls timed one by one (``--per-call``), else None
    timing: Timing | None = None


def run_passes(
    api: RecordingNvml,
    sampler: NvmlSampler,
    passes: int,
    timed: TimedNvml | None = None,
    pause: float = 0.0,
) -> tuple[list[PassRecord], NvmlSnapshot]:
    """The first pass, then ``passes`` more, ``pause`` seconds apart (0: back to back; the
    agent's passes come an interval apart, with the caches gone cold in between)."""
    out: list[PassRecord] = []
    snap = None
    for k in range(passes + 1):
        if k and pause:
            time.sleep(pause)
        api.counts.clear()
        api.fields_read.clear()
        if timed is not None:
            timed.take()
        w0, c0 = time.perf_counter(), time.process_time()
        snap = sampler.sample()
        out.append(
            PassRecord(
                time.process_time() - c0,
                time.perf_counter() - w0,
                Counter(api.counts),
                Counter(api.fields_read),
                None if timed is None else timed.take(),
            )
        )
    assert snap is not None
    return out, snap


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values)}


def extrapolate(per_pass: float, gpus: int, links_per_gpu: float) -> float:
    """Per-GPU cost of a pass scaled to 8 GPUs x 18 NVLinks (links scale the whole per-GPU
    cost: an over-estimate where GPU-level calls dominate)."""
    return per_pass / gpus * TARGET_GPUS * link_scale(links_per_gpu)


def link_scale(links_per_gpu: float) -> float:
    return max(1.0, TARGET_LINKS / max(1.0, links_per_gpu))


def extrapolated(costs: Sequence[float], gpus: int, links_per_gpu: float) -> dict[str, float]:
    """First, median and max pass on 8 GPUs x 18 links. The first pass and the median scale
    with the GPUs; the max pass is a GPU's static refresh, and GPUs take turns (one per
    pass), so only its excess over the median carries over, unscaled by GPUs."""
    first, rest = costs[0], costs[1:]
    median = statistics.median(rest)
    return {
        "first_pass": extrapolate(first, gpus, links_per_gpu),
        "median": extrapolate(median, gpus, links_per_gpu),
        "max": extrapolate(median, gpus, links_per_gpu)
        + (max(rest) - median) * link_scale(links_per_gpu),
    }


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1


def calls_report(records: Sequence[PassRecord]) -> dict[str, object]:
    first, later = records[0], records[1:]
    totals = [sum(r.calls.values()) for r in later]
    entries = [sum(r.fields.values()) for r in later]
    by_function: Counter[str] = Counter()
    for r in later:
        by_function.update(r.calls)
    return {
        "first_pass": sum(first.calls.values()),
        "first_pass_field_entries": sum(first.fields.values()),
        "later_passes_median": statistics.median(totals),
        "later_passes_max": max(totals),
        "later_field_entries_median": statistics.median(entries),
        "later_by_function_mean": {
            k: round(v / len(later), 2) for k, v in sorted(by_function.items())
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--passes", type=int, default=None, help="passes after the first")
    ap.add_argument("--replay", default=None, help="model from this recording (no GPU)")
    ap.add_argument("--fields", action="store_true", help="replay: add batched field answers")
    ap.add_argument("--costs", default=None, help="replay: nvml_fieldvalues.py output JSON")
    ap.add_argument("--rotation", type=int, default=18, help="link_error_rotation")
    ap.add_argument("--slow-rotation", type=int, default=72, help="slow_error_rotation")
    ap.add_argument("--static-refresh", type=int, default=40, help="static_refresh_passes")
    ap.add_argument("--json", default=None, help="also write the result here")
    ap.add_argument("--per-call", action="store_true", help="live: time every call (see TimedNvml)")
    ap.add_argument(
        "--pause", type=float, default=0.0, help="seconds between passes (0: back to back)"
    )
    ap.add_argument(
        "--xid",
        action="store_true",
        help="watch XID events as the agent does (an event set, polled at the end of each pass)",
    )
    args = ap.parse_args(argv)
    rss_before = rss_bytes()
    inner: NvmlApi
    if args.replay:
        recording = load(args.replay)
        if args.fields:
            from tests.nvml.test_nvml_fixtures import with_field_values

            recording = with_field_values(recording)
        inner = ReplayNvml(recording)
    else:
        inner = LiveNvml()
    timed = TimedNvml(inner) if args.per_call and not args.replay else None
    api = RecordingNvml(inner if timed is None else timed)  # type: ignore[arg-type]
    factory: Callable[[], NvmlApi] = lambda: api  # noqa: E731
    sampler = NvmlSampler(
        factory,
        watch_xid=args.xid,
        link_error_rotation=args.rotation,
        slow_error_rotation=args.slow_rotation,
        static_refresh_passes=args.static_refresh,
    )
    try:
        gpus_guess = 8  # enough passes for every GPU's refresh on an 8-GPU node
        passes = args.passes or max(2 * args.slow_rotation, args.static_refresh + gpus_guess)
        records, snap = run_passes(api, sampler, passes, timed, args.pause)
    finally:
        sampler.close()
    gpus = len(snap.gpus)
    up = sum(1 for g in snap.gpus for link in g.nvlinks if link.up)
    links_per_gpu = up / max(1, gpus)
    later = records[1:]
    result: dict[str, object] = {
        "mode": "replay" if args.replay else "live",
        "gpus": gpus,
        "nvlinks_up": up,
        "settings": {
            "link_error_rotation": args.rotation,
            "slow_error_rotation": args.slow_rotation,
            "static_refresh_passes": args.static_refresh,
            "watch_xid": args.xid,
            "pause_seconds": args.pause,
        },
        "passes_after_first": len(later),
        "calls_per_pass": calls_report(records),
        "issues": [f"{i.path}: {i.reason}" for i in snap.issues],
    }
    if args.replay:
        measured = MEASURED if args.costs is None else json.loads(Path(args.costs).read_text())
        model = CostModel.from_measured(measured)
        unmeasured_at = measured["cpu_s_per_PcieReplayCounter"]
        modelled: dict[str, object] = {
            "field_values_model_seconds": {
                "per_call": model.field_call,
                "per_link_field": model.link_field,
                "per_gpu_field": model.gpu_field,
            },
            "python_cpu_seconds_per_pass": summary([r.cpu_seconds for r in later]),
        }
        for label, price in (("unmeasured_at_0", 0.0), ("unmeasured_at_replay", unmeasured_at)):
            costs = [model.price(r.calls, r.fields, price)[0] for r in records]
            rest = costs[1:]
            modelled[label] = {
                "first_pass_cpu_seconds": costs[0],
                "cpu_seconds": summary(rest),
                "max_at_pass": 1 + rest.index(max(rest)),
                "extrapolated_8gpu_18link_cpu_seconds": extrapolated(costs, gpus, links_per_gpu),
            }
        modelled["unmeasured_calls_per_median_pass"] = model.price(
            later[len(later) // 2].calls, later[len(later) // 2].fields, 0.0
        )[1]
        result["modelled"] = modelled
    else:
        cpus = [r.cpu_seconds for r in later]
        pids = {p.pid for g in snap.gpus for p in g.compute_processes or ()}
        result |= {
            "first_pass_cpu_seconds": records[0].cpu_seconds,
            "cpu_seconds": summary(cpus),
            "max_at_pass": 1 + cpus.index(max(cpus)),
            "wall_seconds": summary([r.wall_seconds for r in later]),
            "extrapolated_8gpu_18link_cpu_seconds": extrapolated(
                [records[0].cpu_seconds, *cpus], gpus, links_per_gpu
            ),
            "rss_bytes_before_nvml": rss_before,
            "rss_bytes_with_nvml": rss_bytes(),
            "this_pid_is_a_gpu_compute_process": os.getpid() in pids,
        }
        if timed is not None:
            result["per_call"] = per_call_report(later)
    emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
