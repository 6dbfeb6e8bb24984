"""Does a supervised child grow with its passes? The NVML child (its real supervisor, pipe and
pickled answers; the stand-in ``libnvidia-ml.so.1`` of ``tests/nvml_standin``, built with
gcc) driven back to back for many passes, its resident memory (``VmRSS``) and its anonymous
pages (``smaps_rollup``) read after each chunk of passes, so that growth per pass is told
apart from growth with time (the soak, ``bench/soak.py``, runs passes at an interval: it
sees both together, and replaces the child every few minutes).

    python bench/bench_child_passes.py [--chunks 15] [--passes 8000] [--json FILE]

At the agent's default 15 s interval a node runs 5,760 passes a day: 120,000 passes are three
weeks of one child's life.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PASSES_PER_DAY = 86_400 / 15


def _kib(pid: int, path: str, key: str) -> int:
    with open(f"/proc/{pid}/{path}") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/{path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=15)
    ap.add_argument("--passes", type=int, default=8000, help="passes per chunk")
    ap.add_argument("--warmup", type=int, default=300, help="passes before the first reading")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from tests.standin_nvml import build_standin

    with tempfile.TemporaryDirectory(prefix="fs-child-passes-") as work:
        build_standin(Path(work))
        # the child is started by the supervisor below: it inherits this environment
        os.environ["LD_LIBRARY_PATH"] = f"{work}:{os.environ.get('LD_LIBRARY_PATH', '')}"
        from agent.nvml.sampler import isolated_sampler

        sampler = isolated_sampler({"watch_xid": False}, 10.0, memory_limit=512 << 20)
        try:
            for _ in range(args.warmup):
                sampler.sample()
            pid = sampler.pid
            assert pid is not None
            done = args.warmup
            rows = [(done, _kib(pid, "status", "VmRSS:"), _kib(pid, "smaps_rollup", "Anonymous:"))]
            started = time.monotonic()
            for _ in range(args.chunks):
                for _ in range(args.passes):
                    sampler.sample()
                done += args.passes
                assert sampler.pid == pid, "the child was replaced during the run"
                rss = _kib(pid, "status", "VmRSS:")
                rows.append((done, rss, _kib(pid, "smaps_rollup", "Anonymous:")))
                print(f"passes {done:>7}: RSS {rss / 1024:.2f} MiB", flush=True)
            seconds = time.monotonic() - started
        finally:
            sampler.close()

    half = len(rows) // 2
    (p0, r0, a0), (p1, r1, a1) = rows[half], rows[-1]
    late_rss = (r1 - r0) * 1024 / (p1 - p0)
    late_anon = (a1 - a0) * 1024 / (p1 - p0)
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "child": "nvml (stand-in library)",
        "passes": rows[-1][0],
        "seconds": round(seconds, 1),
        "rows": [{"passes": p, "rss_kib": r, "anonymous_kib": a} for p, r, a in rows],
        "rss_mib_first": round(rows[0][1] / 1024, 2),
        "rss_mib_last": round(rows[-1][1] / 1024, 2),
        "late_half": {
            "from_passes": p0,
            "rss_bytes_per_pass": round(late_rss, 3),
            "anonymous_bytes_per_pass": round(late_anon, 3),
            "rss_mib_per_day_at_15s": round(late_rss * PASSES_PER_DAY / (1 << 20), 3),
        },
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
