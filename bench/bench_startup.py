"""Start-up cost of the ``fabricscope`` command: ``--version``, ``--help`` and one
``agent --once`` on the DGX fixture tree, each run N times as a fresh process; prints wall
time (min, median) and CPU time of the process and its children (user + system; min,
median), which a busy machine inflates far less than wall time.

    .venv/bin/python bench/bench_startup.py [--runs 10] [--fabricscope .venv/bin/fabricscope]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (
    ["--version"],
    ["--help"],
    ["agent", "--once", "--no-sampler.netdev", f"--path.sysfs={ROOT}/tests/fixtures/dgx-h100/sys"],
)


def measure(exe: str, args: list[str], runs: int) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run(
            [exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
        )
        walls.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--fabricscope", default=str(ROOT / ".venv/bin/fabricscope"))
    ns = ap.parse_args()
    print("| command | wall min / median | CPU min / median |")
    print("| --- | --- | --- |")
    for args in COMMANDS:
        walls, cpus = measure(ns.fabricscope, args, ns.runs)
        shown = " ".join(a if "fixtures" not in a else "--path.sysfs=<dgx-h100>" for a in args)
        print(
            f"| `fabricscope {shown}` | {min(walls):.2f} / {statistics.median(walls):.2f} s "
            f"| {min(cpus):.2f} / {statistics.median(cpus):.2f} s |"
        )


if __name__ == "__main__":
    main()
