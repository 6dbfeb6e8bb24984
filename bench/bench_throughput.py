"""Benchmark of the throughput sampler under the issue's load: 64 pods each logging 10 lines
a second (CRI format, Composer throughput lines) for a minute, next to a 1 GB log that was
already written when the agent started.

Runs the real agent (``python -m exporter.cli agent``, throughput sampler only, default
15 s interval) as a subprocess against a kubelet-layout pod log tree in a temporary
directory (deleted afterwards), a writer subprocess appending the lines, and scrapes
``/metrics`` twice a second. Each line's value is its write time, so a scrape measures the
lag from a line written to the metric served.

Reports: agent CPU (utime+stime+cutime+cstime from /proc, of the agent and of its child
process that reads and parses the logs since issue 19) per sampling pass and as a share of one core,
the RSS of both after the first pass and at the end (growth), the first pass's duration
(which met the 1 GB log), and the lag (median, max) against the sampling interval.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_throughput.py [--seconds 60] [--pods 64]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRITER = r"""
import os, sys, time
paths, rate, seconds = sys.argv[1].split(","), float(sys.argv[2]), float(sys.argv[3])
files = [open(p, "a", buffering=1) for p in paths]
step, t0, n = 1.0 / rate, time.time(), 0
while time.time() - t0 < seconds:
    n += 1
    for f in files:
        now = time.time()
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"
        f.write(f"{ts} stdout F \t Train throughput/tokens_per_sec: {now:.3f}\n")
    time.sleep(max(0.0, t0 + n * step - time.time()))
"""
SERIES = re.compile(
    r'^fabricscope_throughput_tokens_per_second\{[^}]*pod="([^"]+)"[^}]*\} (\S+)$', re.M
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children(pid: int) -> list[int]:
    """The agent's child processes (the throughput sampler's, since issue 19)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue  # the thread ended
    return out


def proc_cpu(pid: int) -> float:
    """CPU seconds of the agent and its children (a reaped child's time is in the parent's
    cutime/cstime)."""
    total = 0.0
    for p in (pid, *children(pid)):
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / (
            os.sysconf("SC_CLK_TCK")
        )
    return total


def proc_rss(pid: int) -> int:
    """RSS of the agent and its children."""
    total = 0
    for p in (pid, *children(pid)):
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def write_big_log(path: Path, size: int) -> None:
    line = (
        b"2026-11-20T10:00:00.000000000Z stdout F [rank0] step 10 loss 2.1 "
        b"\t Train throughput/tokens_per_sec: 55803.1245\n"
    )
    block = line * ((4 << 20) // len(line) + 1)
    with path.open("wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pods", type=int, default=64)
    ap.add_argument("--rate", type=float, default=10.0, help="lines per second per pod")
    ap.add_argument("--big-bytes", type=int, default=1 << 30)
    ap.add_argument("--interval", type=float, default=15.0)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fabricscope-bench-throughput-"))
    agent: subprocess.Popen[bytes] | None = None
    try:
        pods = tmp / "pods"
        paths = []
        for i in range(args.pods):
            d = pods / f"training_llm-{i}_0b8a7c1e-{i:04d}-4c43-8d6c-6a3a8f2f11aa" / "trainer"
            d.mkdir(parents=True)
            paths.append(d / "0.log")
            paths[-1].touch()
        big = pods / "training_big-0_0b8a7c1e-ffff-4c43-8d6c-6a3a8f2f11aa" / "trainer"
        big.mkdir(parents=True)
        t = time.monotonic()
        write_big_log(big / "0.log", args.big_bytes)
        print(
            f"wrote the pre-existing log: {(big / '0.log').stat().st_size / 1e9:.2f} GB "
            f"in {time.monotonic() - t:.1f} s"
        )

        port = free_port()
        disabled = ("attribution", "infiniband", "netdev", "nvml", "pci", "workload")
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter.cli",
                "agent",
                f"--path.pod-logs={pods}",
                "--throughput.pods=all",
                f"--sampling.interval={args.interval}",
                f"--sampling.timeout={min(10.0, args.interval)}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warning",
                *(f"--no-sampler.{n}" for n in disabled),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        url = f"http://127.0.0.1:{port}/metrics"

        def scrape() -> str:
            with urllib.request.urlopen(url, timeout=5) as r:
                return str(r.read().decode())

        # wait for the first pass (it meets the 1 GB log)
        while True:
            try:
                text = scrape()
                if metric(text, 'fabricscope_sampler_attempts_total{sampler="throughput"}'):
                    break
            except OSError:
                pass
            time.sleep(0.1)
        first_pass = metric(text, 'fabricscope_sampler_duration_seconds{sampler="throughput"}')
        rss0, cpu0 = proc_rss(agent.pid), proc_cpu(agent.pid)
        attempts0 = metric(text, 'fabricscope_sampler_attempts_total{sampler="throughput"}') or 0

        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                ",".join(map(str, paths)),
                str(args.rate),
                str(args.seconds),
            ]
        )
        seen: dict[str, float] = {}
        lags: list[float] = []
        worst: list[float] = []
        durations: list[float] = []
        t_end = time.time() + args.seconds + args.interval + 2
        rss_max = rss0
        while time.time() < t_end:
            text = scrape()
            now = time.time()
            for pod, value in SERIES.findall(text):
                v = float(value)
                if pod.startswith("llm-") and v != seen.get(pod):
                    if pod in seen:  # the first line after the previous served one waited most
                        worst.append(now - seen[pod])
                    seen[pod] = v
                    lags.append(now - v)
            d = metric(text, 'fabricscope_sampler_duration_seconds{sampler="throughput"}')
            if d is not None and (not durations or d != durations[-1]):
                durations.append(d)
            rss_max = max(rss_max, proc_rss(agent.pid))
            time.sleep(0.5)
        writer.wait()
        text = scrape()
        cpu1, rss1 = proc_cpu(agent.pid), proc_rss(agent.pid)
        attempts1 = metric(text, 'fabricscope_sampler_attempts_total{sampler="throughput"}') or 0
        passes = attempts1 - attempts0
        lines = sum(
            float(v)
            for v in re.findall(
                r'^fabricscope_throughput_lines_parsed_total\{[^}]*pod="llm-[^"]*"[^}]*\} (\S+)$',
                text,
                re.M,
            )
        )
        wall = args.seconds + args.interval + 2
        print(
            f"pods {args.pods} x {args.rate:g} lines/s for {args.seconds:g} s "
            f"(+1 pod with a {args.big_bytes / 1e9:.2f} GB pre-existing log); "
            f"interval {args.interval:g} s"
        )
        print(
            f"lines parsed from the 64 pods: {lines:.0f} "
            f"(written: {args.pods * args.rate * args.seconds:.0f})"
        )
        print(f"first pass (64 empty logs + the 1 GB log): {first_pass:.3f} s")
        print(
            f"passes {passes:.0f}; agent CPU {cpu1 - cpu0:.2f} s in {wall:.0f} s = "
            f"{100 * (cpu1 - cpu0) / wall:.2f}% of a core "
            f"(includes serving 2 scrapes/s); {(cpu1 - cpu0) / max(passes, 1):.3f} s per pass"
        )
        print(
            f"pass durations (wall): median {statistics.median(durations):.3f} s, "
            f"max {max(durations):.3f} s"
        )
        print(
            f"RSS after first pass {rss0 / 2**20:.1f} MiB, end {rss1 / 2**20:.1f} MiB, "
            f"max {rss_max / 2**20:.1f} MiB: growth {(rss_max - rss0) / 2**20:.1f} MiB"
        )
        print(
            f"lag line written -> metric served: newest line median "
            f"{statistics.median(lags):.2f} s; oldest line of a pass median "
            f"{statistics.median(worst):.2f} s, max {max(worst):.2f} s ({len(lags)} updates); "
            f"interval {args.interval:g} s"
        )
        return 0
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
