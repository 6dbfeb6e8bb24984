"""The report as a table for people and as JSON for tools."""

from __future__ import annotations

import json
import time
from textwrap import wrap
from typing import Any

from exporter.explain.checks import CAUSES
from exporter.explain.rank import Finding
from exporter.explain.report import Report

TOP = 10  # findings printed in full
PER_CAUSE = 3  # of one cause; the rest of that cause fold into one line


def _t(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _hm(t: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t))


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def text(report: Report) -> str:
    r = report
    job = f"job {r.job.job}" + (f" in namespace {r.job.namespace}" if r.job.namespace else "")
    lines = [f"fabricscope explain: {job}, {_t(r.start)} .. {_t(r.end)} (step {r.step}s)"]
    tp = r.throughput
    if tp.series is not None and r.shift is not None:
        s = r.shift
        lines.append(
            f"throughput ({tp.unit}, mean over the job's series): {_num(s.before)} -> "
            f"{_num(s.after)} ({-100 * s.drop_ratio:+.1f}%) from {_hm(s.at)} "
            f"(median shift of {s.score:.0f} robust sigmas)"
        )
    elif r.change_given:
        lines.append(f"comparing before and after the given change at {_hm(r.periods.slow_start)}")
    else:
        lines.append(
            f"throughput ({tp.unit}): no significant drop in the window; comparing its halves"
        )
    p = r.periods
    fp = r.footprint
    lines.append(
        f"baseline {_hm(p.base_start)}-{_hm(p.base_end)}, slow {_hm(p.slow_start)}-"
        f"{_hm(p.slow_end)}; {len(fp.instances)} nodes, {len(fp.gpus)} GPUs, "
        f"{r.ports} RDMA ports, {len(fp.pods)} pods"
    )
    lines.append("")
    causes = r.causes
    if not causes:
        lines.append("no fabric cause found.")
        lines.append(
            f"checked (score >= {r.threshold:g} would stand out; the highest each reached):"
        )
        for c in r.checked:
            data = f"{c.devices} devices" if c.devices else "no data"
            nob = f"; {c.no_baseline} without baseline" if c.no_baseline else ""
            lines.append(f"  {c.cause:<16} {c.what} [{data}; max {c.worst:.2f}{nob}]")
    else:
        lines.append(f" #  score  cause / device / evidence (score >= {r.threshold:g} stands out)")
        shown: dict[str, int] = {}
        folded: dict[str, list[Finding]] = {}
        for i, f in enumerate(causes, 1):
            if sum(shown.values()) >= TOP or shown.get(f.cause, 0) >= PER_CAUSE:
                folded.setdefault(f.cause, []).append(f)
                continue
            shown[f.cause] = shown.get(f.cause, 0) + 1
            lines.append(f"{i:>2}  {f.score:5.2f}  {f.title}: {f.device}")
            for ev in f.evidence[:4]:
                for j, part in enumerate(wrap(ev, 88)):
                    lines.append(("             " if j else "           - ") + part)
            lines.append(f"           promql: {f.promql}")
            if f.link:
                lines.append(f"           panel:  {f.link}")
        for cause, rest in folded.items():
            nodes = sorted({f.instance for f in rest if f.instance})
            lines.append(
                f"    ... and {len(rest)} more {CAUSES[cause].title} (scores "
                f"{rest[-1].score:.2f}-{rest[0].score:.2f}) on {', '.join(nodes[:6])}"
                + (", ..." if len(nodes) > 6 else "")
                + " (--format json lists them)"
            )
        below = len(r.findings) - len(causes)
        nodata = [c.what for c in r.checked if not c.devices]
        nobase = [f"{c.what} ({c.no_baseline})" for c in r.checked if c.no_baseline]
        lines.append("")
        lines.append(
            f"{len(r.checked)} checks over {len(fp.instances)} nodes; {below} candidates "
            f"changed but stayed below {r.threshold:g}"
            + (f"; no data for: {', '.join(nodata)}" if nodata else "")
            + (f"; no baseline (not scored) for: {', '.join(nobase)}" if nobase else "")
        )
    lines.append(f"answered in {r.elapsed:.2f}s")
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> str:
    r = report
    out: dict[str, Any] = {
        "job": {"job_name": r.job.job, "namespace": r.job.namespace, "nodes": list(r.job.nodes)},
        "window": {"start": r.start, "end": r.end, "step_seconds": r.step},
        "throughput": {
            "metric": r.throughput.metric,
            "unit": r.throughput.unit,
            "promql": r.throughput.expr,
            "drop": None
            if r.shift is None
            else {
                "at": r.shift.at,
                "before": r.shift.before,
                "after": r.shift.after,
                "drop_ratio": round(r.shift.drop_ratio, 4),
                "median_shift_sigmas": round(r.shift.score, 1),
            },
            "change_given": r.change_given,
        },
        "periods": {
            "baseline": [r.periods.base_start, r.periods.base_end],
            "slow": [r.periods.slow_start, r.periods.slow_end],
        },
        "footprint": {
            "instances": list(r.footprint.instances),
            "pods": list(r.footprint.pods),
            "gpus": [list(g) for g in r.footprint.gpus],
            "hcas": [list(h) for h in r.footprint.hcas],
            "rdma_ports": r.ports,
        },
        "threshold": r.threshold,
        "warnings": [r.warning] if r.warning else [],
        "verdict": "causes found" if r.causes else "no fabric cause found",
        "findings": [
            {
                "rank": i,
                "cause": f.cause,
                "title": f.title,
                "device": f.device,
                "instance": f.instance,
                "score": f.score,
                "stands_out": f.score >= r.threshold,
                "evidence": list(f.evidence),
                "promql": f.promql,
                "dashboard": CAUSES[f.cause].dashboard,
                "link": f.link,
            }
            for i, f in enumerate(r.findings, 1)
        ],
        "checked": [
            {
                "check": c.check,
                "cause": c.cause,
                "what": c.what,
                "devices": c.devices,
                "max_score": round(c.worst, 3),
                "no_baseline": c.no_baseline,
            }
            for c in r.checked
        ],
        "elapsed_seconds": round(r.elapsed, 3),
    }
    return json.dumps(out, indent=2) + "\n"
