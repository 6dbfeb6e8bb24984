"""``fabricscope explain`` at fleet scale: time to answer, its own CPU and memory, the
queries and bytes it asks for, and the CPU Prometheus spends answering, per job size.

The data: tests/explain_lab.py's ``ib_link_bad`` scenario (series named and labelled by the
real agent from the DGX fixture tree and the recorded NVML at the default detail: 12 RDMA
ports, PCI links, 2 GPUs with 18 NVLinks each, netdev, attribution, workload, probe and
throughput series per node), N nodes, H hours at a 30 s scrape interval, backfilled with
promtool (no time limit) and served by a real Prometheus (2.42). The job's throughput drops
34 % at 55 % of the window; node-02's mlx5_3 port starts taking symbol errors then.

What a node exports: every family the agent exports at the default detail on an InfiniBand
GPU node that explain reads, at the values the agent gave on the fixture (527 series a
node): the ports' counters, state, rate and width; every PCI device's identity (54) and
the links' width, speed and their below-both-ends flags; the GPUs' PCIe width, replays and
generation flag (as the agent exports it for a GPU running processes: the lab's pods hold
every GPU); NVLink state and errors; the workload's NUMA placement and per-kind finding
counts. Left out, and why: the far (switch) end of each cable and the leaves' uplinks (the
ibpeer sampler asks the fabric with infiniband-diags, which a fixture tree cannot answer;
the explain accuracy benchmark models them); NCCL's own log lines (channels, warnings: only
pods that run with ``NCCL_DEBUG=INFO`` have them); XID events (a series appears with a GPU's
first XID: a healthy node has none); the PMA saturation flags (the fixture's mlx5_6 reads
four counters at their maximum, which the lab's counters, advancing from the fixture's
values, would contradict). Those checks ask Prometheus all the same and find no series.

Measured per size, over ``--runs`` runs of the whole command (``python -m exporter.cli
explain``, interpreter start included): wall time, explain's user+system CPU and peak RSS
(``getrusage`` of the child), its query count and bytes (its own ``--log.level=info``
summary: received gzip'd, and uncompressed), Prometheus's user+system CPU during the run
(``/proc/PID/stat``), and the top finding. On Prometheus also the samples its engine read
for the run's queries (its query log's ``totalQueryableSamples``, summed): what the
queries ask of it, which other load on the machine does not change; ``--query-log FILE``
writes the last run's queries, heaviest first, one line each (samples, seconds, its PromQL
with the job's name alternations elided).

    python bench/bench_explain.py [--nodes 64,256,1024] [--hours 1,6] [--runs 3]
        [--workdir /tmp/fabricscope-bench-explain] [--plot docs/explain-ib_link_bad.png]
        [--against /path/to/another/checkout] [--query-log FILE]

``--against`` runs another checkout's explain (its own ``exporter``) against the same
Prometheus in the same session, the two taking turns run by run (who goes first alternates),
so a change is measured side by side with what it changes, under the same load; each
measure is printed for both and as a ratio (this checkout over the other), and whether the
two give the same ``--format json`` answer (every finding, figure, query and count; all but
the seconds it took: ``same_answer``).

Each TSDB is built once per --workdir and reused (about 2-3 minutes for 64 nodes x 6 h on
2 cores; the build grows with nodes x hours).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.explain.client import ClientSettings, PrometheusClient  # noqa: E402
from tests import explain_lab  # noqa: E402
from tests.promharness import start_prometheus  # noqa: E402
from tests.vmharness import start_victoria_metrics  # noqa: E402


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_measured(
    cmd: list[str], env: dict[str, str], cwd: Path = ROOT
) -> tuple[subprocess.CompletedProcess[str], resource.struct_rusage]:
    """Run ``cmd`` in ``cwd`` (``-m`` imports from there first); its own CPU and peak RSS
    (wait4 on that child alone)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            cmd, proc.returncode, out.read().decode(), err.read().decode()
        )
    return done, usage


def _build(workdir: Path, nodes: int, hours: float, step: float) -> tuple[Path, dict[str, float]]:
    key = f"{nodes}-{hours:g}h-{step:g}s"
    build = workdir / key
    meta = build / "slots.json"
    if not meta.exists():
        shutil.rmtree(build, ignore_errors=True)
        t0 = time.perf_counter()
        _, slots = explain_lab.build(
            build,
            scenarios=("ib_link_bad",),
            nodes=nodes,
            hours=hours,
            step=step,
            promtool_timeout=None,
        )
        s = slots[0]
        meta.write_text(json.dumps({"start": s.start, "end": s.end, "change": s.change}))
        print(f"built {key} in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return build, json.loads(meta.read_text())


def _query_log(workdir: Path) -> Path:
    return workdir / "prometheus" / "queries.jsonl"


def _log_queries(url: str, config: Path, log: Path) -> None:
    """Turn on Prometheus's query log (``global.query_log_file``, a reload away): every
    query with the samples it read and its timings."""
    text = config.read_text()
    config.write_text(text.replace("global:\n", f"global:\n  query_log_file: {log}\n", 1))
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(f"{url}/-/reload", method="POST"), timeout=30):
        pass


def _logged(log: Path, offset: int) -> list[dict[str, object]]:
    """The queries logged past ``offset`` bytes of ``log`` (none when it has no log)."""
    if not log.exists():
        return []
    with log.open("rb") as fh:
        fh.seek(offset)
        return [json.loads(line) for line in fh.read().splitlines() if line.strip()]


def _samples(entry: dict[str, object]) -> int:
    stats = entry.get("stats")
    if not isinstance(stats, dict):
        return 0
    samples = stats.get("samples")
    return int(samples.get("totalQueryableSamples", 0)) if isinstance(samples, dict) else 0


def _query_lines(entries: list[dict[str, object]]) -> list[str]:
    """One line per query, heaviest first: samples read, evaluation seconds, endpoint, its
    PromQL (name alternations elided)."""
    rows = []
    for e in entries:
        params = e.get("params")
        stats = e.get("stats")
        http = e.get("httpRequest")
        query = str(params.get("query", "")) if isinstance(params, dict) else ""
        timings = stats.get("timings", {}) if isinstance(stats, dict) else {}
        seconds = float(timings.get("evalTotalTime", 0.0)) if isinstance(timings, dict) else 0.0
        path = str(http.get("path", "")) if isinstance(http, dict) else ""
        short = re.sub(r'=~"[^"]{80,}"', '=~"..."', query)
        rows.append((_samples(e), seconds, path.rsplit("/", 1)[-1], short))
    rows.sort(key=lambda r: -r[0])
    return [f"{n:>10,} {t:7.3f}s {path:<11} {q}" for n, t, path, q in rows]


@contextmanager
def serve(backend: str, workdir: Path, tsdb: Path) -> Iterator[tuple[str, int, int]]:
    """The TSDB served by ``backend``: (query URL, server PID, series: -1 to count). For
    VictoriaMetrics the same blocks are imported with vmctl (tests/vmharness.py) first; it
    keeps its default limits but one, so its series count is the import's (a count over every
    series exceeds its -search.maxUniqueTimeseries at 1,024 nodes). The one: explain's
    longest query for the 1,024-node job is 27.8 KB (its nodes named three times), over the
    default -search.maxQueryLen (16 KiB; docs/install.md, VictoriaMetrics)."""
    shutil.rmtree(workdir / backend, ignore_errors=True)
    if backend == "prometheus":
        lifecycle = ["--web.enable-lifecycle"]
        with start_prometheus(workdir / backend, [], tsdb_path=tsdb, extra_args=lifecycle) as prom:
            _log_queries(prom.url, workdir / backend / "prometheus.yml", _query_log(workdir))
            yield prom.url, prom.process.pid, -1
    else:
        with start_victoria_metrics(workdir / backend, ["-search.maxQueryLen=64KiB"]) as vm:
            t0 = time.perf_counter()
            series = vm.import_tsdb(tsdb)
            took = time.perf_counter() - t0
            print(f"imported into VictoriaMetrics in {took:.0f}s", file=sys.stderr, flush=True)
            yield vm.url, vm.process.pid, series


def measure(
    workdir: Path,
    nodes: int,
    hours: float,
    step: float,
    *,
    runs: int,
    plot: Path | None,
    against: Path | None = None,
    backend: str = "prometheus",
    query_log: Path | None = None,
) -> list[dict[str, object]]:
    """One result per checkout: this one, then ``against`` when given; ``backend`` serves
    the data (prometheus, or victoriametrics); ``query_log``: where this checkout's last
    run's queries go, heaviest first (Prometheus only)."""
    build, slot = _build(workdir, nodes, hours, step)
    with serve(backend, workdir, build / "tsdb") as (url, server_pid, imported):
        series = imported
        if series < 0:
            client = PrometheusClient(ClientSettings(url, timeout=120))
            count = "count({__name__=~'fabricscope_.+'})"
            series = int(client.query(count, slot["end"])[0].value)
        args = [
            sys.executable,
            "-m",
            "exporter.cli",
            "explain",
            "--prometheus.url",
            url,
            "--prometheus.timeout",
            "2m",
            "--deadline",
            "10m",
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
            "--log.level",
            "info",
        ]
        checkouts = [ROOT] + ([against.resolve()] if against is not None else [])
        rows: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
        transcript = ""
        queries: list[str] = []
        log = _query_log(workdir) if backend == "prometheus" else None
        for i in range(runs):
            for code in checkouts if i % 2 == 0 else checkouts[::-1]:
                mark = log.stat().st_size if log is not None and log.exists() else 0
                row, out = _one(server_pid, args, code, plot if i == 0 and code == ROOT else None)
                if log is not None:
                    entries = _logged(log, mark)
                    row["prometheus_samples_millions"] = sum(map(_samples, entries)) / 1e6
                    if code == ROOT:
                        queries = _query_lines(entries)
                rows[code].append(row)
                if code == ROOT:
                    transcript = transcript or out
        answers = {code: _json_answer(args, code) for code in checkouts}
        top = answers[ROOT]["findings"][0]
    print(transcript, file=sys.stderr)
    if query_log is not None and queries:
        query_log.write_text("\n".join(queries) + "\n")
    results = []
    for code, got in rows.items():
        result: dict[str, object] = {
            "backend": backend,
            "checkout": "this" if code == ROOT else str(code),
            "nodes": nodes,
            "hours": hours,
            "series": series,
            "samples_millions": round(series * (hours * 3600 / step + 1) / 1e6, 1),
            "top": f"{top['cause']} {top['device']} ({top['score']})" if code == ROOT else "",
        }
        if code != ROOT:  # the whole --format json answer, but its elapsed_seconds
            result["same_answer"] = answers[code] == answers[ROOT]
        for k in got[0]:
            result[k] = statistics.median(r[k] for r in got)
        result["wall_max_s"] = max(r["wall_s"] for r in got)
        results.append(result)
    return results


def _json_answer(args: list[str], code: Path) -> dict[str, Any]:
    """Checkout ``code``'s ``--format json`` answer, but the seconds it took."""
    env = dict(os.environ, PYTHONPATH=str(code))
    js = subprocess.run(
        [*args, "--format", "json"], capture_output=True, text=True, env=env, cwd=code, check=False
    )
    answer = json.loads(js.stdout)
    if not isinstance(answer, dict):
        raise SystemExit(f"{code}: --format json is not an object")
    answer.pop("elapsed_seconds", None)
    return answer


def _one(
    server_pid: int, args: list[str], code: Path, plot: Path | None
) -> tuple[dict[str, float], str]:
    """One whole explain command of checkout ``code``: its measures and its table."""
    extra = ["--plot", str(plot)] if plot else []
    env = dict(os.environ, PYTHONPATH=str(code))
    prom_before = proc_cpu(server_pid)
    t0 = time.perf_counter()
    out, usage = _run_measured([*args, *extra], env, code)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        raise SystemExit(1)
    summary = re.search(
        r"answered with (\d+) queries, ([\d.]+) MB received \(([\d.]+) MB", out.stderr
    )
    if summary is None:
        raise SystemExit(f"no summary line in explain's stderr:\n{out.stderr}")
    row = {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_mib": usage.ru_maxrss / 1024,
        "queries": float(summary.group(1)),
        "mb_received": float(summary.group(2)),
        "mb_uncompressed": float(summary.group(3)),
        "prometheus_cpu_s": proc_cpu(server_pid) - prom_before,
    }
    return row, out.stdout


#: the measures printed as this checkout's over the other's
RATIOS = (
    "wall_s",
    "cpu_s",
    "rss_mib",
    "queries",
    "prometheus_cpu_s",
    "prometheus_samples_millions",
)


def _millions(value: object) -> str:
    return f"{value:.1f} M" if isinstance(value, float) else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="64", help="comma-separated job sizes")
    ap.add_argument("--hours", default="6", help="comma-separated window lengths")
    ap.add_argument("--step", type=float, default=30.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fabricscope-bench-explain"))
    ap.add_argument("--plot", type=Path, default=None, help="also write the plot of one run")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        help="another checkout whose explain takes turns with this one's (side by side)",
    )
    ap.add_argument(
        "--query-log",
        type=Path,
        default=None,
        help="write this checkout's last run's queries here, heaviest first (Prometheus)",
    )
    ap.add_argument(
        "--backends",
        default="prometheus",
        help="comma-separated: prometheus, victoriametrics (the same blocks, imported)",
    )
    ns = ap.parse_args()
    results = []
    print(
        "| backend | nodes | window | checkout | series / samples in the TSDB "
        "| wall, median (max) | explain CPU | explain RSS | queries | received (uncompressed) "
        "| server CPU | samples the server read | top finding |"
    )
    print("|" + " --- |" * 13)
    sizes = [(int(n), float(h)) for n in ns.nodes.split(",") for h in ns.hours.split(",")]
    for (nodes, hours), backend in ((s, b) for s in sizes for b in ns.backends.split(",")):
        both = measure(
            ns.workdir, nodes, hours, ns.step, runs=ns.runs, plot=ns.plot,
            against=ns.against, backend=backend, query_log=ns.query_log,
        )  # fmt: skip
        results += both
        for r in both:
            print(
                f"| {backend} | {nodes} | {hours:g} h | {r['checkout']} "
                f"| {r['series']:,} / {r['samples_millions']}M "
                f"| {r['wall_s']:.1f} s ({r['wall_max_s']:.1f} s) | {r['cpu_s']:.1f} s "
                f"| {r['rss_mib']:.0f} MiB | {r['queries']:.0f} | {r['mb_received']:.1f} MB "
                f"({r['mb_uncompressed']:.1f} MB) | {r['prometheus_cpu_s']:.1f} s "
                f"| {_millions(r.get('prometheus_samples_millions'))} | {r['top']} |",
                flush=True,
            )
        if len(both) == 2:
            this, other = both
            ratios = ", ".join(
                f"{k} {float(this[k]) / float(other[k]):.2f}"  # type: ignore[arg-type]
                for k in RATIOS
                if k in this and k in other and float(other[k])  # type: ignore[arg-type]
            )
            same = "the same" if other.get("same_answer") else "NOT the same"
            print(f"this checkout over {other['checkout']}: {ratios}", flush=True)
            print(f"--format json answers (but elapsed_seconds): {same}", flush=True)
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
