"""Performance figures for docs/performance.md, measured side by side with node_exporter in one run.

On the DGX fixture tree (tests/fixtures/dgx-h100/sys):
  1. CPU time of one full sampling pass (sample + render), per sampler and in all;
  2. /metrics latency p50/p99 with 10 concurrent keep-alive clients (wrk), fabricscope and
     node_exporter (Debian's prometheus-node-exporter, infiniband collector, same tree),
     with and without gzip, and the ratio;
  3. resident memory of both processes after the load.

    python bench/bench_agent.py [--duration 10] [--json bench/out/result.json]

Needs wrk and prometheus-node-exporter: `make bench` (scripts/bench.sh) installs both.
"""

from __future__ import annotations

import argparse
import json
import os
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
TREE = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"

WRK_LUA = """
done = function(summary, latency, requests)
  io.write(string.format("JSON {\\"p50_us\\": %d, \\"p99_us\\": %d, \\"requests\\": %d, "
    .. "\\"errors\\": %d, \\"rps\\": %.1f}\\n",
    latency:percentile(50), latency:percentile(99), summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write
      + summary.errors.status + summary.errors.timeout,
    summary.requests / (summary.duration / 1e6)))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bytes(r.read())
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout}s: {last}")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def series_count(body: bytes) -> int:
    return sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))


def wrk(url: str, duration: int, gzip: bool, lua: str) -> dict[str, float]:
    cmd = ["wrk", "-t2", "-c10", f"-d{duration}s", "-s", lua, url]
    if gzip:
        cmd[1:1] = ["-H", "Accept-Encoding: gzip"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("JSON "):
            return dict(json.loads(line[5:]))
    raise RuntimeError(f"wrk printed no summary:\n{out}")


def sampling_pass_cpu(passes: int) -> dict[str, float]:
    """Median CPU seconds of one pass (sample + render) per sampler and for all together."""
    sys.path.insert(0, str(ROOT))
    from agent.config import AgentConfig, Sampling
    from agent.core.sysfs import SysfsReader
    from agent.samplers import build_samplers
    from exporter.metrics.catalog import AREAS
    from exporter.metrics.exposition import render_text
    from exporter.metrics.spec import Families

    config = AgentConfig(sampling=Sampling(frozenset({"infiniband", "pci"})))
    samplers = build_samplers(config, SysfsReader(TREE))
    per: dict[str, list[float]] = {s.name: [] for s in samplers}
    totals: list[float] = []
    for _ in range(passes):
        total = 0.0
        for s in samplers:
            t0 = time.process_time()
            snap = s.sample()
            fam = Families()
            AREAS[s.name].render(snap, fam)
            render_text(fam)
            dt = time.process_time() - t0
            per[s.name].append(dt)
            total += dt
        totals.append(total)
    result = {name: statistics.median(v) for name, v in per.items()}
    result["all"] = statistics.median(totals)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=int, default=10, help="seconds of load per case")
    ap.add_argument("--passes", type=int, default=50, help="sampling passes to time")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    for tool in ("wrk", "prometheus-node-exporter"):
        if not shutil.which(tool):
            print(f"bench: {tool} not found (apt-get install wrk prometheus-node-exporter)")
            return 2
    if not TREE.is_dir():
        print(f"bench: fixture tree {TREE} missing")
        return 2

    print(f"fixture: {TREE.relative_to(ROOT)}; cpu: {os.cpu_count()} cores", flush=True)
    cpu = sampling_pass_cpu(args.passes)
    results: dict[str, object] = {"sampling_pass_cpu_seconds": cpu}

    fs_port, ne_port = free_port(), free_port()
    procs = {
        "fabricscope": subprocess.Popen(
            [
                # this checkout's code (the venv's console script may point at another tree)
                sys.executable,
                "-m",
                "exporter.cli",
                "agent",
                f"--path.sysfs={TREE}",
                "--no-sampler.netdev",
                f"--web.listen-address=127.0.0.1:{fs_port}",
                "--log.level=warning",
            ],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        ),
        "node_exporter": subprocess.Popen(
            [
                "prometheus-node-exporter",
                f"--path.sysfs={TREE}",
                "--collector.disable-defaults",
                "--collector.infiniband",
                f"--web.listen-address=127.0.0.1:{ne_port}",
                "--log.level=warn",
            ],
            stderr=subprocess.DEVNULL,  # wrk closing keep-alive sockets makes it log EPIPE
        ),
    }
    urls = {
        "fabricscope": f"http://127.0.0.1:{fs_port}/metrics",
        "node_exporter": f"http://127.0.0.1:{ne_port}/metrics",
    }
    try:
        wait_http(f"http://127.0.0.1:{fs_port}/healthz")
        for name, url in urls.items():
            body = wait_http(url)
            results[f"{name}_series"] = series_count(body)
            results[f"{name}_bytes"] = len(body)
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
            f.write(WRK_LUA)
            lua = f.name
        lat: dict[str, dict[str, float]] = {}
        for gz in (False, True):
            for name, url in urls.items():  # interleaved: same machine state for both
                key = f"{name}{'_gzip' if gz else ''}"
                lat[key] = wrk(url, args.duration, gz, lua)
                print(f"  {key}: {lat[key]}", flush=True)
        results["latency"] = lat
        results["rss_bytes"] = {n: rss_bytes(p.pid) for n, p in procs.items()}
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(10)

    ratio = {
        enc: lat[f"fabricscope{enc}"]["p99_us"] / lat[f"node_exporter{enc}"]["p99_us"]
        for enc in ("", "_gzip")
    }
    results["p99_ratio_fabricscope_over_node_exporter"] = ratio
    print()
    print("| figure | fabricscope | node_exporter 1.5 (infiniband) | ratio |")
    print("| --- | --- | --- | --- |")
    print(
        f"| series served | {results['fabricscope_series']} | {results['node_exporter_series']} | |"
    )
    for enc, label in (("", "plain"), ("_gzip", "gzip")):
        f_, n_ = lat[f"fabricscope{enc}"], lat[f"node_exporter{enc}"]
        print(
            f"| /metrics p50, {label}, 10 clients | {f_['p50_us'] / 1000:.2f} ms | "
            f"{n_['p50_us'] / 1000:.2f} ms | {f_['p50_us'] / n_['p50_us']:.2f} |"
        )
        print(
            f"| /metrics p99, {label}, 10 clients | {f_['p99_us'] / 1000:.2f} ms | "
            f"{n_['p99_us'] / 1000:.2f} ms | {ratio[enc]:.2f} |"
        )
        print(
            f"| requests/s, {label} | {f_['rps']:.0f} | {n_['rps']:.0f} | "
            f"{f_['rps'] / n_['rps']:.2f} |"
        )
    rss = results["rss_bytes"]
    assert isinstance(rss, dict)
    print(
        f"| RSS after load | {rss['fabricscope'] / 2**20:.1f} MiB | "
        f"{rss['node_exporter'] / 2**20:.1f} MiB | "
        f"{rss['fabricscope'] / rss['node_exporter']:.2f} |"
    )
    print(f"| CPU of one full pass (sample + render) | {cpu['all'] * 1000:.1f} ms | | |")
    for name in sorted(k for k in cpu if k != "all"):
        print(f"| - {name} | {cpu[name] * 1000:.1f} ms | | |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
