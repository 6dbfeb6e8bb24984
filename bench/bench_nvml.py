"""Cost of one NVML sampling pass on this machine (run it on a GPU node).

Wall and CPU time per pass (median of --passes after 3 warm-up passes), NVML calls per
pass, the per-GPU cost extrapolated to 8 GPUs x 18 NVLinks, this process's RSS with NVML
loaded, and whether this process appears among any GPU's compute processes (it must not:
NVML needs no CUDA context).

    python bench/bench_nvml.py [--passes 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.nvml import LiveNvml, NvmlApi, NvmlSampler
from agent.nvml_record import RecordingNvml


class Counting(RecordingNvml):
    """Counts calls per pass (every NvmlApi method goes through ``_rec``)."""

    def __init__(self, inner: NvmlApi) -> None:
        super().__init__(inner)
        self.count: Counter[str] = Counter()

    def _rec(self, call, args, thunk):  # type: ignore[no-untyped-def]
        self.count[call] += 1
        return super()._rec(call, args, thunk)


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return -1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rss_before = rss_bytes()
    api = Counting(LiveNvml())
    sampler = NvmlSampler(lambda: api, watch_xid=False)
    for _ in range(3):
        snap = sampler.sample()
    api.count.clear()
    walls, cpus = [], []
    for _ in range(args.passes):
        w0, c0 = time.perf_counter(), time.process_time()
        snap = sampler.sample()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    calls_per_pass = sum(api.count.values()) / args.passes
    gpus = len(snap.gpus)
    links = sum(len(g.nvlinks) for g in snap.gpus)
    up = sum(1 for g in snap.gpus for link in g.nvlinks if link.up)
    cpu = statistics.median(cpus)
    per_gpu_cpu = cpu / gpus
    pids = {p.pid for g in snap.gpus for p in g.compute_processes}
    result = {
        "gpus": gpus,
        "nvlinks_probed": links,
        "nvlinks_up": up,
        "passes": args.passes,
        "wall_seconds_median": statistics.median(walls),
        "cpu_seconds_median": cpu,
        "calls_per_pass": calls_per_pass,
        "calls_by_function": dict(sorted((k, v / args.passes) for k, v in api.count.items())),
        "per_gpu_cpu_seconds": per_gpu_cpu,
        "extrapolated_8gpu_cpu_seconds": per_gpu_cpu * 8 * (18 / max(1, up / gpus)),
        "rss_bytes_before_nvml": rss_before,
        "rss_bytes_with_nvml": rss_bytes(),
        "this_pid_is_a_gpu_compute_process": os.getpid() in pids,
        "issues": [f"{i.path}: {i.reason}" for i in snap.issues],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
