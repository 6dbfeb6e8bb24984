"""Scrapes during a slowloris attack, fabricscope and node_exporter side by side
(docs/performance.md).

On the DGX fixture tree (tests/fixtures/dgx-h100/sys), for each exporter in turn:

  1. at rest: RSS, threads, open fds;
  2. under attack: 1,000 idle half-requests and 200 connections trickling a byte a second
     from 127.0.0.2 (tests/slowloris.py, each reopened as soon as it is closed), while a
     scraper on 127.0.0.1 takes 50 scrapes over 10 s, each on a new connection: status
     codes, latency p50/p99/max; peak RSS, threads and fds of the exporter, and its CPU
     (user + system) over the window;
  3. then wrk, 10 keep-alive clients for 5 s, still under attack: p50/p99, requests/s.

    python bench/bench_slowloris.py [--json bench/out/slowloris.json]
    python bench/bench_slowloris.py --bases   # the measurement that chose the server base

``--bases`` compares, in the same way but without node_exporter, three ways of serving the
same cached body: the thread-per-connection server fabricscope had before (loaded from git
commit 6548c56), the asyncio + h11 server it has now, and a minimal aiohttp server; each
with its limits raised so that the 1,200 attacking connections are held, not closed: what
holding them costs, and the scrape latency meanwhile, plus wrk at rest.

Needs wrk and prometheus-node-exporter (apt-get install wrk prometheus-node-exporter), and
git for ``--bases``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
SLOWLORIS = ROOT / "tests" / "slowloris.py"
#: the last commit with the thread-per-connection server
THREADED_COMMIT = "6548c56"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

sys.path.insert(0, str(ROOT / "bench"))
from bench_agent import WRK_LUA, free_port, wait_http  # noqa: E402


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in status if ":" in line}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "rss_mib": int(fields["VmRSS"][0]) / 1024,
        "threads": int(fields["Threads"][0]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "cpu_s": (int(stat[11]) + int(stat[12])) / ticks,
    }


def scrape(port: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        r = conn.getresponse()
        r.read()
        status = r.status
    except OSError:
        status = 0
    finally:
        conn.close()
    return status, time.perf_counter() - t0


def wrk(port: int, seconds: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_LUA)
    cmd = ["wrk", "-t2", "-c10", f"-d{seconds}s", "-H", "Accept-Encoding: gzip", "-s", f.name]
    out = subprocess.run(
        [*cmd, f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True, check=True
    ).stdout
    os.unlink(f.name)
    for line in out.splitlines():
        if line.startswith("JSON "):
            return dict(json.loads(line[5:]))
    raise RuntimeError(f"wrk printed no summary:\n{out}")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(name: str, pid: int, port: int, attack: bool, scrapes: int = 50) -> dict[str, object]:
    """Figures for one running exporter (see the module docstring)."""
    result: dict[str, object] = {"at_rest": proc_stats(pid)}
    attacker = None
    if attack:
        attacker = subprocess.Popen(
            [sys.executable, str(SLOWLORIS), "--port", str(port), "--duration", "120"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert attacker.stdout is not None
        assert attacker.stdout.readline() == "ready\n"
        # let the server take in the opening burst of 1,200 connections (~0.1 s): the
        # figures are for the attack's steady state
        time.sleep(1.0)
    peak: dict[str, float] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for k, v in proc_stats(pid).items():
                peak[k] = max(peak.get(k, 0.0), v)
            stop.wait(0.25)

    sampler = threading.Thread(target=sample)
    sampler.start()
    cpu0, t0 = proc_stats(pid)["cpu_s"], time.monotonic()
    statuses, latencies = [], []
    for i in range(scrapes):
        time.sleep(max(0.0, t0 + i * 0.2 - time.monotonic()))
        status, latency = scrape(port)
        statuses.append(status)
        latencies.append(latency)
    cpu1, t1 = proc_stats(pid)["cpu_s"], time.monotonic()
    stop.set()
    sampler.join()
    peak.pop("cpu_s")
    result["scrapes"] = {
        "ok": statuses.count(200),
        "of": scrapes,
        "statuses": sorted(set(statuses)),
        "p50_ms": pct(latencies, 0.5) * 1000,
        "p99_ms": pct(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
    }
    result["peak"] = peak
    result["cpu_percent"] = 100 * (cpu1 - cpu0) / (t1 - t0)
    result["wrk"] = wrk(port, 5)
    if attacker is not None:
        attacker.terminate()
        out, _ = attacker.communicate(timeout=60)
        result["attacker"] = json.loads(out.strip().splitlines()[-1])
    print(f"  {name}: {json.dumps(result)}", flush=True)
    return result


def start_exporters() -> dict[str, tuple[subprocess.Popen[bytes], int]]:
    fs_port, ne_port = free_port(), free_port()
    fs = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "agent",
            f"--path.sysfs={TREE}",
            "--no-sampler.netdev",
            f"--web.listen-address=127.0.0.1:{fs_port}",
            "--log.level=warning",
        ],
        env=ENV,
        cwd=ROOT,
    )
    ne = subprocess.Popen(
        [
            "prometheus-node-exporter",
            f"--path.sysfs={TREE}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address=127.0.0.1:{ne_port}",
            "--log.level=warn",
        ],
        stderr=subprocess.DEVNULL,
    )
    wait_http(f"http://127.0.0.1:{fs_port}/healthz")
    wait_http(f"http://127.0.0.1:{ne_port}/metrics")
    return {"fabricscope": (fs, fs_port), "node_exporter": (ne, ne_port)}


# --- --bases: the three server bases in one process each -------------------------------

_BASE_SERVER = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[3])
from exporter.metrics.exposition import ExpositionCache
base, port, body = sys.argv[1], int(sys.argv[2]), open(sys.argv[4], "rb").read()
cache = ExpositionCache()
cache.set_fragment("all", body)
if base == "aiohttp":
    from aiohttp import web
    from exporter.metrics.exposition import CONTENT_TYPE
    async def metrics(request):
        gz = "gzip" in request.headers.get("Accept-Encoding", "")
        headers = {"Content-Type": CONTENT_TYPE, "Vary": "Accept-Encoding"}
        if gz:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=cache.gzipped() if gz else cache.body(), headers=headers)
    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", lambda r: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)
else:
    if base == "threaded":
        import threaded_server as server  # the old module, from git
        srv = server.serve(cache, f"127.0.0.1:{port}", max_requests=400)  # 1,600 connections
    else:
        from exporter.http import server
        from exporter.http.limits import ConnectionLimits
        limits = ConnectionLimits(max_connections=2000, max_per_address=2000,
                                  header_timeout=300, idle_timeout=300)
        srv = server.serve(cache, f"127.0.0.1:{port}", limits=limits)
    sys.setswitchinterval(0.001)  # as the agent does
    while True:
        time.sleep(3600)
"""


def bases() -> dict[str, object]:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        old = subprocess.run(
            ["git", "show", f"{THREADED_COMMIT}:exporter/http/server.py"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        Path(tmp, "threaded_server.py").write_bytes(old)
        once = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter.cli",
                "agent",
                "--once",
                f"--path.sysfs={TREE}",
                "--no-sampler.netdev",
                "--log.level=error",
            ],
            env=ENV,
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        body = Path(tmp, "body.prom")
        body.write_bytes(once)
        print(f"body: {len(once)} bytes (fabricscope agent --once on the DGX tree)")
        for base in ("threaded", "asyncio_h11", "aiohttp"):
            port = free_port()
            proc = subprocess.Popen(
                [sys.executable, "-c", _BASE_SERVER, base, str(port), str(ROOT), str(body)],
                env={**ENV, "PYTHONPATH": f"{ROOT}:{tmp}"},
            )
            try:
                wait_http(f"http://127.0.0.1:{port}/metrics")
                rest = wrk(port, 5)
                held = measure(base, proc.pid, port, attack=True)
                results[base] = {"wrk_at_rest": rest, "holding_1200": held}
            finally:
                proc.kill()
                proc.wait()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bases", action="store_true", help="compare server bases instead")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    for tool in ("wrk", "prometheus-node-exporter"):
        if not shutil.which(tool):
            print(f"bench: {tool} not found (apt-get install wrk prometheus-node-exporter)")
            return 2
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.2", 0))
        except OSError:
            print("bench: cannot bind 127.0.0.2 (the attacker's address)")
            return 2
    print(f"fixture: {TREE.relative_to(ROOT)}; cpu: {os.cpu_count()} cores", flush=True)
    if args.bases:
        results = bases()
        print()
        print(
            "| base | wrk p50 / p99 at rest | holding 1,200: RSS, threads | CPU | "
            "scrape p50 / p99 / max | wrk p99 |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for base, r in results.items():
            assert isinstance(r, dict)
            rest, held = r["wrk_at_rest"], r["holding_1200"]
            s, peak, rest0 = held["scrapes"], held["peak"], held["at_rest"]
            print(
                f"| {base} | {rest['p50_us'] / 1000:.2f} / {rest['p99_us'] / 1000:.2f} ms | "
                f"{rest0['rss_mib']:.0f} -> {peak['rss_mib']:.0f} MiB, "
                f"{rest0['threads']:.0f} -> {peak['threads']:.0f} | "
                f"{held['cpu_percent']:.0f} % | {s['p50_ms']:.1f} / {s['p99_ms']:.1f} / "
                f"{s['max_ms']:.0f} ms ({s['ok']}/{s['of']} ok) | "
                f"{held['wrk']['p99_us'] / 1000:.1f} ms |"
            )
    else:
        procs = start_exporters()
        results = {}
        try:
            for name, (proc, port) in procs.items():
                results[name] = measure(name, proc.pid, port, attack=True)
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(10)
        f, n = results["fabricscope"], results["node_exporter"]
        assert isinstance(f, dict) and isinstance(n, dict)
        print()
        print(
            "| under attack (1,000 idle + 200 trickling from one address) | fabricscope | "
            "node_exporter 1.5 |"
        )
        print("| --- | --- | --- |")
        rows = [
            (
                "scrapes answered 200 (new connection each, 5/s)",
                lambda r: f"{r['scrapes']['ok']} / {r['scrapes']['of']}",
            ),
            (
                "scrape p50 / p99 / max",
                lambda r: (
                    f"{r['scrapes']['p50_ms']:.1f} / {r['scrapes']['p99_ms']:.1f} / "
                    f"{r['scrapes']['max_ms']:.0f} ms"
                ),
            ),
            (
                "wrk 10 keep-alive clients p50 / p99",
                lambda r: f"{r['wrk']['p50_us'] / 1000:.2f} / {r['wrk']['p99_us'] / 1000:.2f} ms",
            ),
            ("requests/s (wrk)", lambda r: f"{r['wrk']['rps']:.0f}"),
            (
                "RSS at rest -> peak",
                lambda r: f"{r['at_rest']['rss_mib']:.0f} -> {r['peak']['rss_mib']:.0f} MiB",
            ),
            (
                "threads at rest -> peak",
                lambda r: f"{r['at_rest']['threads']:.0f} -> {r['peak']['threads']:.0f}",
            ),
            (
                "open fds at rest -> peak",
                lambda r: f"{r['at_rest']['fds']:.0f} -> {r['peak']['fds']:.0f}",
            ),
            ("CPU during the scrapes", lambda r: f"{r['cpu_percent']:.0f} % of a core"),
            (
                "attacker connections opened in all",
                lambda r: f"{r['attacker']['opened'] + r['attacker']['errors']}",
            ),
        ]
        for label, fmt in rows:
            print(f"| {label} | {fmt(f)} | {fmt(n)} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
