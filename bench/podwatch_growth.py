"""Does the pod watch grow with its watches and relists? Its resident memory over thousands
of them, fitted: what ``bench/soak.py`` cannot tell apart, since its stand-in ends a watch
every minute whatever else the run varies.

    python bench/podwatch_growth.py [--watches 8000] [--samples 40] [--pods 110]
        [--json FILE]

A stand-in API server in a process of its own (so that its memory is not the watch's) lists
``--pods`` pods of the soak's shape (``bench_sizing.pod``), answers each watch with one pod
added and one deleted, then ends it; every tenth watch it answers 410 Expired instead, so the
watch lists again. :class:`agent.kubernetes.podwatch.PodWatcher` runs against it in this
process as the agent runs it (its own thread, the agent's default settings), back to back.
Not fitted: the first tenth of the watches (pools and caches filling). Each watch is placed
``watch_timeout_seconds`` (300 s, the agent's default: the API server ends a watch then) after
the last and fitted as the soak fits time (``soak.fit``); a relist every tenth watch is far
more than a real API server asks for (only when its watch cache has moved on). The process's
RSS and anonymous memory, and Python's live blocks (``sys.getallocatedblocks``); at the end,
once the server has stopped changing pods and every change it sent has been read, the pods
in the watch's index (``--pods``: no add or delete lost).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.jsonout import emit  # noqa: E402

#: a relist (410 Expired) every this many watches
RELIST_EVERY = 10


def serve(pods: int) -> None:
    """The stand-in API server: prints its port, serves until killed."""
    import bench_sizing as sizing
    from soak import churn_step, pod_list_json
    from werkzeug.serving import make_server
    from werkzeug.wrappers import Request, Response

    lock = threading.Lock()
    state = {"version": 5000, "next": pods, "watches": 0, "quiet": 0}
    items = {i: sizing.pod(i, i < 8) for i in range(pods)}

    @Request.application  # type: ignore[misc]
    def handle(request: Request) -> Response:
        if request.path == "/watches":
            return Response(str(state["watches"]))
        if request.path == "/quiet":  # no more changes: watches from now on end empty
            with lock:
                state["quiet"] = 1
                return Response(str(state["watches"]))
        if request.args.get("watch") != "true":
            with lock:
                body = pod_list_json(state["version"], items.values())
            return Response(body, mimetype="application/json")
        with lock:
            state["watches"] += 1
            if state["quiet"]:
                return Response("", mimetype="application/json")
            if state["watches"] % RELIST_EVERY == 0:
                status = {"kind": "Status", "code": 410, "reason": "Expired"}
                return Response(json.dumps({"type": "ERROR", "object": status}) + "\n")
            added, gone = churn_step(state, items)

        def events() -> Iterator[str]:
            yield json.dumps({"type": "ADDED", "object": added}) + "\n"
            yield json.dumps({"type": "DELETED", "object": gone}) + "\n"

        return Response(events(), mimetype="application/json")

    server = make_server("127.0.0.1", 0, handle, threaded=True)
    print(server.server_port, flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--watches", type=int, default=8000)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--max-slope", type=float, default=1.0, help="MiB a day")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.serve:
        serve(ns.pods)
        return 0
    if ns.watches < ns.samples * 10 or ns.samples < 10:
        ap.error("needs --samples >= 10 and --watches >= 10 x --samples")

    from kubernetes.client import ApiClient, Configuration
    from soak import fit, usage

    from agent.kubernetes.podwatch import PodWatcher, WatchSettings

    settings = WatchSettings()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--pods", str(ns.pods)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{server.stdout.readline().strip()}"

        def watches() -> int:
            return int(opener.open(url + "/watches", timeout=10).read())

        errors: list[str] = []
        watcher = PodWatcher(
            "gpu-node-0", lambda: ApiClient(Configuration(host=url)), errors.append
        )
        load = [os.getloadavg()[0]]
        t0 = time.monotonic()
        c0 = time.process_time()
        watcher.start()
        if not watcher.wait_synced(30):
            print("podwatch_growth: the watch never listed", file=sys.stderr)
            return 2
        every = ns.watches // ns.samples
        points: list[tuple[int, int, int, int]] = []  # watches, RSS, anon, live blocks
        while len(points) < ns.samples:
            done = watches()
            if done >= every * (len(points) + 1):
                rss, _, _, anon = usage(os.getpid())
                points.append((done, rss // 1024, anon // 1024, sys.getallocatedblocks()))
            else:
                time.sleep(0.05)
        cpu = time.process_time() - c0
        # the index is read once every change sent has been applied: the server stops
        # changing pods, and a watch asked for after that means the one before was read
        quiet_at = int(opener.open(url + "/quiet", timeout=10).read())
        while watches() <= quiet_at:
            time.sleep(0.05)
        lists = watcher.lists_total
        index = watcher.index
        watcher.close()
    finally:
        server.kill()
        server.wait()
    load.append(os.getloadavg()[0])
    step = float(settings.watch_timeout_seconds)
    first = ns.watches // 10
    fitted = [p for p in points if p[0] > first]
    growth = {
        "rss": fit([[(w * step, rss * 1024.0) for w, rss, _, _ in fitted]]),
        "anonymous": fit([[(w * step, anon * 1024.0) for w, _, anon, _ in fitted]]),
    }
    days = (points[-1][0] - first) * step / 86400
    result: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "command": "python bench/podwatch_growth.py " + " ".join(argv or sys.argv[1:]),
        "pods": ns.pods,
        "server_pid": server.pid,
        "pods_in_index_at_end": None if index is None else len(index),
        "watches": points[-1][0],
        "lists": lists,
        "errors": sorted(set(errors)),
        "wall_seconds": round(time.monotonic() - t0, 1),
        "cpu_ms_per_watch": round(cpu / points[-1][0] * 1000, 3),
        "load_average_1m": {"start": load[0], "end": load[1]},
        "each_watch_placed_seconds_apart": step,
        "fitted_from_watch": first,
        "watches_fitted_in_days": round(days, 1),
        "kib": {
            "first_sample": {"rss": points[0][1], "anonymous": points[0][2]},
            "last_sample": {"rss": points[-1][1], "anonymous": points[-1][2]},
        },
        "live_blocks": {"first_sample": points[0][3], "last_sample": points[-1][3]},
        "growth": {k: f.as_dict(ns.max_slope) for k, f in growth.items()},
        "samples": points,
    }
    emit(result, ns.json)
    return 1 if growth["rss"].verdict(ns.max_slope) == "above" else 0


if __name__ == "__main__":
    sys.exit(main())
