"""CPU time of one throughput pass in process: 64 pods' CRI logs, 150 Composer lines each
appended before every pass (9,600 lines, the 64 pods x 10 lines/s x 15 s of
bench_throughput.py), 10 passes, mean CPU per pass. Run it against another checkout of the
agent to compare two versions under the same machine load:

    PYTHONPATH=$PWD .venv/bin/python bench/bench_throughput_pass.py new
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/bench_throughput_pass.py old
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from agent.config import ThroughputSettings
from agent.throughput.sampler import ThroughputSampler

LINE = "2026-11-20T10:00:{:02d}.123456789Z stdout F \t Train throughput/tokens_per_sec: {}.5\n"


def main() -> int:
    label = sys.argv[1] if len(sys.argv) > 1 else "this checkout"
    tmp = Path(tempfile.mkdtemp(prefix="fabricscope-bench-pass-"))
    try:
        paths = []
        for i in range(64):
            d = tmp / f"training_llm-{i}_0b8a7c1e-{i:04d}-4c43-8d6c-6a3a8f2f11aa" / "trainer"
            d.mkdir(parents=True)
            paths.append(d / "0.log")
            paths[-1].touch()
        sampler = ThroughputSampler(ThroughputSettings(pod_logs=str(tmp), pods="all"))
        sampler.sample()
        total = 0.0
        for _ in range(10):
            for p in paths:
                with p.open("a") as f:
                    f.write("".join(LINE.format(j % 60, j) for j in range(150)))
            t0 = time.process_time()
            sampler.sample()
            total += time.process_time() - t0
        print(f"{label}: {total / 10 * 1e3:.1f} ms CPU per pass of 9600 lines")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
