"""Hold every change that comes near the threshold to its series' coverage and noise.

:func:`exporter.explain.evidence.evaluate` scores every device of every check on two instant
queries, against the check's significance level alone. The noise model can only raise the
bar (:func:`exporter.explain.noise.bar`), so a change scoring below :data:`FLOOR` there
cannot stand out and is left as it is. Each change at or above it is looked at again here,
whatever its check (the framework does it, not the check):

1. **Tiles.** The check's own expression over tiles of the baseline and of the slow period
   (:func:`exporter.explain.noise.tile_seconds`, from the scrape interval the series show),
   two range queries per check and group of the candidates' nodes (or pods).
2. **Coverage.** A period whose series has a value in fewer than
   :data:`exporter.explain.noise.MIN_COVERAGE` of its tiles is not scored ("baseline covers
   17 % of its period (its series from T)"); one whose series begins (or ends) inside it is
   measured again over the part it covers, so a baseline is never diluted by time when its
   series did not exist. The figure's window then says which part: the printed PromQL over
   that range at that time returns the figure.
3. **Noise.** The baseline's tiles give the spread; event counters add Poisson counting
   noise; the change is scored against ``max(significant, Z * noise)``.
4. **Resets.** A PMA counter the check reads that was reset inside the window makes the
   evidence unavailable (:mod:`exporter.explain.blind`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from exporter.explain import noise
from exporter.explain.blind import counter_files, hms, pma_counters
from exporter.explain.checks import Check
from exporter.explain.client import PrometheusClient, Series
from exporter.explain.evidence import (
    CheckResult,
    Measurement,
    Periods,
    Scope,
    Window,
    key,
    period_seconds,
    score,
)

#: changes scoring below this against their significance level alone are not looked at
#: again (the noise only raises the bar; below 1 a change does not stand out anyway, and
#: the ones between FLOOR and 1 are judged too, so near misses are reported honestly)
FLOOR = 0.5
#: when the series show no scrape interval (none in the last minutes), tiles assume this
FALLBACK_INTERVAL = 60.0


@dataclass(frozen=True, slots=True)
class Tiling:
    """The tiles of both periods: length and ends (unix seconds) of each."""

    base_seconds: float
    base_ends: tuple[float, ...]
    slow_seconds: float
    slow_ends: tuple[float, ...]

    @staticmethod
    def of(periods: Periods, interval: float) -> Tiling:
        wb = noise.tile_seconds(periods.base_end - periods.base_start, interval)
        ws = noise.tile_seconds(periods.slow_end - periods.slow_start, interval)
        return Tiling(
            wb,
            _ends(periods.base_start, periods.base_end, wb),
            ws,
            _ends(periods.slow_start, periods.slow_end, ws),
        )


def _ends(start: float, end: float, w: float) -> tuple[float, ...]:
    n = int((end - start) // w)
    return tuple(round(start + (k + 1) * w, 3) for k in range(n))


def scrape_interval(client: PrometheusClient, check: Check, sel: str, periods: Periods) -> float:
    """The shortest interval between samples of ``check``'s first metric over the last
    minutes of the slow period (its busiest series: one that began late counts fewer)."""
    seconds = int(min(600.0, max(60.0, periods.slow_end - periods.slow_start)))
    metric = check.metrics[0] if check.metrics else ""
    if not metric:
        return FALLBACK_INTERVAL
    expr = f"max(count_over_time({metric}{{{sel}}}[{seconds}s]))"
    answer = client.query(expr, periods.slow_end)
    count = answer[0].value if answer else 0.0
    if not math.isfinite(count) or count < 2:
        return FALLBACK_INTERVAL
    return seconds / count


def judge(
    client: PrometheusClient,
    scope: Scope,
    periods: Periods,
    results: Sequence[CheckResult],
    *,
    floor: float = FLOOR,
    workers: int = 8,
    interval: float | None = None,
) -> list[CheckResult]:
    """``results`` with every change at or above ``floor`` held to coverage and noise."""
    todo = {}
    for r in results:
        ms = [m for m in r.measurements if m.score >= floor and _candidate(m, floor)]
        if ms:
            todo[r.check.name] = ms
    if not todo:
        return list(results)
    checks = {r.check.name: r.check for r in results}
    scopes = {name: _scope_of(checks[name], ms, scope) for name, ms in todo.items()}
    if interval is None:
        first = next(iter(todo))
        interval = scrape_interval(
            client, checks[first], scopes[first].selectors(checks[first])[0], periods
        )
    tiling = Tiling.of(periods, interval)

    def tiles(name: str) -> tuple[str, dict[tuple[str, ...], list[Series]]]:
        check = checks[name]
        found: dict[tuple[str, ...], list[Series]] = defaultdict(list)
        for sel in scopes[name].selectors(check):
            for which, w, ends in (
                (0, tiling.base_seconds, tiling.base_ends),
                (1, tiling.slow_seconds, tiling.slow_ends),
            ):
                if not ends:
                    continue
                for s in client.query_range(check.expr(sel, f"{w:g}s"), ends[0], ends[-1], w):
                    found[(*key(check, s.labels), str(which))].append(s)
        return name, found

    def resets(name: str) -> tuple[str, dict[tuple[str, ...], str]]:
        check = checks[name]
        return name, _resets(client, check, scopes[name], periods, tiling)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        tiled = dict(pool.map(tiles, todo))
        reset = dict(pool.map(resets, [n for n in todo if pma_counters(checks[n])]))
    judged: dict[str, dict[tuple[str, ...], Measurement]] = {}
    base_tiles: dict[tuple[str, tuple[str, ...]], noise.Tiles] = {}
    again: dict[tuple[str, int, Window], list[Measurement]] = defaultdict(list)
    for name, ms in todo.items():
        check = checks[name]
        now = judged.setdefault(name, {})
        for m in ms:
            k = key(check, m.labels)
            why = reset.get(name, {}).get(k)
            if why:
                now[k] = replace(m, score=0.0, naive_score=0.0, unavailable=why)
                continue
            bt = _tiles(tiled[name].get((*k, "0"), []), tiling.base_seconds, tiling.base_ends)
            st = _tiles(tiled[name].get((*k, "1"), []), tiling.slow_seconds, tiling.slow_ends)
            base_tiles[(name, k)] = bt
            new = _covered(m, bt, st, periods)
            for which, window, old in (
                (0, new.base_window, m.base_window),
                (1, new.slow_window, m.slow_window),
            ):
                if window is not None and window != old and not new.thin:
                    again[(name, which, window)].append(new)
            now[k] = _noise(new, bt)
    if again:  # figures over the part of a period their series covers
        figures = _requery(client, checks, scopes, again, workers)
        for (name, which, window), ms in again.items():
            check = checks[name]
            for m in ms:
                k = key(check, m.labels)
                value = figures[(name, which, window)].get(k)
                cur = judged[name][k]
                shown = None if value is None else check.display(value)
                cur = replace(cur, baseline=shown) if which == 0 else replace(cur, slow=shown)
                if shown is None:
                    cur = replace(cur, score=0.0, naive_score=0.0)
                judged[name][k] = _noise(cur, base_tiles[(name, k)])
    out = []
    for r in results:
        done = judged.get(r.check.name)
        if not done:
            out.append(r)
            continue
        ms = [
            done.get(key(r.check, m.labels), m) if _candidate(m, floor) else m
            for m in r.measurements
        ]
        out.append(_rejudged(r, ms))
    return out


def counting_only(results: Sequence[CheckResult], floor: float = FLOOR) -> list[CheckResult]:
    """``results`` with every change at or above ``floor`` of an event-counting check held
    to its counting noise alone (Poisson, :func:`exporter.explain.noise.poisson_rate_sigma`),
    without tiles: for evidence keyed by switch port (the uplinks), which :func:`judge`'s
    node-scoped tiles cannot select. A steady trickle then no longer reads as a change."""
    none = noise.Tiles(1.0, ())
    out = []
    for r in results:
        ms = [
            _noise(m, none) if _candidate(m, floor) and m.check.counting else m
            for m in r.measurements
        ]
        out.append(_rejudged(r, ms))
    return out


def _rejudged(result: CheckResult, measurements: list[Measurement]) -> CheckResult:
    """``result`` with ``measurements`` (judged again), worst first (stable: equal scores
    keep their order)."""
    measurements.sort(key=lambda m: -m.score)
    return CheckResult(result.check, result.series, measurements)


def _candidate(m: Measurement, floor: float) -> bool:
    return (
        m.score >= floor
        and m.check.mode != "level"
        and not m.job_baseline
        and not m.unavailable
        and m.baseline is not None
    )


def _scope_of(check: Check, ms: Sequence[Measurement], scope: Scope) -> Scope:
    """The job's scope narrowed to the nodes (or pods) of ``ms``."""
    instances = tuple(sorted({m.labels.get("instance", "") for m in ms} - {""}))
    pods = tuple(sorted({m.labels.get("pod", "") for m in ms} - {""}))
    if check.scope == "pod":
        return replace(scope, pods=pods)
    return replace(scope, instances=instances)


def _tiles(series: Sequence[Series], seconds: float, ends: Sequence[float]) -> noise.Tiles:
    values: dict[float, float] = {}
    for s in series:
        for t, v in zip(s.times, s.values, strict=True):
            if math.isfinite(v):
                values[round(t, 3)] = v
    return noise.Tiles(seconds, tuple((t, values.get(t)) for t in ends))


def _covered(m: Measurement, bt: noise.Tiles, st: noise.Tiles, periods: Periods) -> Measurement:
    """``m`` with its periods cut to the part its series covers, or "thin" when that part
    is under ``MIN_COVERAGE`` of a period."""
    for name, tiles in (("baseline", bt), ("slow period", st)):
        if tiles.coverage < noise.MIN_COVERAGE:
            span = tiles.span
            since = f" (its series from {hms(span[0])})" if span and name == "baseline" else ""
            thin = f"{name} covers {100 * tiles.coverage:.0f}% of its period{since}"
            return replace(m, score=0.0, naive_score=0.0, thin=thin)
    base = _window(bt, m.base_window, periods.base_start)
    slow = _window(st, m.slow_window, periods.slow_start)
    return replace(m, base_window=base, slow_window=slow)


def _window(tiles: noise.Tiles, whole: Window | None, start: float) -> Window | None:
    """The period's window, or the part of it from the first tile with a value to the
    last when the series began or ended inside it."""
    span = tiles.span
    if whole is None or span is None or not tiles.values:
        return whole
    first_end, last_end = tiles.values[0][0], tiles.values[-1][0]
    begins = span[0] > first_end - tiles.seconds + 0.5
    ends = span[1] < last_end - 0.5
    if not begins and not ends:
        return whole
    lo = span[0] if begins else whole.at - whole.seconds
    hi = span[1] if ends else whole.at
    return Window(hi - lo, hi)


def _noise(m: Measurement, bt: noise.Tiles) -> Measurement:
    """``m`` scored against its baseline's tile spread (and counting noise)."""
    if m.thin or m.unavailable or m.baseline is None or m.slow is None:
        return m
    check = m.check
    base, slow = _raw(check, m.baseline), _raw(check, m.slow)
    bw = m.base_window.seconds if m.base_window else 1.0
    sw = m.slow_window.seconds if m.slow_window else 1.0
    ratio = sw / bw
    spread = bt.spread or 0.0
    if check.mode == "events":
        per_second = spread / bt.seconds
        counting = noise.poisson_events_sigma(base, ratio) if check.counting else None
        sigma = noise.combine(per_second * sw, counting)
        shown_sigma = sigma
    elif check.mode == "rate":
        counting = noise.poisson_rate_sigma(base, bw, sw) if check.counting else None
        sigma = noise.combine(spread, counting)
        shown_sigma = sigma * check.scale
    elif check.mode == "drop":
        sigma = spread / base if base > 0 else 0.0
        shown_sigma = spread * check.scale
    else:  # rise
        sigma = spread
        shown_sigma = spread * check.scale
    return replace(
        m,
        score=score(check, base, slow, ratio, sigma),
        naive_score=score(check, base, slow, ratio),
        noise=shown_sigma,
    )


def _raw(check: Check, shown: float) -> float:
    return shown if check.mode == "events" else shown / check.scale


def _requery(
    client: PrometheusClient,
    checks: Mapping[str, Check],
    scopes: Mapping[str, Scope],
    again: Mapping[tuple[str, int, Window], Sequence[Measurement]],
    workers: int,
) -> dict[tuple[str, int, Window], dict[tuple[str, ...], float]]:
    """The figures of the devices whose series cover part of a period, over that part."""

    def run(job: tuple[str, int, Window]) -> dict[tuple[str, ...], float]:
        name, _, window = job
        check = checks[name]
        wanted = {key(check, m.labels) for m in again[job]}
        narrowed = _scope_of(check, again[job], scopes[name])
        got: dict[tuple[str, ...], float] = {}
        for sel in narrowed.selectors(check):
            for s in client.query(check.expr(sel, window.range), window.at):
                k = key(check, s.labels)
                if k in wanted and math.isfinite(s.value):
                    got[k] = s.value
        return got

    jobs = list(again)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(jobs, pool.map(run, jobs), strict=True))


def _resets(
    client: PrometheusClient, check: Check, scope: Scope, periods: Periods, tiling: Tiling
) -> dict[tuple[str, ...], str]:
    """Per port: "<counter> reset between T1 and T2" when a PMA counter the check reads
    was reset inside the window (one range query per group, at the baseline's tiles)."""
    files = counter_files()
    parts = [
        f"label_replace(sum by (instance, device, port) (resets({m}{{{{{{sel}}}}}}[{{d}}])) "
        f'> 0, "counter", "{files[m][0]}", "", "")'
        for m in check.metrics
        if m in files and m.endswith("_total")
    ]
    if not parts:
        return {}
    template = " or ".join(parts)
    w = tiling.base_seconds
    out: dict[tuple[str, ...], str] = {}
    for sel in scope.selectors(check):
        expr = template.format(sel=sel, d=f"{w:g}s")
        for s in client.query_range(expr, periods.base_start + w, periods.slow_end, w):
            if not s.times:
                continue
            k = key(check, s.labels)
            t = s.times[0]
            counter = s.labels.get("counter", "")
            out.setdefault(k, f"{counter} reset between {hms(t - w)} and {hms(t)}")
    return out


__all__ = ["FLOOR", "Tiling", "counting_only", "judge", "period_seconds", "scrape_interval"]
