"""``explain()``: from a job and a window to ranked findings.

1. the job's throughput over the window (range query at a step chosen from the window);
2. the drop: ``changepoint.find_drop`` or the ``change_at`` the user gave; the baseline is
   the window before it (less one step of guard), the slow period from it to the end;
3. the job's footprint (pods, nodes, GPUs, HCAs) from the attribution series;
4. every check over both periods, scoped to that footprint; NCCL settings across pods; the
   leaf switches under the job's ports and their uplinks (``switches``);
5. the switches several of the job's nodes' evidence crowds onto, named as one finding each
   (``switches.group``);
6. findings ranked by score; those at or above ``checks.THRESHOLD`` stand out.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from exporter.explain import changepoint, discover, evidence, rank, switches
from exporter.explain.checks import CHECKS, THRESHOLD
from exporter.explain.client import PrometheusClient
from exporter.explain.plan import MAX_NAMES_PER_QUERY

#: steps a window is cut into at most; a step is never below the usual 15 s scrape interval
NICE_STEPS = (15, 30, 60, 120, 300, 600, 900, 1800, 3600)
MAX_POINTS = 720


class ExplainError(Exception):
    """Explain cannot answer (window too short, job not found); one line."""


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

    @property
    def causes(self) -> list[rank.Finding]:
        return rank.standing_out(self.findings)


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
    shift = None
    if change_at is None and tp.series is not None:
        shift = changepoint.find_drop(tp.series.times, tp.series.values)
    if change_at is not None:
        split = change_at
    elif shift is not None:
        split = shift.at
    else:  # no drop: compare the window's halves, so "nothing changed" is checked, not assumed
        split = start + (end - start) / 2
    if not start + 2 * step <= split <= end - 2 * step:
        raise ExplainError(
            f"the change at {_iso(split)} leaves less than two steps ({step}s each) of "
            f"baseline or slow period in {_iso(start)} .. {_iso(end)}"
        )
    periods = evidence.Periods(start, split - step, split, end)
    fp = discover.footprint(client, job, tp, start, end)
    scope = evidence.Scope(fp.instances, job.namespace, fp.pods, max_names)
    with ThreadPoolExecutor(max_workers=3) as pool:
        inv_future = pool.submit(
            discover.inventory, client, fp.instances, start, end, max_names=max_names
        )
        env_future = pool.submit(evidence.query_nccl_env, client, scope, periods)
        topo_future = pool.submit(
            switches.topology, client, fp.instances, start, end, max_names=max_names
        )
        results = evidence.evaluate(client, scope, periods)
        topo = topo_future.result()
        uplink_results = switches.evaluate_uplinks(client, topo, periods, max_names=max_names)
        inv = replace(inv_future.result(), cables=topo.cable_names())
        env_sel, env_samples = env_future.result()
    diffs = evidence.nccl_env_differences(env_samples)
    grouping = switches.group(
        results,
        uplink_results,
        topo,
        periods=periods,
        step=step,
        link=rank.panel_link(grafana, "switch", "", periods, job),
    )
    findings = rank.merged(
        rank.rank(
            switches.without(results, grouping.folded),
            diffs,
            env_sel,
            inv,
            periods=periods,
            step=step,
            grafana=grafana,
            job=job,
        ),
        grouping.findings,
    )
    checked = (
        *(
            Checked(
                r.check.name,
                r.check.cause,
                r.check.what,
                r.series,
                max((m.score for m in r.measurements), default=0.0),
                r.no_baseline,
            )
            for r in (*results, *uplink_results)
        ),
        Checked(
            "nccl_env",
            "nccl_config",
            "NCCL environment variables identical on every pod",
            len({s.labels.get("pod") for s in env_samples}),
            evidence.NCCL_ENV_DIFF_SCORE if diffs else 0.0,
        ),
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
        warning=discover.unknown_warning(job, tp, inv),
    )


def _iso(t: float) -> str:
    if not math.isfinite(t):
        return str(t)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


__all__ = ["CHECKS", "ExplainError", "Report", "choose_step", "explain"]
