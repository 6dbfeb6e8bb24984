"""What running the NVML sampler in a child process (agent/core/isolation.py) costs, against the
same sampler in the agent's process: CPU per pass (agent and child), RSS of both, and the
latency from the start of a pass to fresh /metrics bytes (the runner's call, the pipe, the
unpickling and the rendering, as the agent does it).

    python bench/bench_isolation.py                    # replay the committed 2x H200 recording
    python bench/bench_isolation.py --live             # the node's NVML (a GPU machine)
    python bench/bench_isolation.py --live --json $OUT/isolation.json

Both modes run ``--passes`` passes back to back of each arrangement (in-process, then
isolated) at the given rotations, drop the first (it reads everything and, isolated, starts
the child) and report the median and 95th percentile. Replay prices the Python side only
(no driver time): the isolation overhead it shows is what a live node pays on top of the
driver's own cost (bench/bench_nvml.py measures that one).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.core.isolation import ChildSpec, IsolatedSampler
from agent.core.runner import SamplerSpec
from agent.core.sampler import Sampler
from agent.nvml.record import replay_sampler
from agent.nvml.sampler import NvmlSampler, child_sampler
from exporter.app import AgentApp

RECORDING = Path(__file__).resolve().parent.parent / "tests/fixtures/nvml/h200x2.recording.json"


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(sampler: Sampler, passes: int) -> dict[str, object]:
    """``passes`` passes through the agent's runner and exposition cache."""
    app = AgentApp([SamplerSpec(sampler, 1.0, 30.0)])
    rows: list[tuple[float, float, float]] = []  # wall, agent CPU, child CPU (seconds)
    child_cpu = 0.0
    for _ in range(passes):
        c0, t0 = time.process_time(), time.perf_counter()
        status = app.runner.run_sampler("nvml")  # renders the fresh bytes before returning
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert status.success and status.snapshot is not None, status
        stats = getattr(sampler, "last_stats", None)
        now_child = stats.cpu_seconds if stats is not None else 0.0
        rows.append((wall, cpu, now_child - child_cpu))
        child_cpu = now_child
    steady = rows[1:]
    out: dict[str, object] = {
        "passes": passes,
        "first_pass_ms": round(rows[0][0] * 1000, 2),
        "latency_ms_median": round(statistics.median(r[0] for r in steady) * 1000, 3),
        "latency_ms_p95": round(pct([r[0] for r in steady], 0.95) * 1000, 3),
        "agent_cpu_ms_per_pass": round(sum(r[1] for r in steady) / len(steady) * 1000, 3),
        "agent_rss_mib": round(rss_bytes() / 2**20, 1),
        "gpus": len(app.runner.status("nvml").snapshot.gpus),  # type: ignore[union-attr]
        "snapshot_bytes": len(pickle.dumps(app.runner.status("nvml").snapshot)),
    }
    stats = getattr(sampler, "last_stats", None)
    if stats is not None:
        # the child's CPU clock ticks at 10 ms: the mean over many passes is what counts
        out["child_cpu_ms_per_pass"] = round(sum(r[2] for r in steady) / len(steady) * 1000, 3)
        out["child_rss_mib"] = round(stats.rss_bytes / 2**20, 1)
    out["total_cpu_ms_per_pass"] = round(
        float(out["agent_cpu_ms_per_pass"]) + float(out.get("child_cpu_ms_per_pass", 0.0)),  # type: ignore[arg-type]
        3,
    )
    app.runner.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", action="store_true", help="the node's NVML instead of a replay")
    ap.add_argument("--recording", default=str(RECORDING), help="replayed (default: 2x H200)")
    ap.add_argument("--passes", type=int, default=300)
    ap.add_argument("--link-error-rotation", type=int, default=18)
    ap.add_argument("--slow-error-rotation", type=int, default=72)
    ap.add_argument("--json", default=None, metavar="FILE")
    ns = ap.parse_args()
    settings: dict[str, bool | int | float | str | None] = {
        "watch_xid": True,
        "link_error_rotation": ns.link_error_rotation,
        "slow_error_rotation": ns.slow_error_rotation,
    }
    local: Callable[[], NvmlSampler]
    if ns.live:
        spec = ChildSpec("agent.nvml.sampler:child_sampler", settings)
        local = lambda: child_sampler(**settings)  # type: ignore[arg-type]  # noqa: E731
    else:
        replay = {**settings, "recording": ns.recording}
        spec = ChildSpec("agent.nvml.record:replay_sampler", replay)
        local = lambda: replay_sampler(recording=ns.recording, **settings)  # type: ignore[arg-type]  # noqa: E731
    base_rss = rss_bytes()
    in_process = local()
    report: dict[str, object] = {
        "mode": "live" if ns.live else f"replay {ns.recording}",
        "rotations": [ns.link_error_rotation, ns.slow_error_rotation],
        "agent_rss_mib_before": round(base_rss / 2**20, 1),
        "in_process": run(in_process, ns.passes),
    }
    isolated = IsolatedSampler("nvml", spec, timeout_seconds=10.0)
    report["isolated"] = run(isolated, ns.passes)
    a, b = report["in_process"], report["isolated"]
    assert isinstance(a, dict) and isinstance(b, dict)
    report["overhead"] = {
        "cpu_ms_per_pass": round(b["total_cpu_ms_per_pass"] - a["total_cpu_ms_per_pass"], 3),
        "latency_ms_median": round(b["latency_ms_median"] - a["latency_ms_median"], 3),
        "rss_mib_child": b.get("child_rss_mib"),
    }
    text = json.dumps(report, indent=1)
    print(text)
    print(
        f"\n{'':12}{'latency ms':>12}{'p95':>8}{'agent CPU ms':>14}{'child CPU ms':>14}"
        f"{'agent RSS':>11}{'child RSS':>11}"
    )
    for name in ("in_process", "isolated"):
        r = report[name]
        assert isinstance(r, dict)
        print(
            f"{name:12}{r['latency_ms_median']:>12}{r['latency_ms_p95']:>8}"
            f"{r['agent_cpu_ms_per_pass']:>14}{r.get('child_cpu_ms_per_pass', '-'):>14}"
            f"{r['agent_rss_mib']:>11}{r.get('child_rss_mib', '-'):>11}"
        )
    if ns.json:
        Path(ns.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
