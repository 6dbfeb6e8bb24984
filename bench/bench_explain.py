"""Time to answer of ``fabricscope explain`` for a 64-node job over 6 hours of data.

The data: tests/explain_lab.py's ``ib_link_bad`` scenario (series named and labelled by the
real agent from the DGX fixture tree and the recorded NVML: 12 RDMA ports, PCI links,
2 GPUs with 18 NVLinks each, netdev, attribution, workload, probe and throughput series per
node), 64 nodes, 6 hours at a 30 s scrape interval, backfilled with promtool and served by
a real Prometheus (2.42). The job's throughput drops 34 % at 55 % of the window; node-02's
mlx5_3 port starts taking symbol errors then.

Measured: wall time of the whole command (``python -m exporter.cli explain``, interpreter
start included) over ``--runs`` runs, and explain's own elapsed time (what it prints).

    python bench/bench_explain.py [--runs 5] [--workdir /tmp/fabricscope-bench-explain]
        [--plot docs/explain-ib_link_bad.png]

The TSDB is built once per --workdir (about 2-3 minutes on 2 cores) and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.explain.client import ClientSettings, PrometheusClient  # noqa: E402
from tests import explain_lab  # noqa: E402
from tests.promharness import start_prometheus  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--step", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fabricscope-bench-explain"))
    ap.add_argument("--plot", type=Path, default=None, help="also write the plot of one run")
    ns = ap.parse_args()
    key = f"{ns.nodes}-{ns.hours:g}h-{ns.step:g}s"
    build = ns.workdir / key
    meta = build / "slots.json"
    if not meta.exists():
        shutil.rmtree(build, ignore_errors=True)
        t0 = time.perf_counter()
        _, slots = explain_lab.build(
            build, scenarios=("ib_link_bad",), nodes=ns.nodes, hours=ns.hours, step=ns.step
        )
        s = slots[0]
        meta.write_text(json.dumps({"start": s.start, "end": s.end, "change": s.change}))
        print(f"built {key} in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
    slot = json.loads(meta.read_text())
    series = samples = 0
    shutil.rmtree(ns.workdir / "prom", ignore_errors=True)
    with start_prometheus(ns.workdir / "prom", [], tsdb_path=build / "tsdb") as prom:
        client = PrometheusClient(ClientSettings(prom.url, timeout=60))
        count = "count({__name__=~'fabricscope_.+'})"
        series = int(client.query(count, slot["end"])[0].value)
        samples = int(series * (ns.hours * 3600 / ns.step + 1))
        args = [
            sys.executable,
            "-m",
            "exporter.cli",
            "explain",
            "--prometheus.url",
            prom.url,
            "--namespace",
            "training",
            "--job",
            "llm",
            "--since",
            f"{slot['start']:.0f}",
            "--until",
            f"{slot['end']:.0f}",
            "--grafana.url",
            "https://grafana.example",
        ]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        walls, elapsed = [], []
        transcript = ""
        for i in range(ns.runs):
            extra = ["--plot", str(ns.plot)] if ns.plot and i == 0 else []
            t0 = time.perf_counter()
            out = subprocess.run(
                [*args, *extra], capture_output=True, text=True, env=env, check=False
            )
            wall = time.perf_counter() - t0
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            if not extra:
                walls.append(wall)
            transcript = transcript or out.stdout
            elapsed.append(float(out.stdout.rsplit("answered in ", 1)[1].split("s")[0]))
        js = subprocess.run(
            [*args, "--format", "json"], capture_output=True, text=True, env=env, check=True
        )
        top = json.loads(js.stdout)["findings"][0]
    print(transcript)
    print(
        f"{ns.nodes} nodes, {ns.hours:g} h at {ns.step:g} s: {series} series, "
        f"~{samples / 1e6:.1f}M samples in the TSDB; top finding: {top['cause']} "
        f"{top['device']} ({top['score']})"
    )
    median, worst = statistics.median(walls), max(walls)
    print(
        f"time to answer (whole command, {len(walls)} runs): median {median:.2f}s, max "
        f"{worst:.2f}s; explain's own elapsed: median {statistics.median(elapsed):.2f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
