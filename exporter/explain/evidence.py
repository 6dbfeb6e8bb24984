"""Evaluate the checks over the baseline and the slow period and score each device.

Each check costs two instant queries (the baseline's range ending at the change, the slow
period's ending at the window's end), both scoped to the job's instances or pods by exact
alternations of names found in discovery: never a regex over the whole fleet. A large job's
names are cut into groups of ``Scope.max_names`` (exporter.explain.plan), one query per group,
so the samples one query reads stay bounded whatever the job's size; every check is
per device (per instance at most), so the groups' answers together are the whole answer.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from exporter.explain import noise
from exporter.explain.checks import CHECKS, THRESHOLD, Check, _escape
from exporter.explain.client import Pair, PrometheusClient, Sample
from exporter.explain.pairing import paired
from exporter.explain.plan import MAX_NAMES_PER_QUERY, groups
from exporter.explain.shared import DERIVED, SHARED_READS
from exporter.explain.shared import derive as derive_shared


@dataclass(frozen=True, slots=True)
class Periods:
    """Baseline [base_start, base_end] and slow period [slow_start, slow_end], unix seconds."""

    base_start: float
    base_end: float
    slow_start: float
    slow_end: float

    @property
    def base_seconds(self) -> int:
        return max(1, int(self.base_end - self.base_start))

    @property
    def slow_seconds(self) -> int:
        return max(1, int(self.slow_end - self.slow_start))

    @property
    def events_seconds(self) -> int:
        """The slow period counted back over the guard step before it, for events: the
        event that caused the change (a link going down) happens at the change, and an
        ``increase()`` whose range starts after its first sample past the event cannot
        see it."""
        return max(1, int(self.slow_end - self.base_end))


@dataclass(frozen=True, slots=True)
class Scope:
    """The job's footprint: exact names used in every query's label matchers."""

    instances: tuple[str, ...]
    namespace: str
    pods: tuple[str, ...]
    max_names: int = MAX_NAMES_PER_QUERY
    #: the throughput series' job_name: a bare-metal job's NCCL series carry it (no pods)
    job_name: str = ""

    def selector(self, check: Check) -> str:
        """One selector for the whole job (small jobs, and tests)."""
        return self.selectors(check, len(self.pods) + len(self.instances) + 1)[0]

    def instance_selectors(self) -> list[str]:
        """The job's instances, one selector per group of at most ``max_names``."""
        return [f'instance=~"{_alternation(g)}"' for g in groups(self.instances, self.max_names)]

    def selectors(self, check: Check, max_names: int | None = None) -> list[str]:
        """The job's selector for ``check``, one per group of at most ``max_names`` names."""
        size = self.max_names if max_names is None else max_names
        if check.whole_job:  # one question for the whole job (see Check.whole_job)
            size = len(self.pods) + len(self.instances) + 1
        if check.scope == "pod" and self.pods:
            ns = _escape(self.namespace)
            return [f'namespace="{ns}",pod=~"{_alternation(g)}"' for g in groups(self.pods, size)]
        if check.scope == "pod":  # bare metal: the job's own series on its nodes, or none
            if not (check.job_named and self.job_name):
                return []
            job = f'job_name="{_escape(self.job_name)}"'
            return [f'instance=~"{_alternation(g)}",{job}' for g in groups(self.instances, size)]
        return [f'instance=~"{_alternation(g)}"' for g in groups(self.instances, size)]


def _alternation(names: Sequence[str]) -> str:
    """An exact-match alternation: every name escaped for RE2, then for the string."""
    return _alternation_of(tuple(sorted(names)))


_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


@functools.lru_cache(maxsize=256)
def _alternation_of(names: tuple[str, ...]) -> str:
    """:func:`_alternation` of sorted ``names``, kept: every check asks with the same groups
    (a 1,024-node job's alternation is built once, not once per check)."""
    return _escape("|".join(_RE2_SPECIAL.sub(r"\\\1", n) for n in names))


@dataclass(frozen=True, slots=True)
class Window:
    """Where a figure was taken: the range ``seconds`` of the check's expression, evaluated
    at unix time ``at`` (the printed PromQL over that range, run at that time, returns
    the figure)."""

    seconds: float
    at: float

    @property
    def range(self) -> str:
        return f"{max(1, round(self.seconds))}s"


@dataclass(slots=True)
class Measurement:
    """One check on one device: baseline and slow figures (in the check's display unit),
    the change that was scored and the score.

    Never changed once made (a changed one is a new one: ``dataclasses.replace``), but not
    ``frozen``: a 1,024-node job makes 300,000 of them, and a frozen dataclass's
    ``__init__`` (``object.__setattr__`` per field) costs seven times a plain one's.

    ``base``/``slow_window``: where each figure was taken (the whole period, or the part
    of it the series covers). ``noise``: the standard deviation of the change the baseline's
    own spread (and counting) allows, in the display unit (``None``: not measured, the
    score stayed below the floor where noise is looked at). ``unavailable``: why the
    evidence is blind (a saturated or reset counter), not scored; ``thin``: why a period
    holds too little of the series to score it."""

    check: Check
    labels: Mapping[str, str]
    baseline: float | None
    slow: float | None
    score: float
    #: the baseline is the job's: a pod-scoped check's new pod (a restarted job's pods may
    #: take new names) is held to the median of the job's pods in the baseline
    job_baseline: bool = False
    base_window: Window | None = None
    slow_window: Window | None = None
    noise: float | None = None
    #: the score the change would have had against its significance level alone
    naive_score: float = 0.0
    unavailable: str = ""
    thin: str = ""
    #: a ``whole_job`` check's selector (the whole job's): its printed PromQL's, the device
    #: one row of the answer
    job_selector: str = ""

    @property
    def no_baseline(self) -> bool:
        """A value in the slow period and none in the baseline: not scored (see
        :func:`score`)."""
        return self.check.mode != "level" and self.baseline is None and self.slow is not None

    @property
    def judged(self) -> bool:
        """Scored on data of both periods (or, for ``level``, of the slow period)."""
        if self.unavailable or self.thin or self.slow is None:
            return False
        return self.check.mode == "level" or self.baseline is not None

    @property
    def within_noise(self) -> bool:
        """The change would have stood out against its significance level alone, and its
        baseline's noise holds it below the threshold."""
        return self.naive_score >= THRESHOLD > self.score

    @property
    def text(self) -> str:
        c = self.check
        gpu = self.labels.get("gpu", "")
        on = f" (GPU {gpu})" if c.key == "pod" and gpu else ""
        if self.unavailable:
            return f"{c.what}{on}: evidence unavailable ({self.unavailable})"
        tail = " (no baseline: not scored)" if self.no_baseline else ""
        if self.job_baseline:
            tail = " (baseline: the job's pods before)"
        if self.thin:
            tail = f" ({self.thin}: not scored)"
        elif self.within_noise and self.noise is not None:
            tail += f" (within its baseline's noise: +-{_fmt(noise.Z * self.noise)}{c.unit})"
        return f"{c.what}{on}: {_fmt(self.baseline)} -> {_fmt(self.slow)}{c.unit}{tail}"


@dataclass(frozen=True, slots=True)
class Query:
    """PromQL that returns a printed figure when evaluated (an instant query) at ``at``."""

    promql: str
    at: float


def queries(m: Measurement, job_selector: str = "") -> tuple[Query | None, Query | None]:
    """The PromQL of ``m``'s baseline and slow figures, scoped to its device (its node for
    ``{peers}``), over the windows the figures were taken in; a baseline borrowed from the
    job's pods is their median (``job_selector``: the job's pods)."""
    c = m.check
    sel, peers = c.device_selector(m.labels), c.peer_selector(m.labels)
    if m.job_selector:
        sel = peers = m.job_selector
    base = slow = None
    if m.baseline is not None and m.base_window is not None:
        w = m.base_window
        expr = c.shown(sel, w.range, peers)
        if m.job_baseline and job_selector:
            expr = f"quantile(0.5, {c.shown(job_selector, w.range, job_selector)})"
        base = Query(expr, w.at)
    if m.slow is not None and m.slow_window is not None:
        w = m.slow_window
        slow = Query(c.shown(sel, w.range, peers), w.at)
    return base, slow


def _fmt(value: float | None) -> str:
    if value is None:
        return "none"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if float(value).is_integer():
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.3g}"
    return f"{value:.2g}"


def change(check: Check, base: float | None, slow: float | None, ratio: float) -> float | None:
    """The change the check's mode scores, in its series' units (``drop``: relative); None
    when there is nothing to compare (no slow figure, or no baseline outside ``level``)."""
    if slow is None or not math.isfinite(slow):
        return None
    b = base if base is not None and math.isfinite(base) else None
    if check.mode == "level":
        return slow
    if b is None:
        return None
    if check.mode == "events":
        return slow - b * ratio
    if check.mode == "drop":
        return (b - slow) / b if b > 0 else None
    return slow - b  # rate, rise


def score(
    check: Check, base: float | None, slow: float | None, ratio: float, sigma: float = 0.0
) -> float:
    """``log2(1 + change / bar)`` for the change the check's mode defines, where the bar is
    the check's significance level or ``noise.Z`` times ``sigma`` (the change's noise, in
    the change's own terms), whichever is larger; 0 when it did not get worse. ``ratio``
    is the slow period's length over the baseline's.

    A change needs a baseline: every mode but ``level`` scores 0 when the baseline holds no
    value (the window began before the agents' data, or the series appeared later), and the
    measurement says "no baseline" (:attr:`Measurement.no_baseline`). A standing x8 link
    seen only in the slow period is not today's cause."""
    c = change(check, base, slow, ratio)
    return 0.0 if c is None else noise.score(c, check.significant, sigma)


@dataclass(slots=True)
class CheckResult:
    check: Check
    series: int = 0  # devices the check found data for
    measurements: list[Measurement] = field(default_factory=list)
    #: :meth:`counts` and :meth:`worst` as :func:`compare_pairs` found them while it made
    #: ``measurements`` (a 1,024-node job's 300,000, counted while Prometheus answers the
    #: next check instead of in one more pass after the last); a result made any other way
    #: (blind evidence, judged again, a copy by ``dataclasses.replace``) has none and counts
    #: its measurements when asked. Whoever changes ``measurements`` in place drops it.
    tally: tuple[Counts, float] | None = field(default=None, init=False, repr=False, compare=False)

    def worst(self) -> float:
        """The highest score of its measurements (0 with none)."""
        if self.tally is not None:
            return self.tally[1]
        return max((m.score for m in self.measurements), default=0.0)

    def counts(self) -> Counts:
        """How its devices fared, in one pass."""
        if self.tally is not None:
            return self.tally[0]
        out = Counts()
        for m in self.measurements:
            if m.unavailable:
                out.unavailable += 1
            elif m.thin:
                out.thin += 1
            elif m.slow is None:
                continue
            elif m.baseline is not None or m.check.mode == "level":
                out.judged += 1
                out.instances.add(m.labels.get("instance", ""))
            else:
                out.no_baseline += 1
        return out

    @property
    def no_baseline(self) -> int:
        """Devices with a value in the slow period and none in the baseline."""
        return self.counts().no_baseline


@dataclass(slots=True)
class Counts:
    """A check's devices: judged (and their instances), without baseline, blind, thin."""

    judged: int = 0
    no_baseline: int = 0
    unavailable: int = 0
    thin: int = 0
    instances: set[str] = field(default_factory=set)


def key(check: Check, labels: Mapping[str, str]) -> tuple[str, ...]:
    """A device's identity for ``check``: its instance and identity labels."""
    return (labels.get("instance", ""), *(labels.get(k, "") for k in check.identity))


def evaluate(
    client: PrometheusClient,
    scope: Scope,
    periods: Periods,
    *,
    checks: Sequence[Check] = CHECKS,
    workers: int = 8,
    derive: bool = True,
) -> list[CheckResult]:
    """Run every check (two instant queries each, ``workers`` at a time; the checks of
    :data:`DERIVED` from reads they share, each asked once, unless ``derive`` is False)."""

    seconds = {c.name: period_seconds(c, periods) for c in checks}
    planned = [c for c in checks if scope.selectors(c)]
    derived = {
        c.name: DERIVED[c.name]
        for c in planned
        if derive and c.name in DERIVED and DERIVED[c.name].template == c.template
    }
    # a unit of work: a check's template, or a shared read (by name), over one selector and
    # the check's ranges; the shared reads of the derived checks asked once for all of them
    units: dict[tuple[str, str, int, str], str] = {}
    for c in planned:
        for sel in scope.selectors(c):
            if c.name not in derived:
                units[("check", c.name, seconds[c.name], sel)] = c.template
                continue
            for read in derived[c.name].reads:
                units[("read", read, seconds[c.name], sel)] = SHARED_READS[read]
    jobs = list(units)

    def run(job: tuple[str, str, int, str]) -> tuple[list[Pair], list[Pair]]:
        template, sel = units[job], job[3]
        base_expr = template.format(sel=sel, d=f"{periods.base_seconds}s", peers=sel)
        base = client.vector(base_expr, periods.base_end)
        slow_expr = template.format(sel=sel, d=f"{job[2]}s", peers=sel)
        return base, client.vector(slow_expr, periods.slow_end)

    def ask(c: Check, sel: str, slow: bool) -> list[Pair]:
        """A derived check's template, asked as it is for one period (exporter.explain.shared:
        where its reads do not determine its figures)."""
        if slow:
            return client.vector(c.expr(sel, f"{seconds[c.name]}s"), periods.slow_end)
        return client.vector(c.expr(sel, f"{periods.base_seconds}s"), periods.base_end)

    answers: dict[tuple[str, str, int, str], tuple[list[Pair], list[Pair]]] = {}
    needs = {
        c.name: [
            u
            for sel in scope.selectors(c)
            for u in (
                [("read", r, seconds[c.name], sel) for r in derived[c.name].reads]
                if c.name in derived
                else [("check", c.name, seconds[c.name], sel)]
            )
        ]
        for c in planned
    }
    waiting = {c.name: len(needs[c.name]) for c in planned}
    users: dict[tuple[str, str, int, str], list[Check]] = defaultdict(list)
    for c in planned:
        for u in needs[c.name]:
            users[u].append(c)
    still_needed = {u: len(cs) for u, cs in users.items()}
    done: dict[str, CheckResult] = {}
    # each check compared as soon as its answers are in, while Prometheus answers the next
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run, job): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            answers[job] = future.result()
            for c in users[job]:
                waiting[c.name] -= 1
                if waiting[c.name]:
                    continue
                got = [answers[u] for u in needs[c.name]]
                if c.name in derived:
                    base, slow = derive_shared(
                        derived[c.name], needs[c.name], got, functools.partial(ask, c)
                    )
                elif len(got) == 1:  # the whole job in one query (up to 1,024 nodes)
                    base, slow = got[0]
                else:
                    base = [p for a in got for p in a[0]]
                    slow = [p for a in got for p in a[1]]
                done[c.name] = compare_pairs(
                    c,
                    base,
                    slow,
                    seconds[c.name] / periods.base_seconds,
                    base_window=Window(periods.base_seconds, periods.base_end),
                    slow_window=Window(seconds[c.name], periods.slow_end),
                    job_selector=scope.selectors(c)[0] if c.whole_job else "",
                )
                for u in needs[c.name]:
                    still_needed[u] -= 1
                    if not still_needed[u]:
                        del answers[u]  # compared: not held until the last check is
    return [done[c.name] if c.name in done else CheckResult(c) for c in checks]


def period_seconds(check: Check, periods: Periods) -> int:
    """The slow period's range for ``check`` (events reach back over the guard step)."""
    return periods.events_seconds if check.mode == "events" else periods.slow_seconds


def compare(
    check: Check,
    base: Sequence[Sample],
    slow: Sequence[Sample],
    ratio: float,
    *,
    base_window: Window | None = None,
    slow_window: Window | None = None,
    job_selector: str = "",
) -> CheckResult:
    """Join baseline and slow samples per device and score them (against the significance
    level; :mod:`exporter.explain.judge` then holds the changes that come near it to their
    coverage and noise)."""
    return compare_pairs(
        check,
        [(s.labels, s.value) for s in base],
        [(s.labels, s.value) for s in slow],
        ratio,
        base_window=base_window,
        slow_window=slow_window,
        job_selector=job_selector,
    )


def compare_pairs(
    check: Check,
    base: Sequence[Pair],
    slow: Sequence[Pair],
    ratio: float,
    *,
    base_window: Window | None = None,
    slow_window: Window | None = None,
    job_selector: str = "",
) -> CheckResult:
    """:func:`compare` of ``(labels, value)`` pairs (``PrometheusClient.vector``'s answers).
    It runs once per device of the job per check (300,000 times for a 1,024-node job): the
    two answers paired (:func:`exporter.explain.pairing.paired`), the device's figures and
    score in place."""
    rows = paired(base, slow, ("instance", *check.identity))
    result = CheckResult(check, series=len(rows))
    events = check.mode == "events"
    display = check.display
    scale = 1.0 if events else check.scale
    # a pod-scoped check's baseline is the job's when a pod has none of its own (a restarted
    # job's new pods): the median of the job's pods then, its noise their spread; a
    # device-scoped check never borrows
    before: list[float] = []
    if check.scope == "pod":
        before = [v for _, v in base if math.isfinite(v)]
    if events:
        before = [display(v) for v in before]
    job = statistics.median(before) if before else None
    job_sigma = noise.values_spread(before) if job is not None else 0.0
    out = result.measurements
    isfinite = math.isfinite
    # CheckResult.counts as it counts them, while the rows are at hand (none is blind or
    # thin yet: blind.apply and judge make new results when they mark one)
    level = check.mode == "level"
    # modes whose change is slow minus baseline (or relative to it): none when the two are
    # equal, so an unchanged device (a port's rate, a link's width) scores 0 without scoring
    flat = check.mode in ("rate", "rise", "drop")
    judged = no_baseline = 0
    instances: set[str] = set()
    for labels, braw, sraw in rows:
        bv = braw if braw is not None and isfinite(braw) else None
        sv = sraw if sraw is not None and isfinite(sraw) else None
        if events:  # whole events, as printed (round() in the PromQL)
            bv = None if bv is None else display(bv)
            sv = None if sv is None else display(sv)
        borrowed = bv is None and sv is not None and job is not None
        if borrowed:
            bv = job
        if sv is not None:
            if bv is not None or level:
                judged += 1
                instances.add(labels.get("instance", ""))
            else:
                no_baseline += 1
        # nothing in either period (most devices, most checks) scores 0 in every mode, and
        # the same figure in both periods in the modes that score a difference
        same = bv is not None and bv == sv and (flat or bv == 0.0)
        naive = 0.0 if same else score(check, bv, sv, ratio)
        sigma = _relative(check, bv, job_sigma) if borrowed else 0.0
        out.append(
            Measurement(
                check,
                labels,
                None if bv is None else bv * scale,
                None if sv is None else sv * scale,
                score(check, bv, sv, ratio, sigma) if borrowed else naive,
                borrowed,
                base_window,
                slow_window,
                None if not borrowed else job_sigma * scale,
                naive,
                "",
                "",
                job_selector,
            )
        )
    out.sort(key=_by_score, reverse=True)  # stable: equal scores keep the answer's order
    counted = Counts(judged, no_baseline, instances=instances)
    result.tally = (counted, max((m.score for m in out), default=0.0))
    return result


_by_score = operator.attrgetter("score")


def _relative(check: Check, base: float | None, sigma: float) -> float:
    """``sigma`` in the terms of the check's change (``drop``: relative to the baseline)."""
    if check.mode == "drop":
        return sigma / base if base else 0.0
    return sigma


# --- NCCL settings across the job's pods ----------------------------------------------------

NCCL_ENV_DIFF_SCORE = 2.0  # a differing setting is a defect of the job: it always stands out


@dataclass(frozen=True, slots=True)
class EnvDifference:
    variable: str
    values: Mapping[str, tuple[str, ...]]  # value ("<unset>" when absent) -> pods


def nccl_env_differences(samples: Sequence[Sample]) -> list[EnvDifference]:
    """Variables whose value is not the same on every pod that reported NCCL settings
    (a variable set on some pods and absent on others counts as different)."""
    pods = sorted({s.labels.get("pod", "") for s in samples})
    by_var: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for s in samples:
        by_var[s.labels.get("variable", "")][s.labels.get("pod", "")].add(s.labels.get("value", ""))
    out = []
    for var, per_pod in sorted(by_var.items()):
        values: dict[str, list[str]] = defaultdict(list)
        for pod in pods:
            vals = per_pod.get(pod)
            values[",".join(sorted(vals)) if vals else "<unset>"].append(pod)
        if len(values) > 1:
            out.append(EnvDifference(var, {v: tuple(p) for v, p in sorted(values.items())}))
    return out


NCCL_ENV_QUERY = (
    "max by (namespace, pod, variable, value) "
    "(last_over_time(fabricscope_workload_nccl_env_info{{{sel}}}[{d}]))"
)


def query_nccl_env(
    client: PrometheusClient, scope: Scope, periods: Periods
) -> tuple[str, list[Sample]]:
    if not scope.pods:
        return "", []
    sel = f'namespace="{_escape(scope.namespace)}",pod=~"{_alternation(scope.pods)}"'
    expr = NCCL_ENV_QUERY.format(sel=sel, d=f"{periods.slow_seconds}s")
    return sel, client.query(expr, periods.slow_end)
