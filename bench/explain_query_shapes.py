"""What would one range query per check buy? explain's logged queries replayed against the
same TSDB in two shapes, taking turns, with Prometheus's CPU and the client's JSON decoding
measured: a measurement of a change not made (it would change what explain measures).

    python bench/bench_explain.py --nodes 1024 --hours 1 --runs 1 --workdir W --query-log Q
    python bench/explain_query_shapes.py --tsdb W/1024-1h-30s/tsdb \\
        --query-log W/prometheus/queries.jsonl [--rounds 5] [--json FILE]

``--query-log`` is Prometheus's own query log (``global.query_log_file``) that
``bench_explain.py --query-log`` turns on: every query with its parameters. The replay takes
explain's last run in it (from the last time its first query was asked; the benchmark's own
``count(...)`` left out) and asks it two ways, 8 at a time as explain does:

- ``as_asked``: every query as logged (each check's baseline and slow period as two instant
  queries, ``[1995s]`` at the baseline's end and ``[1590s]`` at the slow period's end on
  the 1,024-node job);
- ``one_range``: each such pair (the same expression but for its window) as one
  ``query_range`` of two steps, the baseline's end and the slow period's, both over the
  longer window (reading at least as many samples); every other query as logged.

``one_range`` answers a different question (both periods over one length): this measures
its cost only. Per round and shape: wall seconds, Prometheus's CPU seconds (``/proc``),
bytes received, and the client's CPU decoding the answers with ``json.loads`` (what explain
pays for its JSON before any work of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_explain import proc_cpu  # noqa: E402
from bench.jsonout import emit  # noqa: E402
from tests.promharness import start_prometheus  # noqa: E402

WINDOW = re.compile(r"\[(\d+)s\]")
Call = tuple[str, dict[str, str]]


def _unix(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def last_run_entries(log: Path) -> tuple[list[dict[str, Any]], int]:
    """The query log's entries of explain's last run, whole (parameters and Prometheus's
    stats), and how many lines were not a query entry (not JSON: a line cut short when
    Prometheus stopped mid-write; or without parameters and path) and were passed over."""
    entries = []
    bad = 0
    for line in log.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            e = json.loads(line)
            params = e["params"]
            path = e["httpRequest"]["path"]
            query = str(params["query"])
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if not isinstance(path, str):
            bad += 1  # a path that is not text names no endpoint
            continue
        if query.startswith("count({__name__"):
            continue  # the benchmark's own series count
        entries.append(e)
    if not entries:
        raise SystemExit(f"{log}: no query logged")
    first = entries[0]["params"]["query"]
    start = max(i for i, e in enumerate(entries) if e["params"]["query"] == first)
    return entries[start:], bad


def last_run(log: Path) -> list[tuple[str, dict[str, Any]]]:
    """(endpoint, params) of explain's last run in Prometheus's query log."""
    entries, _ = last_run_entries(log)
    return [(e["httpRequest"]["path"].rsplit("/", 1)[-1], e["params"]) for e in entries]


def _as_logged(endpoint: str, p: dict[str, Any]) -> Call:
    if endpoint == "query":
        return endpoint, {"query": p["query"], "time": f"{_unix(p['start']):.3f}"}
    return endpoint, {
        "query": p["query"],
        "start": f"{_unix(p['start']):.3f}",
        "end": f"{_unix(p['end']):.3f}",
        "step": str(p["step"]),
    }


def shapes(asked: list[tuple[str, dict[str, Any]]]) -> tuple[list[Call], list[Call], int]:
    """(as asked, one range query per pair, pairs)."""
    groups: dict[str, list[int]] = {}
    for i, (endpoint, p) in enumerate(asked):
        if endpoint == "query" and WINDOW.search(p["query"]):
            groups.setdefault(WINDOW.sub("[W]", p["query"]), []).append(i)
    pairs = []
    for ix in groups.values():
        windows = {WINDOW.findall(asked[i][1]["query"])[0] for i in ix}
        times = {asked[i][1]["start"] for i in ix}
        if len(ix) == 2 and len(windows) == 2 and len(times) == 2:
            pairs.append(ix)
    paired = {i for ix in pairs for i in ix}
    as_asked = [_as_logged(e, p) for e, p in asked]
    one_range = [_as_logged(e, p) for i, (e, p) in enumerate(asked) if i not in paired]
    for a, b in pairs:
        pa, pb = asked[a][1], asked[b][1]
        w = max(int(WINDOW.findall(pa["query"])[0]), int(WINDOW.findall(pb["query"])[0]))
        t1, t2 = sorted((_unix(pa["start"]), _unix(pb["start"])))
        one_range.append(
            (
                "query_range",
                {
                    "query": WINDOW.sub(f"[{w}s]", pa["query"]),
                    "start": f"{t1:.3f}",
                    "end": f"{t2:.3f}",
                    "step": f"{t2 - t1:.3f}",
                },
            )
        )
    return as_asked, one_range, len(pairs)


def _ask(url: str, call: Call) -> bytes:
    endpoint, params = call
    data = urllib.parse.urlencode(params).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"{url}/api/v1/{endpoint}", data=data)
    try:
        with opener.open(request, timeout=600) as r:
            body: bytes = r.read()
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{endpoint} refused: {exc.read()[:300]!r}") from None
    return body


def one_round(url: str, pid: int, calls: list[Call]) -> dict[str, float]:
    c0, t0 = proc_cpu(pid), time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda c: _ask(url, c), calls))
    wall, server = time.perf_counter() - t0, proc_cpu(pid) - c0
    d0 = time.process_time()
    for body in bodies:
        if json.loads(body)["status"] != "success":
            raise SystemExit("a query failed")
    return {
        "wall_seconds": round(wall, 3),
        "server_cpu_seconds": round(server, 2),
        "bytes": sum(len(b) for b in bodies),
        "client_json_cpu_seconds": round(time.process_time() - d0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--tsdb", type=Path, required=True)
    ap.add_argument("--query-log", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fabricscope-query-shapes"))
    ap.add_argument("--json", type=Path, default=None)
    ns = ap.parse_args(argv)
    asked = last_run(ns.query_log)
    as_asked, one_range, pairs = shapes(asked)
    runs: dict[str, list[dict[str, float]]] = {"as_asked": [], "one_range": []}
    loads = [os.getloadavg()[0]]
    with start_prometheus(ns.workdir, [], tsdb_path=ns.tsdb) as prom:
        pid = prom.process.pid
        one_round(prom.url, pid, as_asked)  # warm: the first read of each block is not counted
        for r in range(ns.rounds):
            for name, calls in (("as_asked", as_asked), ("one_range", one_range)):
                runs[name].append(one_round(prom.url, pid, calls))
                print(r, name, runs[name][-1], file=sys.stderr, flush=True)
            loads.append(os.getloadavg()[0])
    medians = {
        name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()
    }
    a, b = medians["as_asked"], medians["one_range"]
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "tsdb": ns.tsdb.name if ns.tsdb.name != "tsdb" else ns.tsdb.parent.name,
        "queries": {"as_asked": len(as_asked), "one_range": len(one_range), "pairs": pairs},
        "rounds": ns.rounds,
        "load_average_1m": {"min": min(loads), "max": max(loads)},
        "median": medians,
        "ratio_one_range_to_as_asked": {k: round(b[k] / a[k], 3) for k in a if a[k]},
        "runs": runs,
    }
    emit(result, ns.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
