"""Where ``fabricscope explain``'s CPU goes for a large job: before its first check is asked,
while Prometheus answers the checks, and after the last answer (judging the changes near
the threshold, grouping, ranking, counting and writing the report), when nothing else
keeps the second core busy and every CPU-second is a second of the answer's wall time.

The job and its Prometheus are bench/bench_explain.py's (the same TSDB per --workdir, built
once). Each checkout's explain runs in its own interpreter (its own ``exporter``), in
process with its phases marked: the process's CPU seconds and the wall seconds at the end of
``evidence.evaluate`` (every check's answers in and compared) and at the end of the answer;
the checkouts take turns, who goes first alternating. One JSON line per run on stdout.

    python bench/explain_phases.py [--nodes 1024] [--hours 1] [--runs 2]
        [--workdir /tmp/fabricscope-bench-explain] [--against /path/to/another/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _child(url: str, since: str, until: str) -> None:
    """Run explain in this process (its checkout first on sys.path) with its phases marked."""
    from exporter.cli.main import main
    from exporter.explain import report

    t0, c0 = time.perf_counter(), time.process_time()
    marks: dict[str, tuple[float, float]] = {}
    evaluate = report.evidence.evaluate

    def marked(*args: object, **kwargs: object) -> object:
        out = evaluate(*args, **kwargs)  # type: ignore[arg-type]
        marks["answers_in"] = (time.perf_counter() - t0, time.process_time() - c0)
        return out

    report.evidence.evaluate = marked  # type: ignore[assignment]
    args = ["explain", "--prometheus.url", url, "--prometheus.timeout", "2m"]
    args += ["--deadline", "10m", "--namespace", "training", "--job", "llm"]
    args += ["--since", since, "--until", until, "--grafana.url", "https://grafana.example"]
    with open(os.devnull, "w") as null:
        saved, sys.stdout = sys.stdout, null
        try:
            main(args)
        finally:
            sys.stdout = saved
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    wall_in, cpu_in = marks["answers_in"]
    row = {"wall_s": wall, "cpu_s": cpu, "cpu_after_answers_s": cpu - cpu_in}
    row["wall_after_answers_s"] = wall - wall_in
    print(json.dumps(row))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fabricscope-bench-explain"))
    ap.add_argument("--against", type=Path, default=None, help="another checkout, side by side")
    ap.add_argument("--child", nargs=3, metavar=("URL", "SINCE", "UNTIL"), help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        _child(*ns.child)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    import bench_explain

    build, slot = bench_explain._build(ns.workdir, ns.nodes, ns.hours, ns.step)
    checkouts = [ROOT] + ([ns.against.resolve()] if ns.against else [])
    rows: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    with bench_explain.serve("prometheus", ns.workdir, build / "tsdb") as (url, _, _):
        window = [f"{slot['start']:.0f}", f"{slot['end']:.0f}"]
        for i in range(ns.runs):
            for code in checkouts if i % 2 == 0 else checkouts[::-1]:
                env = dict(os.environ, PYTHONPATH=str(code))
                cmd = [sys.executable, __file__, "--child", url, *window]
                out = subprocess.run(
                    cmd, env=env, cwd=code, capture_output=True, text=True, check=False
                )
                if out.returncode != 0:
                    print(out.stderr, file=sys.stderr)
                    return 1
                row = json.loads(out.stdout.strip().splitlines()[-1])
                rows[code].append(row)
                print(json.dumps({"checkout": str(code), "run": i, **row}), flush=True)
    for code, got in rows.items():
        medians = {k: round(statistics.median(r[k] for r in got), 2) for k in got[0]}
        print(json.dumps({"checkout": str(code), "median": medians}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
