"""Evidence that went blind: PMA counters that stopped counting inside the window.

The PMA's narrow counters (``symbol_error`` 16 bits, ``port_xmit_wait`` 32, ...) stop at the
maximum of their width instead of wrapping; from then on ``rate()`` reads 0 whatever the
link does. The agent says so per port and counter
(``fabricscope_infiniband_port_pma_saturated``, and per port the count of saturated
counters, ``..._pma_saturated_counters``, at every ``--collector.detail``). A check that
reads a metric fed by a counter that saturated on that port at any time in the window says
"evidence unavailable (<counter> saturated since T)" instead of a figure, scores 0, and the
port's other evidence ranks without it. Which metric a counter feeds comes from the metric
catalog (:func:`exporter.metrics.infiniband_counters.pma_specs`), so a check added later
that reads a PMA counter is covered without a word of its own.

A counter reset inside the window (``resets()``) is named the same way for the changes that
come near the threshold (:mod:`exporter.explain.judge`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache

from exporter.explain.checks import Check
from exporter.explain.client import PrometheusClient
from exporter.explain.evidence import CheckResult, Periods, Scope, _alternation

SATURATED_PORTS = (
    "max by (instance, device, port) (max_over_time("
    "fabricscope_infiniband_port_pma_saturated_counters{{{sel}}}[{d}])) > 0"
)
SATURATED = "fabricscope_infiniband_port_pma_saturated{{{sel}}} == 1"


@cache
def counter_files() -> Mapping[str, tuple[str, ...]]:
    """Metric name -> the PMA counter files (``counters/``) that feed it."""
    from exporter.metrics.infiniband_counters import pma_specs

    out: dict[str, list[str]] = {}
    for name, spec in pma_specs().items():
        out.setdefault(spec.name, []).append(name)
    return {k: tuple(v) for k, v in out.items()}


def pma_counters(check: Check) -> tuple[str, ...]:
    """The PMA counter files whose metrics ``check`` reads (none for most checks)."""
    files = counter_files()
    return tuple(f for m in check.metrics for f in files.get(m, ()))


@dataclass(frozen=True, slots=True)
class Blind:
    """A counter of a port that stood at its maximum from ``since`` (to ``until``; None:
    still at the window's end), unix seconds."""

    instance: str
    device: str
    port: str
    counter: str
    since: float
    until: float | None

    @property
    def reason(self) -> str:
        if self.until is None:
            return f"{self.counter} saturated since {hms(self.since)}"
        return f"{self.counter} saturated {hms(self.since)}-{hms(self.until)}"


def hms(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def find(client: PrometheusClient, scope: Scope, periods: Periods, step: float) -> list[Blind]:
    """The job's saturated counters in the window: the ports that had any (one instant
    query per group of instances), then which counters and since when (one range query
    for those ports only)."""
    window = max(1, int(periods.slow_end - periods.base_start))
    ports: list[Mapping[str, str]] = []
    for sel in scope.instance_selectors():
        expr = SATURATED_PORTS.format(sel=sel, d=f"{window}s")
        ports += [s.labels for s in client.query(expr, periods.slow_end)]
    if not ports:
        return []
    instances = sorted({p.get("instance", "") for p in ports})
    wanted = {(p.get("instance", ""), p.get("device", ""), p.get("port", "")) for p in ports}
    sel = f'instance=~"{_alternation(instances)}"'
    series = client.query_range(
        SATURATED.format(sel=sel), periods.base_start, periods.slow_end, step
    )
    out = []
    for s in series:
        lab = s.labels
        port = (lab.get("instance", ""), lab.get("device", ""), lab.get("port", ""))
        if port not in wanted or not s.times:
            continue
        last = s.times[-1]
        until = None if last >= periods.slow_end - step else last
        out.append(Blind(*port, lab.get("counter", ""), s.times[0], until))
    return sorted(out, key=lambda b: (b.instance, b.device, b.port, b.counter))


def apply(results: Sequence[CheckResult], blinds: Sequence[Blind]) -> list[CheckResult]:
    """Every measurement of a port whose check reads a saturated counter of that port
    becomes "evidence unavailable", score 0."""
    if not blinds:
        return list(results)
    by_port: dict[tuple[str, str, str], list[Blind]] = {}
    for b in blinds:
        by_port.setdefault((b.instance, b.device, b.port), []).append(b)
    out = []
    for r in results:
        counters = set(pma_counters(r.check))
        if not counters or r.check.key != "port":
            out.append(r)
            continue
        ms = []
        for m in r.measurements:
            lab = m.labels
            hit = [
                b
                for b in by_port.get(
                    (lab.get("instance", ""), lab.get("device", ""), lab.get("port", "")), []
                )
                if b.counter in counters
            ]
            reason = "; ".join(b.reason for b in hit)
            ms.append(replace(m, score=0.0, naive_score=0.0, unavailable=reason) if hit else m)
        ms.sort(key=lambda m: -m.score)
        out.append(CheckResult(r.check, r.series, ms))
    return out
