"""``fabricscope explain`` measured as fault-localisation papers measure it: many injected
faults of many kinds, randomly placed, near the noise floor, over jobs of 64 to 1,024 nodes;
top-1 accuracy, recall, localisation, false causes on healthy windows and seconds per answer,
per class, with every miss listed.

Where the series come from: every node carries what the real agent (``agent --once``)
exports for the DGX H100 fixture tree and the recorded 2x H200 NVML answers (the template of
``tests/explain_lab.py``: 12 RDMA ports, PCI links, 2 GPUs with 18 NVLinks each); the series
no fixture replays (netdev PFC, pod attribution, NUMA placement, NCCL channels and RAS, the
ibpeer sampler's cable ends and uplinks, throughput) are written with the catalog's names and
labels. Each case is one job in its own slot of one TSDB (``promtool tsdb create-blocks-from
openmetrics``, one run per case), served by a real Prometheus; explain runs in process on
each case's window with nothing but the job and the window, as an SRE would run it.

A case (``make_case``, everything drawn from ``random.Random(seed)``):

* the job: ``nodes`` nodes (64 to 1,024) under leaves of uneven size (each node's eight
  compute ports under one leaf), every leaf cabled once to each of 2 to 8 spines;
* the background every case has: symbol-error trickles (Poisson, 0-0.5/min) on a few
  percent of ports at both cable ends and on some uplinks, a steady xmit_wait share,
  PFC and CNP chatter, throughput noise with checkpoint dips, and in a third of cases a
  gap of several minutes in one or two nodes' data;
* the fault (none for ``healthy``; two of different classes on different nodes for
  ``two_faults``), starting at the change, on a random node, port, GPU, leaf or spine, its
  magnitude drawn from 1.5 to 8 times its check's significance (log-uniform): near the
  noise floor, not far above it;
* the job's throughput falls 8-35 % at the change (not for ``healthy`` and ``numa``).

Scoring, per case: **top-1**: the first finding that stands out is a planted cause, on
the planted device; **recall**: the planted causes standing out anywhere, on their device,
over all planted causes; **localisation**: of the cases whose first finding has the planted
cause, those naming the planted device; **false causes**: healthy cases with any finding
standing out; seconds per answer: explain's own time in process (the Prometheus on the
same machine).

    python bench/explain_accuracy.py [--seed 1] [--cases 105] [--sizes 64,128,256,1024]
        [--extra "1024:spine,leaf"] [--workdir DIR] [--json out.json] [--markdown out.md]
        [--classes a,b] [--log answers.log] [--template node.json]
        [--replay "25:67:healthy:64"]  (a case of an earlier run: seed, case, class, nodes)
        [--trickle 0.5]  (the background trickles' highest rate, errors a minute)
        [--min-top1 0.9 --max-false 0.1]  (exit 1 below them: CI's slice)
    python bench/explain_accuracy.py --merge a.json b.json [--markdown all.md]
        (the summary of several runs' cases together; each --json keeps every case)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for where in (ROOT, ROOT / "bench"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))

from explain_cases import (  # noqa: E402
    CLASSES,
    JOB,
    SLOT,
    TRICKLE,
    WINDOW,
    Case,
    Fault,
    Template,
    cases_for,
    make_case,
    write_case,
)

from exporter.explain.client import ClientSettings, PrometheusClient  # noqa: E402
from exporter.explain.discover import JobSpec  # noqa: E402
from exporter.explain.report import ExplainError, Report, explain  # noqa: E402
from tests import explain_lab  # noqa: E402

__all__ = ["CLASSES", "cases_for", "main", "make_case"]


# --- running and scoring ---------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    case: Case
    seconds: float
    cpu: float  # explain's own CPU seconds (its threads included)
    top: list[tuple[str, str, float]]  # (cause, device, score) of the findings standing out
    error: str = ""
    top1: bool = False
    cause_top1: bool = False
    found: list[bool] = field(default_factory=list)


def matches(f: Fault, cause: str, device: str) -> bool:
    if cause != f.cause:
        return False
    if f.cls == "nic_pcie":  # "node-0003 0000:3c:00.0 (nic mlx5_3)"
        return device.startswith(f.device + " ") and f"{f.get('dev')})" in device
    return device.startswith(f.device)


def score(
    case: Case, report: Report | None, seconds: float, cpu: float, error: str = ""
) -> Outcome:
    top = [] if report is None else [(f.cause, f.device, f.score) for f in report.causes]
    out = Outcome(case, seconds, cpu, top, error)
    if not case.faults:
        out.top1 = not top and not error
        out.cause_top1 = out.top1
        return out
    if top:
        out.top1 = any(matches(f, top[0][0], top[0][1]) for f in case.faults)
        out.cause_top1 = any(top[0][0] == f.cause for f in case.faults)
    out.found = [any(matches(f, c, d) for c, d, _ in top) for f in case.faults]
    return out


def load_template(path: str) -> Template:
    """The agent's series of one node: from ``path`` (written by ``--dump-template``, for a
    machine without the agent's tools), else from two real ``agent --once`` runs."""
    if path:
        return [tuple(x) for x in json.loads(Path(path).read_text())]  # type: ignore[misc]
    return explain_lab.agent_template()


def build_case(job: tuple[Case, Template, str, str]) -> str:
    """One case into the shared TSDB directory (its own OpenMetrics file, one promtool run:
    blocks of different cases never overlap); returns a line for the log."""
    case, template, work, promtool = job
    om = Path(work) / f"case-{case.seed}-{case.idx}.om"
    t = time.monotonic()
    write_case(case, template, om, case.start)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(Path(work) / "tsdb")],
        capture_output=True,
        text=True,
        check=False,
    )
    om.unlink()
    if done.returncode:
        raise RuntimeError(f"promtool failed on case {case.idx}: {done.stderr[-800:]}")
    return f"built case {case.idx} {case.cls} {case.nodes} nodes in {time.monotonic() - t:.0f}s"


@contextmanager
def serve(work: Path, prometheus: str) -> Iterator[str]:
    """A real Prometheus serving ``work``/tsdb (no scrapes), until the context ends."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            "--storage.tsdb.retention.time=10y",
            f"--web.listen-address=127.0.0.1:{port}",
            "--query.max-samples=200000000",
            # the blocks stay as promtool wrote them: no compaction competing with answers
            "--storage.tsdb.min-block-duration=2h",
            "--storage.tsdb.max-block-duration=2h",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"prometheus did not start: {(work / 'prometheus.log').read_text()[-800:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run(args: argparse.Namespace) -> list[Outcome]:
    classes = args.classes.split(",") if args.classes else list(CLASSES)
    sizes = [int(x) for x in args.sizes.split(",")]
    tr = args.trickle
    cases = cases_for(args.seed, args.cases, sizes, classes, tr)
    if args.largest:  # the timing case: the last case at the largest size
        cases[-1] = make_case(args.seed, len(cases) - 1, cases[-1].cls, max(sizes), tr)
    for spec in filter(None, args.extra.split(";")):  # "1024:spine,leaf": one case each
        nodes, _, names = spec.partition(":")
        for cls in names.split(","):
            cases.append(make_case(args.seed, len(cases), cls, int(nodes), tr))
    for spec in filter(None, args.replay.split(";")):  # "25:67:healthy:64": as a run drew it
        seed, idx, cls, nodes = spec.split(":")
        cases.append(make_case(int(seed), int(idx), cls, int(nodes), tr))
    template = load_template(args.template)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fs-explain-acc-"))
    shutil.rmtree(work / "tsdb", ignore_errors=True)
    (work / "tsdb").mkdir(parents=True)
    now = math.floor(time.time() / 3600) * 3600 - 3600
    t0 = now - SLOT * len(cases)
    built = time.monotonic()
    for slot, case in enumerate(cases):  # a replayed case's index is not its slot
        case.start = t0 + slot * SLOT
    jobs = [(c, template, str(work), args.promtool) for c in cases]
    # the largest first, so the pool ends together
    jobs.sort(key=lambda j: -j[0].nodes)
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for line in pool.map(build_case, jobs):
            print(line, file=sys.stderr)
    print(f"built {len(cases)} cases in {time.monotonic() - built:.0f}s", file=sys.stderr)
    outcomes = []
    with serve(work, args.prometheus) as url:
        client = PrometheusClient(ClientSettings(url, timeout=120.0))
        for case in cases:
            t, c = time.monotonic(), time.process_time()
            report, error = None, ""
            try:
                report = explain(client, JobSpec(JOB), case.start, case.start + WINDOW)
            except ExplainError as e:
                error = str(e)
            o = score(case, report, time.monotonic() - t, time.process_time() - c, error)
            outcomes.append(o)
            mark = "ok  " if o.top1 else "MISS"
            line = (
                f"{mark} {case.idx:3d} {case.cls:16s} {case.nodes:5d} {o.seconds:6.2f}s "
                f"(cpu {o.cpu:5.2f}s) {o.top[:1]}"
            )
            print(line, file=sys.stderr)
            if args.log:  # one line per answer as it comes: a bounded run keeps what it did
                with open(args.log, "a") as fh:
                    fh.write(line + "\n")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return outcomes


def record(o: Outcome) -> dict[str, object]:
    """One answer as the JSON keeps it (what the summary needs, and what --merge reads)."""
    return {
        "seed": o.case.seed,
        "case": o.case.idx,
        "class": o.case.cls,
        "nodes": o.case.nodes,
        "planted": [f"{f.cause} {f.device.strip()} x{f.magnitude:.1f}" for f in o.case.faults],
        "top1": o.top1,
        "cause_top1": o.cause_top1,
        "found": o.found,
        "seconds": round(o.seconds, 3),
        "cpu": round(o.cpu, 3),
        "first": f"{o.top[0][0]} {o.top[0][1]} {o.top[0][2]:.2f}" if o.top else "nothing",
        "error": o.error,
        "trickle": o.case.trickle,
    }


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def summary(outcomes: list[Outcome] | list[dict]) -> dict[str, object]:  # type: ignore[type-arg]
    """Per class and over all: top-1, recall, localisation, false causes, seconds; the
    healthy windows' bound; every miss; and every case (``cases``)."""
    recs = [o if isinstance(o, dict) else record(o) for o in outcomes]
    per: dict[str, list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    for r in recs:
        per[r["class"]].append(r)

    def figures(rs: list[dict]) -> dict[str, float]:  # type: ignore[type-arg]
        faulty = [r for r in rs if r["planted"]]
        healthy = [r for r in rs if not r["planted"]]
        planted = sum(len(r["found"]) for r in faulty)
        with_cause = [r for r in faulty if r["cause_top1"]]
        return {
            "cases": len(rs),
            "top1": sum(r["top1"] for r in rs) / len(rs) if rs else 0.0,
            "recall": sum(sum(r["found"]) for r in faulty) / planted if planted else float("nan"),
            "localisation": (
                sum(r["top1"] for r in with_cause) / len(with_cause) if with_cause else float("nan")
            ),
            "false_causes": (
                sum(not r["top1"] for r in healthy) / len(healthy) if healthy else float("nan")
            ),
            "seconds_median": _median([r["seconds"] for r in rs]),
            "seconds_max": max((r["seconds"] for r in rs), default=0.0),
            "cpu_seconds_median": _median([r["cpu"] for r in rs]),
            "cpu_seconds_max": max((r["cpu"] for r in rs), default=0.0),
        }

    by_size: dict[int, list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    for r in recs:
        by_size[r["nodes"]].append(r)
    healthy = [r for r in recs if not r["planted"]]
    false = sum(not r["top1"] for r in healthy)
    faulty = [r for r in recs if r["planted"]]
    return {
        "all": figures(recs),
        "faulty": figures(faulty),
        "classes": {c: figures(v) for c, v in sorted(per.items())},
        "seconds_by_nodes": {
            str(n): {
                "cases": len(v),
                "seconds_median": _median([r["seconds"] for r in v]),
                "seconds_max": max(r["seconds"] for r in v),
                "cpu_seconds_median": _median([r["cpu"] for r in v]),
                "cpu_seconds_max": max(r["cpu"] for r in v),
                "top1": sum(r["top1"] for r in v) / len(v),
            }
            for n, v in sorted(by_size.items())
        },
        "healthy": {
            "windows": len(healthy),
            "false_causes": false,
            "upper95": upper_bound(false, len(healthy)),
        },
        "top1_lower95": {
            "all": lower_bound(sum(r["top1"] for r in recs), len(recs)),
            "faulty": lower_bound(sum(r["top1"] for r in faulty), len(faulty)),
        },
        "misses": [
            {k: r[k] for k in ("seed", "case", "class", "nodes", "planted", "first", "error")}
            for r in recs
            if not r["top1"]
        ],
        "cases": recs,
    }


def lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson lower bound of a success rate seen ``k`` times in
    ``n``: one minus the upper bound of the failures."""
    return 1.0 - upper_bound(n - k, n, confidence) if n else 0.0


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate seen ``k`` times in ``n`` (the
    rate the data rules out at ``confidence``); 1.0 when nothing was seen."""
    if n == 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):  # bisect the binomial tail P(X <= k; p) = 1 - confidence
        p = (lo + hi) / 2
        tail = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
        lo, hi = (p, hi) if tail > 1 - confidence else (lo, p)
    return hi


def markdown(s: dict, command: str) -> str:  # type: ignore[type-arg]
    def pct(x: float) -> str:
        if math.isnan(x):
            return "-"
        return f"{100 * x:.0f} %" if x in (0.0, 1.0) else f"{100 * x:.1f} %"

    h = s["healthy"]

    lines = [
        f"`{command}`, {time.strftime('%Y-%m-%d', time.gmtime())}",
        "",
        "| class | cases | top-1 | recall | localisation | false causes | s/answer (median, max) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [*s["classes"].items(), ("**all**", s["all"])]
    for name, f in rows:
        lines.append(
            f"| {name} | {f['cases']} | {pct(f['top1'])} | {pct(f['recall'])} | "
            f"{pct(f['localisation'])} | {pct(f['false_causes'])} | "
            f"{f['seconds_median']:.1f}, {f['seconds_max']:.1f} |"
        )
    lo = s["top1_lower95"]
    lines += [
        "",
        "| nodes | cases | top-1 | s/answer (median, max) | explain CPU s (median, max) |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {n} | {v['cases']} | {pct(v['top1'])} | {v['seconds_median']:.1f}, "
            f"{v['seconds_max']:.1f} | {v['cpu_seconds_median']:.1f}, {v['cpu_seconds_max']:.1f} |"
            for n, v in s["seconds_by_nodes"].items()
        ),
        "",
        f"Top-1 over all cases {100 * s['all']['top1']:.1f} % (above {100 * lo['all']:.1f} %, "
        "95 % one-sided Clopper-Pearson)"
        + (
            f"; over the {s['faulty']['cases']} with faults {100 * s['faulty']['top1']:.1f} % "
            f"(above {100 * lo['faulty']:.1f} %)."
            if s["faulty"]["cases"]
            else "."
        ),
        "",
        f"Healthy windows: {h['false_causes']} of {h['windows']} with a false cause; "
        f"the rate is below {100 * h['upper95']:.1f} % (95 % one-sided Clopper-Pearson).",
        "",
        "Every miss:",
        "",
    ]
    if not s["misses"]:
        lines.append("none")
    else:
        lines += [
            "| seed | case | class | nodes | planted | ranked first |",
            "|---:|---:|---|---:|---|---|",
        ]
        for m in s["misses"]:
            first = m["first"] if not m["error"] else f"error: {m['error'][:80]}"
            lines.append(
                f"| {m['seed']} | {m['case']} | {m['class']} | {m['nodes']} | "
                f"{'; '.join(m['planted']) or 'none (healthy)'} | {first} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, default=105)
    p.add_argument("--sizes", default="64,128,256,512,1024")
    p.add_argument("--classes", default="")
    p.add_argument("--largest", action="store_true", help="the last case at the largest size")
    p.add_argument(
        "--extra",
        default="",
        help="cases added after the drawn ones, one per class named: 1024:spine,leaf[;256:numa]",
    )
    p.add_argument(
        "--replay",
        default="",
        help="cases of earlier runs, as drawn there: SEED:CASE:CLASS:NODES[;...]",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=[],
        help="no run: the summary of the cases of these --json files together",
    )
    p.add_argument(
        "--trickle",
        type=float,
        default=TRICKLE,
        help="the background symbol-error trickles' highest rate, errors a minute (the same "
        "ports and draws: a stronger background scales the default one)",
    )
    p.add_argument("--workdir", default="")
    p.add_argument("--workers", type=int, default=2, help="processes building cases")
    p.add_argument("--template", default="", help="the node template from --dump-template")
    p.add_argument("--dump-template", default="", help="write the node template and exit")
    p.add_argument("--prometheus", default="prometheus")
    p.add_argument("--promtool", default="promtool")
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    p.add_argument("--log", default="", help="append one line per answer to this file")
    p.add_argument("--min-top1", type=float, default=0.0)
    p.add_argument("--max-false", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.dump_template:
        Path(args.dump_template).write_text(json.dumps(explain_lab.agent_template()))
        return 0
    if args.merge:
        s = summary([r for f in args.merge for r in json.loads(Path(f).read_text())["cases"]])
    else:
        s = summary(run(args))
    command = "python bench/explain_accuracy.py " + " ".join(argv or sys.argv[1:])
    md = markdown(s, command)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(md)
    all_ = s["all"]
    bad = all_["top1"] < args.min_top1 or (
        not math.isnan(all_["false_causes"]) and all_["false_causes"] > args.max_false
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
