"""Does a supervised child grow with its passes? The NVML child (its real supervisor, pipe and
pickled answers; the stand-in ``libnvidia-ml.so.1`` of ``tests/nvml_standin``, built with
gcc) driven back to back for many passes, its resident memory (``VmRSS``) and its anonymous
pages (``smaps_rollup``) read after each chunk of passes, so that growth per pass is told
apart from growth with time (the soak, ``bench/soak.py``, runs passes at an interval: it
sees both together, and replaces the child every few minutes).

    python bench/bench_child_passes.py [--child nvml|throughput] [--chunks 15] [--passes 8000]
        [--json FILE]

``--child throughput``: the throughput child instead, reading ``--logs`` container logs
(kubelet layout, CRI lines: ``bench/bench_sizing.py``'s training job) to which each pass
appends ``--lines`` lines apiece, rotated as the kubelet rotates them (``0.log`` renamed to
``0.log.<n>``, a new ``0.log``, the oldest removed past 2) every ``--rotate`` passes.

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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sizing import busy_lines

from agent.core.isolation import IsolatedSampler

PASSES_PER_DAY = 86_400 / 15


def _kib(pid: int, path: str, key: str) -> int:
    with open(f"/proc/{pid}/{path}") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/{path}")


def _nvml(work: Path) -> IsolatedSampler:
    from tests.standin_nvml import build_standin

    build_standin(work)
    # the child is started by the supervisor below: it inherits this environment
    os.environ["LD_LIBRARY_PATH"] = f"{work}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    from agent.nvml.sampler import isolated_sampler

    return isolated_sampler({"watch_xid": False}, 10.0, memory_limit=512 << 20)


class RotatingLogs:
    """Container logs written between passes, rotated as the kubelet rotates them."""

    def __init__(self, root: Path, n: int, lines: int, every: int) -> None:
        self.files = []
        for i in range(n):
            d = root / f"training_llm-{i}_00000000-0000-4000-8000-{i:012d}" / "trainer"
            d.mkdir(parents=True)
            self.files.append(d / "0.log")
            self.files[-1].touch()
        self.root, self.lines, self.every = root, lines, every

    def write(self, n: int) -> None:
        if n and n % self.every == 0:
            for f in self.files:
                f.rename(f.with_name(f"0.log.{n:09d}"))
                for old in sorted(f.parent.glob("0.log.*"))[:-2]:
                    old.unlink()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        for i, f in enumerate(self.files):
            with f.open("a") as h:
                h.write(busy_lines(stamp, n, i, self.lines))


def _throughput(logs: RotatingLogs) -> IsolatedSampler:
    from agent.config import ThroughputSettings
    from agent.throughput.child import isolated_sampler
    from agent.throughput.records import ThroughputInputs

    pods = frozenset(("training", f"llm-{i}") for i in range(len(logs.files)))
    inputs = ThroughputInputs(pods, None)
    settings = ThroughputSettings(pod_logs=str(logs.root))
    return isolated_sampler(settings, 10.0, lambda: inputs, memory_limit=512 << 20)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=15)
    ap.add_argument("--passes", type=int, default=8000, help="passes per chunk")
    ap.add_argument("--warmup", type=int, default=300, help="passes before the first reading")
    ap.add_argument("--child", choices=("nvml", "throughput"), default="nvml")
    ap.add_argument("--logs", type=int, default=8, help="throughput: container logs")
    ap.add_argument("--lines", type=int, default=20, help="throughput: lines a log gains a pass")
    ap.add_argument("--rotate", type=int, default=120, help="throughput: passes between rotations")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fs-child-passes-") as work:
        if args.child == "nvml":
            sampler, feed = _nvml(Path(work)), lambda n: None
        else:
            logs = RotatingLogs(Path(work) / "pods", args.logs, args.lines, args.rotate)
            sampler, feed = _throughput(logs), logs.write
        try:
            for n in range(args.warmup):
                feed(n)
                sampler.sample()
            pid = sampler.pid
            assert pid is not None
            done = args.warmup
            rows = [(done, _kib(pid, "status", "VmRSS:"), _kib(pid, "smaps_rollup", "Anonymous:"))]
            started = time.monotonic()
            for _ in range(args.chunks):
                for _ in range(args.passes):
                    feed(done)
                    sampler.sample()
                    done += 1
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
        "child": "nvml (stand-in library)" if args.child == "nvml" else "throughput",
        **(
            {"logs": args.logs, "lines_per_log_per_pass": args.lines, "rotate_passes": args.rotate}
            if args.child == "throughput"
            else {}
        ),
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
