"""Does the agent grow? Runs it for ``--duration`` under far more work per hour than a node
gives it, samples the RSS and PSS of the main process and of each supervised child every
``--every`` seconds, and fits a line (least squares) to each after a warm-up: the slope in
MiB a day, checked against ``--max-slope`` (exit 1 above it).

The load (real processes and sockets; only the cluster is stood in for, as in
``bench/bench_sizing.py``, whose stand-ins this reuses):

- ``--sampling.interval`` short (1 s by default, 15 times the default's passes);
- the pod watch against a stand-in API server with ``--pods`` pods whose watch adds and
  deletes a pod every ``--churn`` seconds (each with a fresh uid) and ends every 60 s (a
  new watch resumes from the latest resourceVersion), and relists on a 410 every 10 min;
- the throughput child reading ``--logs`` busy container logs, rotated as the kubelet
  rotates them (``0.log`` renamed to ``0.log.<time>``, a new ``0.log``; the oldest
  removed past 2) every ``--rotate`` seconds;
- the NVML child on the stand-in ``libnvidia-ml.so.1`` (``tests/nvml_standin``), killed
  (SIGKILL) every ``--kill-child`` seconds: the agent replaces it (child restarts);
- ``/metrics`` scraped every ``--scrape`` seconds.

A child's slope is fitted over its current process's samples joined across restarts (a
new child starts from the same imports). What one page of jitter costs: a fit over T
seconds cannot resolve slopes much below 4 KiB / T (a 5-minute run: about 1 MiB a day), so
the short variant CI runs checks a bound that catches a leak (dcgm-exporter's grows to
512 MiB in one or two days: 250-500 MiB a day), and only an hours-long run speaks to
1 MiB a day.

    python bench/soak.py --duration 3600 --json soak.json [--max-slope 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_sizing as sizing  # the stand-ins and the /proc readers

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@contextlib.contextmanager
def churning_api_server(pods: int, churn: float) -> Iterator[str]:
    """A pod list of ``pods`` pods; watches that add a pod and delete another every
    ``churn`` seconds and end after 60 s; a 410 (relist) for a watch every 10 minutes."""
    from pytest_httpserver import HTTPServer
    from werkzeug.wrappers import Request, Response

    lock = threading.Lock()
    state: dict[str, Any] = {"version": 5000, "next": pods, "watches": 0}
    items = {i: sizing.pod(i, i < 8) for i in range(pods)}

    def bump() -> str:
        state["version"] += 1
        return str(state["version"])

    def handle(request: Request) -> Response:
        if request.args.get("watch") != "true":
            with lock:
                body = {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(state["version"])},
                    "items": list(items.values()),
                }
            return Response(json.dumps(body), mimetype="application/json")
        with lock:
            state["watches"] += 1
            expire = state["watches"] % 10 == 0

        def events() -> Iterator[str]:
            if expire:
                status = {"kind": "Status", "code": 410, "reason": "Expired"}
                yield json.dumps({"type": "ERROR", "object": status}) + "\n"
                return
            end = time.monotonic() + 60
            while time.monotonic() < end:
                time.sleep(churn)
                with lock:
                    new = state["next"]
                    state["next"] += 1
                    added = sizing.pod(new, False)
                    added["metadata"]["resourceVersion"] = bump()
                    items[new] = added
                    old = min(i for i in items if i >= 8)
                    gone = items.pop(old)
                    gone = {**gone, "metadata": {**gone["metadata"], "resourceVersion": bump()}}
                yield json.dumps({"type": "ADDED", "object": added}) + "\n"
                yield json.dumps({"type": "DELETED", "object": gone}) + "\n"

        return Response(events(), mimetype="application/json")

    server = HTTPServer(threaded=True)
    server.expect_request("/api/v1/pods").respond_with_handler(handle)
    server.start()
    try:
        yield server.url_for("/").rstrip("/")
    finally:
        server.clear()
        server.stop()


class RotatingLogs(sizing.BusyLogs):
    """Busy logs, rotated as the kubelet rotates container logs."""

    def __init__(self, root: Path, n: int, rate: float, every: float) -> None:
        super().__init__(root, n, rate)
        self.every = every
        self.rotations = 0
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            # the writer opens its files when it starts: stop it, rotate, start it again
            self.stop.clear()
            writer = threading.Thread(target=super().run, daemon=True)
            writer.start()
            finished = self.done.wait(self.every)
            self.stop.set()
            writer.join(5)
            if finished:
                break
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for f in self.files:
                with contextlib.suppress(FileNotFoundError):
                    f.rename(f.with_name(f"0.log.{stamp}"))
                for old in sorted(f.parent.glob("0.log.*"))[:-2]:
                    old.unlink()
            self.rotations += 1

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(10)


def fit(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t seconds, bytes) in MiB a day."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    slope = sum((t - mt) * (v - mv) for t, v in points) / var
    return slope * 86400 / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds measured")
    ap.add_argument("--warmup", type=float, default=120.0)
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--interval", default="1s", help="the agent's --sampling.interval")
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--churn", type=float, default=5.0, help="seconds between pod changes")
    ap.add_argument("--logs", type=int, default=8)
    ap.add_argument("--lines-per-second", type=float, default=2000.0)
    ap.add_argument("--rotate", type=float, default=120.0, help="seconds between log rotations")
    ap.add_argument("--scrape", type=float, default=5.0)
    ap.add_argument("--kill-child", type=float, default=300.0, help="seconds (0: never)")
    ap.add_argument("--max-slope", type=float, default=None, help="MiB a day, all processes")
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="fabricscope-soak-"))
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    sizing.build_standin(work)
    env["LD_LIBRARY_PATH"] = f"{work}:{env.get('LD_LIBRARY_PATH', '')}"
    port = sizing.free_port()
    samples: dict[str, list[tuple[float, int, int]]] = {}
    kills = 0
    scrapes = 0
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(churning_api_server(ns.pods, ns.churn))
        sock = work / "kubelet.sock"
        stack.enter_context(sizing.kubelet(sock, ["GPU-00000000-0000-0000-0000-000000000000"], 8))
        logs = work / "pods"
        rotating = RotatingLogs(logs, ns.logs, ns.lines_per_second, ns.rotate)
        stack.enter_context(rotating)
        agent = sizing.start_agent(
            work,
            env,
            url=url,
            port=port,
            sock=sock,
            logs=logs,
            sysfs=str(sizing.DGX),
            flags=(f"--sampling.interval={ns.interval}",),
        )
        metrics = f"http://127.0.0.1:{port}/metrics"
        try:
            t0 = time.monotonic()
            end = t0 + ns.warmup + ns.duration
            next_scrape = next_sample = t0
            next_kill = t0 + ns.kill_child if ns.kill_child > 0 else float("inf")
            while time.monotonic() < end:
                now = time.monotonic()
                if agent.poll() is not None:
                    raise SystemExit(f"soak: the agent exited ({agent.returncode}); see its log")
                if now >= next_scrape:
                    with contextlib.suppress(OSError):
                        _OPENER.open(metrics, timeout=10).read()
                        scrapes += 1
                    next_scrape += ns.scrape
                if now >= next_kill:
                    for p in sizing.children(agent.pid):
                        if sizing.role(p, logs) == "nvml child":
                            with contextlib.suppress(OSError):
                                os.kill(p, signal.SIGKILL)
                                kills += 1
                    next_kill += ns.kill_child
                if now >= next_sample:
                    t = now - t0
                    for p in [agent.pid, *sizing.children(agent.pid)]:
                        with contextlib.suppress(OSError):
                            who = "main" if p == agent.pid else sizing.role(p, logs)
                            rss, pss = sizing.memory(p)
                            samples.setdefault(who, []).append((t, rss, pss))
                    next_sample += ns.every
                time.sleep(max(0.05, min(next_scrape, next_sample, next_kill) - time.monotonic()))
            restarts = 0
            body = _OPENER.open(metrics, timeout=10).read().decode()
            for line in body.splitlines():
                if line.startswith('fabricscope_sampler_child_restarts_total{sampler="nvml"}'):
                    restarts = int(float(line.rsplit(" ", 1)[1]))
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()

    per: dict[str, Any] = {}
    total: dict[float, list[int]] = {}
    for who, pts in sorted(samples.items()):
        kept = [p for p in pts if p[0] >= ns.warmup]
        if not kept:
            continue
        per[who] = {
            "samples": len(kept),
            "rss_mib_first": round(kept[0][1] / 2**20, 1),
            "rss_mib_last": round(kept[-1][1] / 2**20, 1),
            "rss_slope_mib_per_day": round(fit([(t, r) for t, r, _ in kept]), 2),
            "pss_slope_mib_per_day": round(fit([(t, p) for t, _, p in kept]), 2),
        }
        for t, r, p in kept:
            bucket = round(t / ns.every) * ns.every
            acc = total.setdefault(bucket, [0, 0, 0])
            acc[0] += r
            acc[1] += p
            acc[2] += 1
    # the usual number of processes: a sample of a child being replaced (or just started,
    # before its role shows) is left out of the sum
    usual = Counter(a[2] for a in total.values()).most_common(1)
    full = usual[0][0] if usual else 0
    whole = [(t, a[0], a[1]) for t, a in sorted(total.items()) if a[2] == full]
    result: dict[str, Any] = {
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "duration_s": ns.duration,
        "warmup_s": ns.warmup,
        "sampling_interval": ns.interval,
        "pods": ns.pods,
        "pod_churn_s": ns.churn,
        "busy_logs": ns.logs,
        "log_lines_per_second": ns.lines_per_second,
        "log_rotations": rotating.rotations,
        "scrapes": scrapes,
        "nvml_child_kills": kills,
        "nvml_child_restarts": restarts,
        "processes": per,
        "total": {
            "rss_slope_mib_per_day": round(fit([(t, r) for t, r, _ in whole]), 2),
            "pss_slope_mib_per_day": round(fit([(t, p) for t, _, p in whole]), 2),
            "rss_mib_last": round(whole[-1][1] / 2**20, 1) if whole else None,
            "pss_mib_last": round(whole[-1][2] / 2**20, 1) if whole else None,
        },
        "max_slope_mib_per_day": ns.max_slope,
        # every sample after the warm-up: (seconds, RSS bytes, PSS bytes) by process
        "samples": {
            who: [p for p in pts if p[0] >= ns.warmup] for who, pts in sorted(samples.items())
        },
    }
    with contextlib.suppress(OSError):
        for f in sorted(work.rglob("*")):
            if f.is_file():
                f.unlink()
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    print()
    print("| process | RSS first -> last | RSS slope | PSS slope |")
    print("| --- | --- | --- | --- |")
    for who, p in per.items():
        print(
            f"| {who} | {p['rss_mib_first']} -> {p['rss_mib_last']} MiB | "
            f"{p['rss_slope_mib_per_day']} MiB/day | {p['pss_slope_mib_per_day']} MiB/day |"
        )
    t = result["total"]
    print(f"| all | -> {t['rss_mib_last']} MiB | {t['rss_slope_mib_per_day']} MiB/day | "
          f"{t['pss_slope_mib_per_day']} MiB/day |")  # fmt: skip
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(result, indent=2) + "\n")
    if ns.max_slope is not None:
        worst = max(t["rss_slope_mib_per_day"], t["pss_slope_mib_per_day"])
        ok = worst <= ns.max_slope and not (ns.kill_child > 0 and kills and not restarts)
        print(
            f"soak: {'PASS' if ok else 'FAIL'}: all processes grow {worst} MiB a day "
            f"(bound {ns.max_slope}); {kills} NVML child kills, {restarts} restarts"
        )
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
