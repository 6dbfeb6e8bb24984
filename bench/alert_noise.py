"""The fleet alert budget: the shipped rules over a 500-node fleet's history, in a real
Prometheus, and what fires.

The history (``bench/fleet_history.py``): DGX-class nodes rendered by the real agent, with the
background a large fleet always has (rails whose 32-bit ``port_xmit_wait`` stopped at its
maximum long ago, application XIDs a few an hour, a single link flap an hour, two nodes
rebooting, one node with 0.1 % of the fleet's ports administratively disabled, ports counting
a few symbol errors an hour, training jobs whose every rank prints tokens/s with a checkpoint
dip every 30 minutes) and four planted faults in its last third (a bad cable, a port
retrained at half its rate, a NIC at PCIe x8, a lost GPU), each slowing or ending its job.

The rules are whatever ``deploy/rules/*.rules.yaml`` holds now. Recording rules are backfilled
with ``promtool tsdb create-blocks-from rules`` (in dependency order, a Prometheus restart
between levels); every alerting rule's expression is then evaluated by Prometheus as a range
query at one-minute steps over the history (Prometheus 2.42 cannot evaluate alerts over the
past), and its ``for`` is applied here the way the rule manager does: an alert is pending from
the first evaluation that returns its label set and fires once it has been returned for
``for`` without a gap. An episode is one label set's run of firing evaluations.

Each episode is attributed to a planted fault when it names the fault's node (or, for the
throughput alerts, its job) and starts after the fault; everything else is background. The
first hour is the rules' warm-up (their windows reach an hour back): an episode counts when it
fires at or after it.

    python bench/alert_noise.py [--nodes 500] [--hours 2] [--workdir DIR]
        [--out bench/results] [--preview dashboards/previews]

Writes ``alert_noise.json`` and ``alert_noise.md`` (the tables docs/performance.md quotes) and
``fleet_panels.json`` (each Fleet dashboard panel's series count on this history) into
``--out``; with ``--preview``, the Fleet dashboard's preview drawn from this history. Exits 1
when a planted fault raises no alert or the background pages (warning or critical) more than
``--max-background-pages`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "dashboards"))

import fleet_history  # noqa: E402

from tests.promharness import backfill_recording_rules, start_prometheus  # noqa: E402
from tests.rule_eval import Episode, Rule, api, evaluate, load_rules, record_levels  # noqa: E402

WARMUP = 3600.0
#: what an episode's labels say in the report's examples
EXAMPLE_LABELS = ("instance", "device", "gpu", "reason", "counter", "job_name", "pci_bus_id")


# --- rules ---------------------------------------------------------------------------------


@contextmanager
def serve(tsdb: Path) -> Iterator[str]:
    shutil.rmtree(tsdb.parent / "prometheus", ignore_errors=True)
    with start_prometheus(
        tsdb.parent / "prometheus",
        [],
        tsdb_path=tsdb,
        extra_args=["--query.timeout=5m", "--query.max-samples=200000000"],
    ) as prom:
        yield prom.url


def backfill_records(tsdb: Path, start: float, end: float, rules: list[Rule]) -> float:
    """Each level of recording rules backfilled by promtool into ``tsdb``; seconds taken."""
    t0 = time.perf_counter()
    for k, level in enumerate(record_levels(rules)):
        rule_file = tsdb.parent / f"records-{k}.yaml"
        group = [{"record": r.name, "expr": r.expr} for r in level]
        rule_file.write_text(yaml.safe_dump({"groups": [{"name": f"level{k}", "rules": group}]}))
        backfill_recording_rules(tsdb, [rule_file], start, end)
    return time.perf_counter() - t0


# --- alerts over the history ---------------------------------------------------------------


def attribute(ep: Episode, history: fleet_history.History) -> str:
    """The planted fault ``ep`` belongs to, or ""."""
    p = history.plan
    jobs = {n.name: n.job for n in p.nodes}
    for f in p.faults:
        if ep.start < history.start + f.at:
            continue  # firing before the fault: not the fault's
        if ep.labels.get("job_name") == jobs[f.node]:
            return f.kind  # the fault's job slowed or stopped
        # on the fault's node, naming its port, GPU or PCI function
        if ep.labels.get("instance") == f.node and any(ep.labels.get(k) == v for k, v in f.labels):
            return f.kind
    return ""


# --- the Fleet dashboard on this history --------------------------------------------------


def fleet_panel_counts(url: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    import generate

    out = []
    for p in generate.FLEET.panels:
        for expr, _ in p.targets:
            q = substitute(expr, end - start)
            if p.kind == "timeseries":
                res = api(url, "/api/v1/query_range",
                          {"query": q, "start": f"{start:.0f}", "end": f"{end:.0f}",
                           "step": f"{step:g}"})  # fmt: skip
            else:
                res = api(url, "/api/v1/query", {"query": q, "time": f"{end:.0f}"})
            out.append({"panel": p.title, "kind": p.kind, "series": len(res), "query": q})
    return out


def substitute(expr: str, span: float) -> str:
    values = {
        "$__rate_interval": "4m",
        "$__range": f"{span:.0f}s",
        "$cluster": ".*",
        "$node": ".*",
    }
    for k, v in values.items():
        expr = expr.replace(k, v)
    return expr


# --- report --------------------------------------------------------------------------------


def report(history: fleet_history.History, episodes: list[Episode], timings: dict[str, float],
           max_background_pages: int) -> tuple[dict[str, Any], str, list[str]]:  # fmt: skip
    p = history.plan
    eval_from = history.start + WARMUP
    counted = [e for e in episodes if e.end >= eval_from]
    alerts = sorted({e.alert for e in counted})
    rows = []
    for a in alerts:
        es = [e for e in counted if e.alert == a]
        bg = [e for e in es if not e.fault]
        rows.append({
            "alert": a,
            "severity": es[0].severity,
            "planted": sorted({e.fault for e in es if e.fault}),
            "planted_episodes": len(es) - len(bg),
            "background_episodes": len(bg),
            "background_firing_at_end": sum(1 for e in bg if e.end >= history.end - history.step),
            "background_examples": [
                {k: v for k, v in e.labels.items() if k in EXAMPLE_LABELS} for e in bg[:3]
            ],
        })  # fmt: skip
    faults = []
    problems = []
    for f in p.faults:
        mine = [e for e in counted if e.fault == f.kind]
        first = min((e.start for e in mine), default=None)
        names = sorted({e.alert for e in mine})
        faults.append({
            "fault": f.kind,
            "node": f.node,
            "where": dict(f.labels),
            "description": f.description,
            "alerts": names,
            "episodes": len(mine),
            "first_alert_after_s": None if first is None else first - (history.start + f.at),
        })  # fmt: skip
        if not names:
            problems.append(f"planted fault {f.kind} on {f.node} raised no alert")
    pages = [e for e in counted if not e.fault and e.severity in ("warning", "critical")]
    info = [e for e in counted if not e.fault and e.severity not in ("warning", "critical")]
    if len(pages) > max_background_pages:
        problems.append(
            f"the background paged {len(pages)} times (at most {max_background_pages}): "
            + ", ".join(sorted({e.alert for e in pages}))
        )
    data = {
        "nodes": len(p.nodes),
        "hours": p.seconds / 3600,
        "step_s": p.step,
        "samples": history.samples,
        "evaluated_from_s": WARMUP,
        "background": p.background,
        "rules": sorted({r.file for r in load_rules()}),
        "alerts": rows,
        "faults": faults,
        "background_pages": len(pages),
        "background_info": len(info),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    md = [
        f"{len(p.nodes)} nodes, {p.seconds / 3600:g} h at {p.step:g} s "
        f"({history.samples:,} samples), alerts counted from minute {WARMUP / 60:.0f}; "
        f"background: " + ", ".join(f"{v} {k}" for k, v in p.background.items()) + ".",
        "",
        "| alert | severity | planted faults it caught (episodes) | background episodes "
        "(firing at the end) |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        caught = ", ".join(r["planted"]) + f" ({r['planted_episodes']})" if r["planted"] else "-"
        md.append(
            f"| {r['alert']} | {r['severity']} | {caught} | {r['background_episodes']} "
            f"({r['background_firing_at_end']}) |"
        )
    md += ["", "| planted fault | node | alerts | first alert after |", "| --- | --- | --- | --- |"]
    for f in faults:
        after = (
            "-" if f["first_alert_after_s"] is None else f"{f['first_alert_after_s'] / 60:.0f} min"
        )
        names = ", ".join(f["alerts"]) or "none"
        md.append(f"| {f['fault']}: {f['description']} | {f['node']} | {names} | {after} |")
    md += [
        "",
        f"Background pages (warning or critical): {len(pages)}; background info alerts: "
        f"{len(info)}.",
    ]
    return data, "\n".join(md) + "\n", problems


@dataclass
class Run:
    history: fleet_history.History
    episodes: list[Episode]
    panels: list[dict[str, Any]]
    timings: dict[str, float]


def run(
    nodes: int,
    hours: float,
    step: float,
    seed: int,
    workdir: Path,
    *,
    reuse: bool = False,
    preview_dir: Path | None = None,
    log: Any = None,
) -> Run:
    """Build (or reuse) the history in ``workdir``, evaluate every shipped rule over it,
    count the Fleet dashboard's series; with ``preview_dir``, draw the Fleet preview."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    work = workdir / f"{nodes}n-{hours:g}h-{step:g}s-{seed}"
    meta = work / "history.json"
    rules = load_rules()
    if reuse and meta.exists():  # the same history (the plan is the seed's), rules recorded
        m = json.loads(meta.read_text())
        plan = fleet_history.plan(nodes, hours, step, seed)
        history = fleet_history.History(
            work / "tsdb", m["start"], m["end"], step, plan, m["samples"], m["series"]
        )
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        history = fleet_history.build(work, nodes, hours, step, seed=seed, log=log or print)
        timings["history"] = time.perf_counter() - t0
        timings["recording_rules"] = backfill_records(
            history.tsdb, history.start, history.end, rules
        )
        kept = {"start": history.start, "end": history.end}
        kept |= {"samples": history.samples, "series": history.series}
        meta.write_text(json.dumps(kept))
    t1 = time.perf_counter()
    episodes: list[Episode] = []
    with serve(history.tsdb) as url:
        q_start = history.start + WARMUP - max(r.for_s for r in rules if r.alert) - history.step
        for r in rules:
            if not r.alert:
                continue
            for e in evaluate(url, r, max(history.start, q_start), history.end, history.step):
                episodes.append(
                    Episode(e.alert, e.severity, e.labels, e.start, e.end, attribute(e, history))
                )
        timings["alerts"] = time.perf_counter() - t1
        panels = fleet_panel_counts(url, history.start + WARMUP, history.end, history.step)
        if preview_dir:
            import preview

            preview_dir.mkdir(parents=True, exist_ok=True)
            span = (history.start + WARMUP, history.end, history.step)
            note = f"{nodes}-node fleet history, bench/alert_noise.py"
            path = preview.render_board(
                preview.generate.FLEET, url, span, "", preview_dir, source=note
            )
            print(path, file=sys.stderr)
    timings["total"] = time.perf_counter() - t0
    return Run(history, episodes, panels, timings)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--step", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fabricscope-alert-noise"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--preview", type=Path, default=None, help="draw the Fleet preview here")
    ap.add_argument("--max-background-pages", type=int, default=5)
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="use the history a previous run left in --workdir (kept with --keep)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the history in --workdir")
    ns = ap.parse_args()
    r = run(
        ns.nodes, ns.hours, ns.step, ns.seed, ns.workdir,
        reuse=ns.reuse, preview_dir=ns.preview,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )  # fmt: skip
    data, md, problems = report(r.history, r.episodes, r.timings, ns.max_background_pages)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "alert_noise.json").write_text(json.dumps(data, indent=2) + "\n")
    (ns.out / "alert_noise.md").write_text(md)
    (ns.out / "fleet_panels.json").write_text(
        json.dumps({"nodes": ns.nodes, "hours": ns.hours, "panels": r.panels}, indent=2) + "\n"
    )
    print(md)
    for row in r.panels:
        print(f"{row['series']:6d}  {row['panel']}")
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if not ns.keep:
        shutil.rmtree(ns.workdir / f"{ns.nodes}n-{ns.hours:g}h-{ns.step:g}s-{ns.seed}",
                      ignore_errors=True)  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
