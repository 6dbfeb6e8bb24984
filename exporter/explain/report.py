"""``explain()``: from a job and a window to ranked findings.

1. the job's throughput over the window (range query at a step chosen from the window); where
   it covers only part of the window, the part it covers is the window (and the report
   says so);
2. the drop: ``changepoint.find_drop`` or the ``change_at`` the user gave; the baseline is
   the window before it (less one step of guard), the slow period from it to the end;
3. the job's footprint (pods, nodes, GPUs, HCAs) from the attribution series;
4. every check over both periods, scoped to that footprint; NCCL settings across pods; the
   leaf switches under the job's ports and their uplinks (``switches``); evidence that went
   blind (:mod:`blind`); the changes near the threshold held to their coverage and noise
   (:mod:`judge`);
5. the switches several of the job's nodes' evidence crowds onto, named as one finding each
   (``switches.group``);
6. findings ranked by score; those at or above ``checks.THRESHOLD`` stand out;
7. the verdict: causes found, no fabric cause found (only when enough checks judged data
   of enough of the job's nodes, and no class of checks was left out for lack of scope:
   ``discover.scope_gaps``), or could not judge (:data:`MIN_JUDGED_CHECKS`, or the gap).
   Without ``--namespace`` the namespace is the one the job's throughput series carry.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Literal

from exporter.explain import blind, changepoint, discover, evidence, judge, rank, switches
from exporter.explain.checks import CHECKS, THRESHOLD
from exporter.explain.client import PrometheusClient
from exporter.explain.plan import MAX_NAMES_PER_QUERY, without_cycle_collector

#: steps a window is cut into at most; a step is never below the usual 15 s scrape interval
NICE_STEPS = (15, 30, 60, 120, 300, 600, 900, 1800, 3600)
MAX_POINTS = 720


#: "no fabric cause found" needs at least this many checks that compared data of both
#: periods (fewer: "could not judge")
MIN_JUDGED_CHECKS = 5
#: ... on at least this share of the job's nodes
MIN_JUDGED_NODES = 0.5
#: below this share of the window covered by the job's data, the report says so
WINDOW_NOTE = 0.9

Verdict = Literal["causes found", "no fabric cause found", "could not judge"]
#: the exit code of each verdict (errors before any verdict: 2)
EXIT_CODES: dict[str, int] = {"causes found": 0, "no fabric cause found": 0, "could not judge": 1}


class ExplainError(Exception):
    """Explain cannot answer (window too short, job not found); one line; exit 2."""

    exit_code = 2


class CannotJudgeError(ExplainError):
    """The data does not hold enough to compare (no baseline before the given change, too
    little of the job's data in the window); one line; exit 1, as "could not judge"."""

    exit_code = 1


def choose_step(seconds: float) -> int:
    for step in NICE_STEPS:
        if seconds / step <= MAX_POINTS:
            return step
    return NICE_STEPS[-1]


@dataclass(frozen=True, slots=True)
class Checked:
    check: str
    cause: str
    what: str
    devices: int  # devices with data for it
    worst: float  # highest score among them
    no_baseline: int = 0  # devices with a slow-period value and no baseline (not scored)
    judged: int = 0  # devices whose data of both periods (or the slow one, level) it scored
    unavailable: int = 0  # devices whose evidence went blind (saturated or reset counter)
    thin: int = 0  # devices whose series cover too little of a period to score


@dataclass(frozen=True, slots=True)
class Report:
    job: discover.JobSpec
    start: float
    end: float
    step: int
    throughput: discover.Throughput
    shift: changepoint.Shift | None
    change_given: bool
    periods: evidence.Periods
    footprint: discover.Footprint
    ports: int
    findings: tuple[rank.Finding, ...]
    checked: tuple[Checked, ...]
    elapsed: float
    threshold: float = THRESHOLD
    #: one line naming --nodes and pods without fabricscope series ("" when none)
    warning: str = ""
    #: blind evidence of devices without a finding to carry it
    unavailable: tuple[rank.Unavailable, ...] = ()
    #: how much of the window the job's data covers, when not (nearly) all of it
    data_note: str = ""
    judged_nodes: int = 0
    verdict: Verdict = "no fabric cause found"
    #: why "could not judge" ("" otherwise)
    reason: str = ""

    @property
    def causes(self) -> list[rank.Finding]:
        return rank.standing_out(self.findings)

    @property
    def judged_checks(self) -> int:
        return sum(1 for c in self.checked if c.judged)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]


@without_cycle_collector
def explain(
    client: PrometheusClient,
    job: discover.JobSpec,
    start: float,
    end: float,
    *,
    change_at: float | None = None,
    grafana: str = "",
    max_names: int = MAX_NAMES_PER_QUERY,
) -> Report:
    """``max_names``: instances (or pods) one query names at most (exporter.explain.plan)."""
    t0 = time.monotonic()
    if end - start < 120:
        raise ExplainError("the window must be at least 2 minutes long")
    step = choose_step(end - start)
    tp = discover.throughput(client, job, start, end, step)
    if tp.series is None and change_at is None:
        where = f" in namespace {job.namespace!r}" if job.namespace else ""
        names = ", ".join(m for m, _ in discover.THROUGHPUT_METRICS)
        raise ExplainError(
            f"no throughput series for job_name={job.job!r}{where} between "
            f"{_iso(start)} and {_iso(end)} (looked for {names}); "
            "give --change-at to compare before and after a time instead"
        )
    job = discover.with_namespace(job, tp)
    lo, hi, note = _data_window(tp, start, end, step)
    shift = None
    if change_at is None and tp.series is not None:
        shift = changepoint.find_drop(tp.series.times, tp.series.values)
    if change_at is not None:
        split = change_at
    elif shift is not None:
        split = shift.at
    else:  # no drop: compare the window's halves, so "nothing changed" is checked, not assumed
        split = lo + (hi - lo) / 2
    if not lo + 2 * step <= split <= hi - 2 * step:
        where = "the job's data" if note else "the window"
        error = CannotJudgeError if note or change_at is None else ExplainError
        raise error(
            f"the change at {_iso(split)} leaves less than two steps ({step}s each) of "
            f"baseline or slow period in {where}, {_iso(lo)} .. {_iso(hi)}"
            + (f" ({note})" if note else "")
        )
    periods = evidence.Periods(lo, split - step, split, hi)
    fp = discover.footprint(client, job, tp, start, end)
    gaps = discover.scope_gaps(job, tp, fp)
    scope = evidence.Scope(fp.instances, job.namespace, fp.pods, max_names, job.job)
    with ThreadPoolExecutor(max_workers=4) as pool:
        inv_future = pool.submit(
            discover.inventory, client, fp.instances, start, end, max_names=max_names
        )
        env_future = pool.submit(evidence.query_nccl_env, client, scope, periods)
        blind_future = pool.submit(blind.find, client, scope, periods, step)
        topo_future = pool.submit(
            switches.topology, client, fp.instances, start, end, max_names=max_names
        )
        results = evidence.evaluate(client, scope, periods)
        topo = topo_future.result()
        uplink_results = switches.evaluate_uplinks(client, topo, periods, max_names=max_names)
        inv = replace(inv_future.result(), cables=topo.cable_names())
        env_sel, env_samples = env_future.result()
        blinds = blind_future.result()
    results = blind.apply(results, blinds)
    results = judge.judge(client, scope, periods, results)
    uplink_results = judge.counting_only(uplink_results)
    diffs = evidence.nccl_env_differences(env_samples)
    grouping = switches.group(
        results,
        uplink_results,
        topo,
        periods=periods,
        step=step,
        link=rank.panel_link(grafana, "switch", "", periods, job),
    )
    ranked, unavailable = rank.rank(
        switches.without(results, grouping.folded),
        diffs,
        env_sel,
        inv,
        periods=periods,
        step=step,
        grafana=grafana,
        job=job,
    )
    findings = rank.merged(ranked, grouping.findings)
    every = (*results, *uplink_results)
    counts = [r.counts() for r in every]
    checked = (
        *(
            Checked(
                r.check.name,
                r.check.cause,
                r.check.what,
                r.series,
                r.worst(),
                n.no_baseline,
                n.judged,
                n.unavailable,
                n.thin,
            )
            for r, n in zip(every, counts, strict=True)
        ),
        Checked(
            "nccl_env",
            "nccl_config",
            "NCCL environment variables identical on every pod",
            len({s.labels.get("pod") for s in env_samples}),
            evidence.NCCL_ENV_DIFF_SCORE if diffs else 0.0,
            judged=len({s.labels.get("pod") for s in env_samples}),
        ),
    )
    judged: set[str] = set()
    for n in counts:
        judged |= n.instances
    nodes = judged & set(fp.instances)
    verdict, reason = _verdict(findings, checked, len(nodes), len(fp.instances), note, gaps=gaps)
    warning = "; ".join(
        w for w in (discover.unknown_warning(job, tp, inv), *gaps) if w and w != reason
    )
    return Report(
        job,
        start,
        end,
        step,
        tp,
        shift,
        change_at is not None,
        periods,
        fp,
        inv.port_count,
        tuple(findings),
        checked,
        time.monotonic() - t0,
        warning=warning,
        unavailable=tuple(unavailable),
        data_note=note,
        judged_nodes=len(nodes),
        verdict=verdict,
        reason=reason,
    )


def _data_window(
    tp: discover.Throughput, start: float, end: float, step: int
) -> tuple[float, float, str]:
    """The part of [start, end] the job's throughput covers (its first and last points),
    and a note when that is less than :data:`WINDOW_NOTE` of the window ("" otherwise;
    the window as given when there is no throughput series)."""
    if tp.series is None:
        return start, end, ""
    times = [t for t, v in zip(tp.series.times, tp.series.values, strict=True) if math.isfinite(v)]
    if not times:
        return start, end, ""
    lo, hi = max(start, times[0]), min(end, times[-1])
    if hi - lo >= WINDOW_NOTE * (end - start):
        return start, end, ""
    note = (
        f"the job's data covers only {_duration(hi - lo + step)} of the "
        f"{_duration(end - start)} window, {_hms(lo)}-{_hms(hi)}"
    )
    return lo, hi, note


def _verdict(
    findings: list[rank.Finding],
    checked: tuple[Checked, ...],
    judged_nodes: int,
    nodes: int,
    note: str,
    *,
    gaps: tuple[str, ...] = (),
) -> tuple[Verdict, str]:
    """Causes found; else no fabric cause found only when enough was judged and no class of
    checks was left out for lack of scope (``gaps``: then could not judge, saying which)."""
    if rank.standing_out(findings):
        return "causes found", ""
    if gaps:
        return "could not judge", "; ".join(gaps)
    judged = sum(1 for c in checked if c.judged)
    if judged >= MIN_JUDGED_CHECKS and judged_nodes >= MIN_JUDGED_NODES * nodes:
        return "no fabric cause found", ""
    reason = (
        f"only {judged} of {len(checked)} checks compared data of the baseline and the slow "
        f"period, on {judged_nodes} of {nodes} nodes (a verdict needs "
        f"{MIN_JUDGED_CHECKS} checks on at least half the job's nodes)"
    )
    return "could not judge", reason + (f"; {note}" if note else "")


def _duration(seconds: float) -> str:
    s = max(0, round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h" + (f"{m:02d}m" if m else "")
    if m:
        return f"{m}m" + (f"{sec:02d}s" if sec else "")
    return f"{sec}s"


def _hms(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def _iso(t: float) -> str:
    if not math.isfinite(t):
        return str(t)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


__all__ = [
    "CHECKS",
    "EXIT_CODES",
    "CannotJudgeError",
    "ExplainError",
    "Report",
    "choose_step",
    "explain",
]
