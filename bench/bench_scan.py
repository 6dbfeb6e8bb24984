"""Log lines read per CPU-second by the throughput sampler, with and without the line filter
(``agent/throughput/scan.py``), side by side in one run on the same bytes.

Eight container logs in the kubelet's layout (CRI format) receive what
``bench_sizing.py``'s busy logs write (progress lines, and every 50th batch a Composer
throughput block and an NCCL INFO line): ``--seconds`` of ``--lines-per-second`` before
each pass. Two samplers in this process tail the same files: one hands every line to the
parsers (the filter off, as a stream with a custom regex does), one skips the lines that
cannot matter. Their passes alternate (which goes first too); each pass's CPU time
(``time.process_time``) is summed per sampler. Both must end with identical snapshots
(series, counts, NCCL): the filter changes the cost, never the result.

    python bench/bench_scan.py [--passes 20] [--json bench/results/scan.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_sizing import busy_lines  # noqa: E402

from agent.config import ThroughputSettings  # noqa: E402
from agent.throughput.records import ThroughputSnapshot  # noqa: E402
from agent.throughput.sampler import ThroughputSampler  # noqa: E402
from agent.throughput.stream import Stream  # noqa: E402


def sampler(root: Path, *, filtered: bool) -> ThroughputSampler:
    """A sampler whose streams filter (or not): its first pass opens the tails, which keep
    the ``filterable`` they were given."""
    s = ThroughputSampler(ThroughputSettings(pod_logs=str(root), pods="all"))
    original = Stream.filterable
    if not filtered:
        Stream.filterable = lambda self: False  # type: ignore[method-assign]
    try:
        s.sample()
    finally:
        Stream.filterable = original  # type: ignore[method-assign]
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", type=int, default=8)
    ap.add_argument("--lines-per-second", type=float, default=2000.0)
    ap.add_argument("--seconds", type=float, default=15.0, help="of log written per pass")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fabricscope-bench-scan-"))
    try:
        files = []
        for i in range(ns.logs):
            d = tmp / f"training_llm-{i}_00000000-0000-4000-8000-{i:012d}" / "trainer"
            d.mkdir(parents=True)
            files.append(d / "0.log")
            files[-1].touch()
        both = {"every line": sampler(tmp, filtered=False), "filtered": sampler(tmp, filtered=True)}
        cpu = dict.fromkeys(both, 0.0)
        ticks = int(ns.seconds * 10)
        per_tick = max(1, int(ns.lines_per_second / 10 / ns.logs))
        lines = batch = 0
        snaps: dict[str, ThroughputSnapshot] = {}
        for n in range(ns.passes):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
            for _ in range(ticks):
                batch += 1
                for i, f in enumerate(files):
                    text = busy_lines(stamp, batch, i, per_tick)
                    lines += text.count("\n")
                    with f.open("a") as h:
                        h.write(text)
            order = list(both) if n % 2 == 0 else list(reversed(both))
            for name in order:
                t0 = time.process_time()
                snaps[name] = both[name].sample()
                cpu[name] += time.process_time() - t0
        same = snaps["every line"] == snaps["filtered"]
        result = {
            "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "logs": ns.logs,
            "lines": lines,
            "bytes_per_line": round(sum(f.stat().st_size for f in files) / lines, 1),
            "passes": ns.passes,
            "identical_snapshots": same,
            "lines_per_cpu_second": {k: round(lines / v) for k, v in cpu.items()},
            "cpu_ms_per_pass": {k: round(1e3 * v / ns.passes, 2) for k, v in cpu.items()},
            "millicores_at_rate": {
                k: round(1e3 * ns.lines_per_second * v / lines, 2) for k, v in cpu.items()
            },
        }
        print(json.dumps(result, indent=2))
        if ns.json:
            ns.json.write_text(json.dumps(result, indent=2) + "\n")
        return 0 if same else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
