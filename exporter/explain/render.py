"""The report as a table for people and as JSON for tools."""

from __future__ import annotations

import json
import re
import time
from textwrap import wrap
from typing import Any

from exporter.explain.checks import CAUSES
from exporter.explain.evidence import Measurement, Query, _fmt, queries
from exporter.explain.rank import Finding
from exporter.explain.report import Checked, Report

TOP = 10  # findings printed in full
PER_CAUSE = 3  # of one cause; the rest of that cause fold into one line
EVIDENCE = 8  # evidence lines of one finding printed (the rest are counted)


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
    if r.data_note:
        lines.append(f"note: {r.data_note}; the window is that part")
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
            f"throughput ({tp.unit}): no significant drop in the "
            + ("job's data" if r.data_note else "window")
            + "; comparing its halves"
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
    judged = (
        f"{r.judged_checks} of {len(r.checked)} checks compared data of both periods, on "
        f"{r.judged_nodes} of {len(fp.instances)} nodes"
    )
    if not causes:
        if r.verdict == "could not judge":
            lines.append(f"could not judge: {r.reason}.")
        else:
            lines.append(f"no fabric cause found: {judged}; none reached {r.threshold:g}.")
        lines.append(
            f"checked (score >= {r.threshold:g} would stand out; the highest each reached):"
        )
        for c in r.checked:
            lines.append(f"  {c.cause:<16} {c.what} [{_checked(c)}]")
        lines += _unavailable(r)
    else:
        lines += _table(r, causes)
        lines += _unavailable(r)
        below = len(r.findings) - len(causes)
        nodata = [c.what for c in r.checked if not c.devices]
        nobase = [f"{c.what} ({c.no_baseline})" for c in r.checked if c.no_baseline]
        thin = [f"{c.what} ({c.thin})" for c in r.checked if c.thin]
        lines.append("")
        lines.append(
            f"{judged}; {below} candidates changed but stayed below {r.threshold:g}"
            + (f"; no data for: {', '.join(nodata)}" if nodata else "")
            + (f"; no baseline (not scored) for: {', '.join(nobase)}" if nobase else "")
            + (
                f"; too little of a period covered (not scored) for: {', '.join(thin)}"
                if thin
                else ""
            )
        )
    lines.append(f"answered in {r.elapsed:.2f}s")
    return "\n".join(lines) + "\n"


def _checked(c: Checked) -> str:
    if not c.devices:
        return "no data"
    parts = [f"{c.devices} devices", f"max {c.worst:.2f}"]
    if c.no_baseline:
        parts.append(f"{c.no_baseline} without baseline")
    if c.thin:
        parts.append(f"{c.thin} covering too little of a period")
    if c.unavailable:
        parts.append(f"{c.unavailable} with evidence unavailable")
    return "; ".join(parts)


def _table(r: Report, causes: list[Finding]) -> list[str]:
    lines = [f" #  score  cause / device / evidence (score >= {r.threshold:g} stands out)"]
    shown: dict[str, int] = {}
    folded: dict[str, list[Finding]] = {}
    for i, f in enumerate(causes, 1):
        if sum(shown.values()) >= TOP or shown.get(f.cause, 0) >= PER_CAUSE:
            folded.setdefault(f.cause, []).append(f)
            continue
        shown[f.cause] = shown.get(f.cause, 0) + 1
        lines.append(f"{i:>2}  {f.score:5.2f}  {f.title}: {f.device}")
        for ev in f.evidence[:EVIDENCE]:
            for j, part in enumerate(wrap(ev, 88)):
                lines.append(("             " if j else "           - ") + part)
        if len(f.evidence) > EVIDENCE:
            lines.append(
                f"           - ... and {len(f.evidence) - EVIDENCE} more evidence lines "
                "(--format json lists them)"
            )
        lines += _promql(f)
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
    return lines


def _promql(f: Finding) -> list[str]:
    """Each printed measurement's PromQL, with the times it returns the printed figures (a
    finding without measurements: its own query, at its time)."""
    if not f.measurements:
        at = [f"                   at {_t(f.promql_at)}"] if f.promql_at else []
        return [f"           promql: {f.promql}", *at]
    out: list[str] = []
    for m in f.measurements[:EVIDENCE]:
        out += _measurement_promql(m)
    return out


def _measurement_promql(m: Measurement) -> list[str]:
    """``m``'s slow figure's PromQL and time, and its baseline's (the same query over
    another range and time, or its own query when that differs)."""
    base, slow = queries(m)
    if slow is None:
        return []
    unit = m.check.unit
    row = f" in its row ({m.check.device_selector(m.labels)})" if m.job_selector else ""
    out = [
        f"           promql: {slow.promql}",
        f"                   returns {_fig(m.slow)}{unit}{row} at {_t(slow.at)}",
    ]
    if base is not None:
        same = base.promql.replace(_range(base.promql), "") == slow.promql.replace(
            _range(slow.promql), ""
        )
        if same:
            out[-1] += (
                f"; over [{_range(base.promql)}] at {_t(base.at)}, the baseline: "
                f"{_fig(m.baseline)}{unit}"
            )
        else:
            out.append(f"           baseline: {base.promql}")
            out.append(f"                   returns {_fig(m.baseline)}{unit}{row} at {_t(base.at)}")
    return out


def _range(expr: str) -> str:
    """The first range of ``expr`` (the figure's window), e.g. ``1620s``."""
    found = re.search(r"\[(\d+s)\]", expr)
    return found.group(1) if found else ""


def _fig(value: float | None) -> str:
    return _fmt(value)


def _unavailable(r: Report) -> list[str]:
    if not r.unavailable:
        return []
    lines = ["", "evidence unavailable on devices without a finding:"]
    for u in r.unavailable:
        for j, part in enumerate(wrap(u.text, 96)):
            lines.append(("    " if j else "  - ") + part)
    return lines


def _query(q: Query | None) -> dict[str, Any] | None:
    return None if q is None else {"promql": q.promql, "at": q.at}


def _measurement(m: Measurement) -> dict[str, Any]:
    base, slow = queries(m)
    return {
        "check": m.check.name,
        "cause": m.check.cause,
        "text": m.text,
        "baseline": m.baseline,
        "slow": m.slow,
        "unit": m.check.unit.strip(),
        "score": round(m.score, 3),
        "noise": m.noise,
        "job_baseline": m.job_baseline,
        "unavailable": m.unavailable or None,
        "not_scored": m.thin or None,
        "baseline_query": _query(base),
        "slow_query": _query(slow),
    }


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
        "data_note": r.data_note or None,
        "footprint": {
            "instances": list(r.footprint.instances),
            "pods": list(r.footprint.pods),
            "gpus": [list(g) for g in r.footprint.gpus],
            "hcas": [list(h) for h in r.footprint.hcas],
            "rdma_ports": r.ports,
        },
        "threshold": r.threshold,
        "warnings": [r.warning] if r.warning else [],
        "verdict": r.verdict,
        "reason": r.reason or None,
        "exit_code": r.exit_code,
        "judged": {
            "checks": r.judged_checks,
            "of_checks": len(r.checked),
            "nodes": r.judged_nodes,
            "of_nodes": len(r.footprint.instances),
        },
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
                "promql_at": f.promql_at,
                "dashboard": CAUSES[f.cause].dashboard,
                "link": f.link,
                "measurements": [_measurement(m) for m in f.measurements],
            }
            for i, f in enumerate(r.findings, 1)
        ],
        "unavailable": [
            {
                "device": u.device,
                "instance": u.instance,
                "text": u.text,
                **_measurement(u.measurement),
            }
            for u in r.unavailable
        ],
        "checked": [
            {
                "check": c.check,
                "cause": c.cause,
                "what": c.what,
                "devices": c.devices,
                "max_score": round(c.worst, 3),
                "no_baseline": c.no_baseline,
                "judged": c.judged,
                "unavailable": c.unavailable,
                "not_scored": c.thin,
            }
            for c in r.checked
        ],
        "elapsed_seconds": round(r.elapsed, 3),
    }
    return json.dumps(out, indent=2) + "\n"
