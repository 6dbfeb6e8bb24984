"""The fleet alert budget: the shipped rules over a week of a 1,000-node fleet, in a real
Prometheus, what fires per 1,000 node-days, and what a real Alertmanager running the shipped
routing (deploy/alertmanager/alertmanager.yml) notifies.

The week (``bench/fleet_week.py``): DGX-class nodes rendered by the real agent
(``bench/fleet_history.py``), over the week's first two-hour slot for the whole fleet (with
the fleet-wide settings: 32-bit counters stopped, ACS redirect on every PCIe switch port;
job churn; a few nodes' rails on the previous firmware release; seven planted faults: a bad
cable, a port retrained at half its rate, a NIC at PCIe x8, a lost GPU, a rank NCCL's RAS
calls unresponsive, a node's pause storm, a job whose NVLinked GPUs talk over SHM) and over
every later node slot with a background event (single
flaps, application XIDs, reboots, drains with kube-state-metrics' cordon flag), a fraction
``--sample`` of them rendered, at one-minute resolution throughout. Symbol errors count at
bit-error rates below the 1e-12 ibdiagnet fails a port at. The NCCL probe runs at the
chart's defaults on the nodes no job holds (``bench/fleet_probe.py``); every job's pod
exports what the agent reads from a healthy job's NCCL log (``bench/fleet_nccl.py``).

The rules are whatever ``deploy/rules/*.rules.yaml`` holds now. Recording rules are backfilled
with ``promtool tsdb create-blocks-from rules`` (in dependency order, a Prometheus restart
between levels); every alerting rule's expression is then evaluated by Prometheus as a range
query at one-minute steps (Prometheus 2.42 cannot evaluate alerts over the past), and its
``for`` is applied here the way the rule manager does: an alert is pending from the first
evaluation that returns its label set and fires once it has been returned for ``for`` without
a gap. An episode is one label set's run of firing evaluations; it belongs to the slot it
starts in. Alerts firing when the slot starts are the week's standing alerts, counted once.

Each episode is attributed to a planted fault when it names the fault's node (or, for the
throughput alerts, its job) and starts after the fault; everything else is background, scaled
to the week (``fleet_week``'s docstring says how) and counted per 1,000 node-days.

    python bench/alert_noise.py [--nodes 1000] [--days 7] [--sample 0.1] [--workdir DIR]
        [--out bench/results] [--preview dashboards/previews]

Writes ``alert_noise.json`` and ``alert_noise.md`` (the tables the README and
docs/performance.md quote) and ``fleet_panels.json`` (each Fleet dashboard panel's series
count on this history) into ``--out``; with ``--preview``, the Fleet dashboard's preview.
Exits 1 when a planted fault raises no alert or raises its first later than its stated time
(``STATED_S``), or the background's warnings and criticals exceed
``--max-pages-per-1000-node-days`` (1) or any is critical.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import re
import shutil
import sys
import time
import urllib.request
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
import fleet_week  # noqa: E402
from fleet_states import BORN_WITH_FIRST_EVENT, folded_when_healthy  # noqa: E402

from tests.alert_routing import Delivery, deliver  # noqa: E402
from tests.promharness import backfill_recording_rules, start_prometheus  # noqa: E402
from tests.rule_eval import Episode, Rule, api, evaluate, load_rules, record_levels  # noqa: E402

#: each planted fault's stated time to its first alert (seconds after the fault starts): a
#: bad cable in 1 minute (2 at most, a scrape late), a degraded port in 5, a NIC at x8 in 15
#: (its rule's `for`), a lost GPU at once, a hung rank in 3 (RAS calls it unresponsive once
#: the counts stood a minute, for 1m, a scrape late), a pause storm in 5 (the NIC's storm
#: prevention stops the port 2 minutes in, a scrape late), an NVLink bypass in 11 (its
#: rule's `for`, a scrape late)
STATED_S: dict[str, float] = {
    "bad_cable": 120,
    "degraded_port": 300,
    "nic_x8": 900,
    "lost_gpu": 0,
    "hung_rank": 180,
    "congestion": 300,
    "nvlink_bypass": 660,
}

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

PAGES = ("warning", "critical")


def weigh(ep: Episode, wk: fleet_week.Week, slot_start: float) -> tuple[str, float]:
    """Where a background episode comes from, and how many of the week's it stands for."""
    inst = ep.labels.get("instance", "")
    if ep.start <= slot_start:
        if inst in wk.weights:  # begun in an earlier slot: counted in that slot's window
            return "carried in", 0.0
        return "standing", 1.0  # firing when the week's first slot starts: counted once
    if inst in wk.weights:
        return "event window", wk.weights[inst]
    if inst in wk.busy:
        return "first-slot event", 1.0
    if inst in wk.fleet_nodes:
        quiet = len(wk.fleet_nodes) - len(wk.busy)
        return "quiet sample", (wk.quiet_slots + quiet) / max(1, quiet)
    if "job_name" in ep.labels:
        return "job churn", wk.job_transitions / max(1, wk.fleet_job_transitions)
    return "fleet-wide", 1.0


def late(kind: str, after: float | None) -> bool:
    """Whether a planted fault of ``kind`` first alerting ``after`` seconds in (None: never)
    misses its stated time (a fault with none stated misses it)."""
    return after is None or kind not in STATED_S or after > STATED_S[kind]


def report(
    history: fleet_history.History,
    wk: fleet_week.Week,
    episodes: list[Episode],
    *,
    delivery: Delivery | None,
    timings: dict[str, float],
    max_pages: float,
    families: set[str],
) -> tuple[dict[str, Any], str, list[str]]:
    p = history.plan
    slot_start = history.start + fleet_week.WARMUP
    node_days = wk.nodes * wk.days
    counted = [e for e in episodes if e.end >= slot_start]
    weighed = [(e, *weigh(e, wk, slot_start)) for e in counted if not e.fault]
    rows = []
    for a in sorted({e.alert for e in counted}):
        es = [e for e in counted if e.alert == a]
        carried = sum(1 for e, where, _ in weighed if e.alert == a and where == "carried in")
        bg = [(e, where, w) for e, where, w in weighed if e.alert == a and where != "carried in"]
        week = sum(w for _, _, w in bg)
        rows.append({
            "alert": a,
            "severity": es[0].severity,
            "planted": sorted({e.fault for e in es if e.fault}),
            "planted_episodes": sum(1 for e in es if e.fault),
            "background_episodes": len(bg),
            "standing": sum(1 for _, where, _ in bg if where == "standing"),
            "carried_in": carried,
            "by_source": {s: sum(1 for _, where, _ in bg if where == s)
                          for s in sorted({where for _, where, _ in bg})},
            "week_estimate": round(week, 1),
            "per_1000_node_days": round(week / node_days * 1000, 2),
            "background_examples": [
                {k: v for k, v in e.labels.items() if k in EXAMPLE_LABELS} for e, _, _ in bg[:3]
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
            "stated_s": STATED_S.get(f.kind),
        })  # fmt: skip
        if not names:
            problems.append(f"planted fault {f.kind} on {f.node} raised no alert")
        elif late(f.kind, faults[-1]["first_alert_after_s"]):
            problems.append(
                f"planted fault {f.kind} on {f.node} first alerted "
                f"{faults[-1]['first_alert_after_s']:.0f} s in (stated: "
                f"{STATED_S.get(f.kind, 'none')} s)"
            )
    pages = [(e, w) for e, _, w in weighed if e.severity in PAGES]
    per_1000 = sum(w for _, w in pages) / node_days * 1000
    critical = [e for e, _ in pages if e.severity == "critical"]
    info = sum(w for e, _, w in weighed if e.severity not in PAGES) / node_days * 1000
    if per_1000 > max_pages:
        problems.append(
            f"the background pages {per_1000:.2f} times per 1,000 node-days (at most "
            f"{max_pages:g}): " + ", ".join(sorted({e.alert for e, _ in pages}))
        )
    if critical:
        problems.append("the background raised critical alerts: " + ", ".join(
            sorted({e.alert for e in critical})))  # fmt: skip
    notified = None
    if delivery is not None:
        notified = {
            "alerts_sent": sum(1 for _ in counted),
            "notifications": dict(delivery.notifications),
            "alerts_notified": dict(delivery.alerts),
            "suppressed": len(delivery.suppressed),
            "recorded_info": len(delivery.recorded),
        }
    by_alert = {r["alert"]: r["per_1000_node_days"] for r in rows}
    # an alert that fired over the history reads series the history holds, even where its
    # expression also reads sources the week does not model (a job's samples/s beside its
    # tokens/s): its background figure is measured
    # with the expression measured: a later change to it makes the figure stale
    exprs = {r.name: r.expr for r in load_rules() if r.alert}
    every = {
        name: {
            "modelled": m or name in by_alert,
            "per_1000_node_days": by_alert.get(name, 0.0) if m or name in by_alert else None,
            "expr": exprs[name],
        }
        for name, m in modelled(families).items()
    }
    data = {
        "nodes": wk.nodes,
        "days": wk.days,
        "node_days": node_days,
        "step_s": p.step,
        "samples": history.samples,
        "series": history.series,
        "rendered_nodes": len(p.nodes),
        "background": p.background,
        "rates_per_1000_node_days": {
            k: {"rate": r.per_1000_node_days, "source": r.source}
            for k, r in fleet_week.RATES.items()
        },
        "rules": sorted({r.file for r in load_rules()}),
        "alerts": rows,
        "faults": faults,
        "background_pages_per_1000_node_days": round(per_1000, 2),
        "background_critical": len(critical),
        "background_info_per_1000_node_days": round(info, 1),
        "alertmanager": notified,
        "every_alert": every,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    md = [
        f"{wk.nodes:,} nodes over {wk.days:g} days ({node_days:,.0f} node-days), sampled: the "
        f"whole fleet over the week's first 2-hour slot and {len(p.nodes) - wk.nodes:,} event "
        f"windows of later slots, at {p.step:g} s ({history.samples:,} samples); background: "
        + ", ".join(
            f"{v:,} {k}" for k, v in p.background.items() if k not in ("nodes", "node-days")
        )
        + ".",
        "",
        "| alert | severity | planted faults it caught (episodes) | background episodes rendered "
        "(standing) | background per 1,000 node-days |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        caught = ", ".join(r["planted"]) + f" ({r['planted_episodes']})" if r["planted"] else "-"
        md.append(
            f"| {r['alert']} | {r['severity']} | {caught} | {r['background_episodes']} "
            f"({r['standing']}) | {r['per_1000_node_days']:g} |"
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
        f"Background warnings and criticals: {per_1000:.2f} per 1,000 node-days "
        f"({len(critical)} critical); background info: {info:.1f} per 1,000 node-days.",
    ]
    if notified:
        n = notified["notifications"]
        md.append(
            f"Through a real Alertmanager running deploy/alertmanager/alertmanager.yml, the "
            f"{notified['alerts_sent']:,} alerts of this history made "
            f"{n.get('fabricscope-page', 0)} page and {n.get('fabricscope-ticket', 0)} ticket "
            f"notifications; {notified['recorded_info']} info alerts were recorded without one; "
            f"symptoms inhibited under their cause: {notified['suppressed']}."
        )
    return data, "\n".join(md) + "\n", problems


def alerts_doc_figure(every: dict[str, dict[str, Any]], alert: str) -> str:
    """The healthy fleet's figure for ``alert`` as docs/alerts.md's table gives it."""
    row = every.get(alert)
    if row is None:
        return "not measured yet"
    if not row["modelled"]:
        return "not in the week's history"
    return f"{row['per_1000_node_days']:g}"


def rewrite_alerts_doc(text: str, every: dict[str, dict[str, Any]]) -> str:
    """docs/alerts.md with its table's last column (per 1,000 node-days) from ``every``."""
    out = []
    for raw in text.splitlines(keepends=True):
        line = raw
        m = re.match(r"^\| \[(Fabricscope\w+)\]\(#\w+\) \|(.*)\| [^|]* \|$", line.rstrip("\n"))
        if m:
            head = line.rstrip("\n").rsplit("|", 2)[0]
            line = f"{head}| {alerts_doc_figure(every, m.group(1))} |\n"
        out.append(line)
    return "".join(out)


@dataclass
class Run:
    history: fleet_history.History
    week: fleet_week.Week
    episodes: list[Episode]
    panels: list[dict[str, Any]]
    delivery: Delivery | None
    timings: dict[str, float]
    #: the metric names in the history (recorded series included)
    families: set[str]


def label_values(url: str, label: str) -> list[str]:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        f"{url}/api/v1/label/{label}/values", timeout=300
    ) as r:
        values: list[str] = json.load(r)["data"]
        return values


def modelled(families: set[str]) -> dict[str, bool]:
    """Each alert -> whether every series its expression reads is in the history (else its
    figure says nothing: the week does not model its source), or is a family a healthy node
    leaves out whose per-GPU fold is in it (fleet_states.FOLDED_WHEN_HEALTHY: its absence is
    what the healthy fleet exports) or born with its first event beside a family that is
    (fleet_states.BORN_WITH_FIRST_EVENT), or is a recording rule's whose own reads are (a rule
    that records only what is wrong, such as fabricscope:probe_bad_node:last1h, records
    nothing over a healthy fleet: its absence is what the healthy fleet has)."""
    absent = {**folded_when_healthy(), **BORN_WITH_FIRST_EVENT}
    rendered = families | {n for n, f in absent.items() if f in families}
    rules = load_rules()

    def reads(r: Rule) -> set[str]:
        return set(re.findall(r"\b(?:fabricscope[:_][a-z0-9_:]+|kube_[a-z_]+)", r.expr))

    for level in record_levels(rules):
        rendered |= {r.name for r in level if reads(r) <= rendered}
    return {r.name: reads(r) <= rendered for r in rules if r.alert}


def run(
    nodes: int,
    days: float,
    step: float,
    seed: int,
    workdir: Path,
    *,
    sample: float = 1.0,
    job_size: int = 50,
    notify: bool = True,
    preview_dir: Path | None = None,
    log: Any = None,
) -> Run:
    """Build the week's history in ``workdir``, evaluate every shipped rule over it, count
    the Fleet dashboard's series, send the alerts through a real Alertmanager (``notify``);
    with ``preview_dir``, draw the Fleet preview."""
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    work = workdir / f"{nodes}n-{days:g}d-{step:g}s-{seed}"
    rules = load_rules()
    wk = fleet_week.week(nodes, days, step, seed, sample=sample, job_size=job_size)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    history = fleet_history.build(
        work, nodes, 0, step, seed=seed, log=log or print, fleet=wk.plan, acs=True
    )
    timings["history"] = time.perf_counter() - t0
    timings["recording_rules"] = backfill_records(history.tsdb, history.start, history.end, rules)
    t1 = time.perf_counter()
    episodes: list[Episode] = []
    with serve(history.tsdb) as url:
        q_start = history.start + fleet_week.WARMUP - max(r.for_s for r in rules if r.alert)
        for r in rules:
            if not r.alert:
                continue
            for e in evaluate(url, r, max(history.start, q_start - step), history.end, step):
                episodes.append(
                    Episode(e.alert, e.severity, e.labels, e.start, e.end, attribute(e, history))
                )
        timings["alerts"] = time.perf_counter() - t1
        families = set(label_values(url, "__name__"))
        span = (history.start + fleet_week.WARMUP, history.end, step)
        panels = fleet_panel_counts(url, *span)
        if preview_dir:
            import preview

            preview_dir.mkdir(parents=True, exist_ok=True)
            note = f"{nodes}-node fleet history, bench/alert_noise.py"
            path = preview.render_board(
                preview.generate.FLEET, url, span, "", preview_dir, source=note
            )
            print(path, file=sys.stderr)
    delivery = None
    if notify:
        t2 = time.perf_counter()
        counted = [e for e in episodes if e.end >= history.start + fleet_week.WARMUP]
        label_sets = [{"alertname": e.alert, **e.labels} for e in counted]
        delivery = deliver(label_sets, work / "alertmanager")
        timings["alertmanager"] = time.perf_counter() - t2
    timings["total"] = time.perf_counter() - t0
    return Run(history, wk, episodes, panels, delivery, timings, families)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--step", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--sample", type=float, default=0.1, help="fraction of event windows drawn")
    ap.add_argument("--job-size", type=int, default=50, help="nodes per training job")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/fabricscope-alert-noise"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--preview", type=Path, default=None, help="draw the Fleet preview here")
    ap.add_argument("--max-pages-per-1000-node-days", type=float, default=1.0)
    ap.add_argument("--keep", action="store_true", help="keep the history in --workdir")
    ap.add_argument(
        "--docs", type=Path, default=None,
        help="rewrite this alerts page's per-1,000-node-days column (docs/alerts.md)",
    )  # fmt: skip
    ap.add_argument(
        "--report-from", type=Path, default=None,
        help="write the report of a run saved by an earlier invocation (its run.pickle)",
    )  # fmt: skip
    ns = ap.parse_args()
    saved = ns.workdir / f"{ns.nodes}n-{ns.days:g}d-{ns.step:g}s-{ns.seed}.pickle"
    if ns.report_from:
        r = pickle.loads(ns.report_from.read_bytes())
    else:
        r = run(
            ns.nodes, ns.days, ns.step, ns.seed, ns.workdir,
            sample=ns.sample, job_size=ns.job_size, preview_dir=ns.preview,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )  # fmt: skip
        saved.write_bytes(pickle.dumps(r))
    data, md, problems = report(
        r.history, r.week, r.episodes,
        delivery=r.delivery, timings=r.timings, max_pages=ns.max_pages_per_1000_node_days,
        families=r.families,
    )  # fmt: skip
    data["command"] = (
        f"python bench/alert_noise.py --nodes {ns.nodes} --days {ns.days:g} --sample {ns.sample:g}"
    )
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "alert_noise.json").write_text(json.dumps(data, indent=2) + "\n")
    (ns.out / "alert_noise.md").write_text(md)
    (ns.out / "fleet_panels.json").write_text(
        json.dumps({"nodes": ns.nodes, "days": ns.days, "panels": r.panels}, indent=2) + "\n"
    )
    if ns.docs:
        ns.docs.write_text(rewrite_alerts_doc(ns.docs.read_text(), data["every_alert"]))
    print(md)
    for row in r.panels:
        print(f"{row['series']:6d}  {row['panel']}")
    for problem in problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    if not ns.keep:
        shutil.rmtree(ns.workdir / f"{ns.nodes}n-{ns.days:g}d-{ns.step:g}s-{ns.seed}",
                      ignore_errors=True)  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
