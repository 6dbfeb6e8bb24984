"""Checks computed from the reads they share, each read asked of Prometheus once.

Prometheus's cost of a check is the series its selectors read, each selector on its own:
``rail_share`` reads the data counters of the job's ports twice (a port's, and its node's
median) and ``xmit_wait_share`` the wait counter twice and the data counter again: seven
reads of 12,288 series per period for a 1,024-node job, where three do. Here each of those
counters' rate is asked once per period (:data:`SHARED_READS`) and both figures are computed
from the answers as their templates compute them (a one-to-one match on all labels,
Prometheus's ``quantile``); the printed PromQL is still the check's template, which returns
the same figure. A check is computed only while its template is the one its computation
follows (:attr:`Derived.template`): a changed template is asked as it is.

The same holds for a port's rate and width: ``port_rate`` and ``port_width`` read them, and
``port_lane_speed`` divides one by the other (two more reads of the same 12,288 series a
period for a 1,024-node job): each is asked once, and the lane speed divided here as
Prometheus divides (a one-to-one match on all labels, IEEE 754 for a zero width).

The same holds for the port's state: ``port_up`` averages it, and ``port_rate_degraded``
counted it and took its last value (three reads of 12,288 series a period for a 1,024-node job,
where one does): its average is asked once for both, and ``port_rate_degraded``, whose
comparison series is exported only while a port runs below its rate (below full detail),
is 0 for every port the state is read for whenever no port has that series; when one has,
its template is asked as it is (:attr:`Derived.figure` gives ``None``).

Owns the computations; imports only the client's answer type and the pairing of answers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.explain.checks.links import PORT_RATE_DEGRADED
from exporter.explain.client import Pair
from exporter.explain.pairing import matched

#: a port's labels in the shared reads' answers (each port once: see pairing.aligned)
_PORT = ("instance", "device", "port")

#: per-port rates several checks share (``{sel}``, ``{d}`` as in a check's template)
SHARED_READS: dict[str, str] = {
    "tx": "rate(fabricscope_infiniband_port_transmitted_bytes_total{{{sel}}}[{d}])",
    "rx": "rate(fabricscope_infiniband_port_received_bytes_total{{{sel}}}[{d}])",
    "wait": "rate(fabricscope_infiniband_port_transmit_wait_total{{{sel}}}[{d}])",
    "up": "avg_over_time(fabricscope_infiniband_port_up{{{sel}}}[{d}])",
    "degraded": "max by (instance, device, port) "
    "(sum_over_time(fabricscope_infiniband_port_rate_degraded{{{sel}}}[{d}]))",
    "rate": "avg_over_time(fabricscope_infiniband_port_rate_bytes_per_second{{{sel}}}[{d}])",
    "width": "avg_over_time(fabricscope_infiniband_port_link_width{{{sel}}}[{d}])",
}


@dataclass(frozen=True, slots=True)
class Derived:
    """A check whose figures are computed from :data:`SHARED_READS` (``reads``) by
    ``figure`` instead of asking Prometheus its template; only while the check's template
    is ``template`` (the one ``figure`` computes: a changed template is asked as it is).
    ``figure`` gives ``None`` where the reads do not determine the figures: the template is
    asked then, for that period and group of nodes."""

    template: str
    reads: tuple[str, ...]
    figure: Callable[[Mapping[str, Sequence[Pair]]], list[Pair] | None]


def _quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus's ``quantile``: linear between the two samples around rank q(n-1)."""
    v = sorted(values)
    rank = q * (len(v) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(v) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return v[lower] * (1 - weight) + v[upper] * weight


def _rail_share(reads: Mapping[str, Sequence[Pair]]) -> list[Pair]:
    """(tx + rx) / on (instance) group_left quantile by (instance) (0.5, (tx + rx) > 0)"""
    moved = [(labels, tx + rx) for labels, tx, rx in matched(reads["tx"], reads["rx"])]
    per_node: dict[str, list[float]] = defaultdict(list)
    for labels, v in moved:
        if v > 0:
            per_node[labels.get("instance", "")].append(v)
    median = {node: _quantile(0.5, vs) for node, vs in per_node.items()}
    return [
        (labels, v / median[node])
        for labels, v in moved
        if (node := labels.get("instance", "")) in median
    ]


def _xmit_wait_share(reads: Mapping[str, Sequence[Pair]]) -> list[Pair]:
    """wait / (wait + tx / 4)"""
    out: list[Pair] = []
    for labels, wait, tx in matched(reads["wait"], reads["tx"]):
        whole = wait + tx / 4
        out.append((labels, wait / whole if whole else math.nan))
    return out


def _port_up(reads: Mapping[str, Sequence[Pair]]) -> list[Pair]:
    """The template itself: the shared read."""
    return list(reads["up"])


def _port_rate(reads: Mapping[str, Sequence[Pair]]) -> list[Pair]:
    """The template itself: the shared read."""
    return list(reads["rate"])


def _port_width(reads: Mapping[str, Sequence[Pair]]) -> list[Pair]:
    """The template itself: the shared read."""
    return list(reads["width"])


def _divided(a: float, b: float) -> float:
    """``a / b`` as Prometheus divides (IEEE 754: x/0 is +-Inf, 0/0 NaN)."""
    if b:
        return a / b
    if a == 0 or math.isnan(a):
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _lane_speed(reads: Mapping[str, Sequence[Pair]]) -> list[Pair]:
    """rate / width (a one-to-one match on all labels)."""
    return [(labels, _divided(r, w)) for labels, r, w in matched(reads["rate"], reads["width"])]


def _port_rate_degraded(reads: Mapping[str, Sequence[Pair]]) -> list[Pair] | None:
    """max by (instance, device, port) (sum_over_time(degraded)) / on (instance, device, port)
    max by (instance, device, port) (count_over_time(up)) or 0 * max by (instance, device,
    port) (last_over_time(up)): with no degraded series, the right side of ``or`` alone, 0
    for each port (its labels, in the order of the ports' first series), port_up being 0 or
    1; with one, the count is needed: None (ask the template)."""
    if reads["degraded"]:
        return None
    out: list[Pair] = []
    seen: set[tuple[str, ...]] = set()
    for labels, _ in reads["up"]:
        port = {n: labels[n] for n in _PORT if labels.get(n)}
        k = tuple(port.get(n, "") for n in _PORT)
        if k not in seen:
            seen.add(k)
            out.append((port, 0.0))
    return out


DERIVED: dict[str, Derived] = {
    "rail_share": Derived(
        "(rate(fabricscope_infiniband_port_transmitted_bytes_total{{{sel}}}[{d}]) + "
        "rate(fabricscope_infiniband_port_received_bytes_total{{{sel}}}[{d}])) "
        "/ on (instance) group_left quantile by (instance) (0.5, "
        "(rate(fabricscope_infiniband_port_transmitted_bytes_total{{{peers}}}[{d}]) + "
        "rate(fabricscope_infiniband_port_received_bytes_total{{{peers}}}[{d}])) > 0)",
        ("tx", "rx"),
        _rail_share,
    ),
    "xmit_wait_share": Derived(
        "rate(fabricscope_infiniband_port_transmit_wait_total{{{sel}}}[{d}]) / "
        "(rate(fabricscope_infiniband_port_transmit_wait_total{{{sel}}}[{d}]) + "
        "rate(fabricscope_infiniband_port_transmitted_bytes_total{{{sel}}}[{d}]) / 4)",
        ("wait", "tx"),
        _xmit_wait_share,
    ),
    "port_up": Derived(
        SHARED_READS["up"],  # the check's template is the read itself
        ("up",),
        _port_up,
    ),
    "port_rate": Derived(SHARED_READS["rate"], ("rate",), _port_rate),
    "port_width": Derived(SHARED_READS["width"], ("width",), _port_width),
    "port_lane_speed": Derived(
        f"{SHARED_READS['rate']} / {SHARED_READS['width']}", ("rate", "width"), _lane_speed
    ),
    "port_rate_degraded": Derived(
        PORT_RATE_DEGRADED,
        ("degraded", "up"),
        _port_rate_degraded,
    ),
}


def derive(
    derived: Derived,
    units: Sequence[tuple[str, str, int, str]],
    answers: Sequence[tuple[list[Pair], list[Pair]]],
    ask: Callable[[str, bool], list[Pair]],
) -> tuple[list[Pair], list[Pair]]:
    """A derived check's baseline and slow answers from its reads' (per group of nodes:
    every figure is per port or per node, so each group is computed on its own); where the
    reads do not determine them, ``ask(selector, slow)`` asks the check's template."""
    groups: dict[str, dict[str, tuple[list[Pair], list[Pair]]]] = defaultdict(dict)
    for (_, read, _, sel), answer in zip(units, answers, strict=True):
        groups[sel][read] = answer
    base: list[Pair] = []
    slow: list[Pair] = []
    for sel, reads in groups.items():
        for period, out in ((0, base), (1, slow)):
            got = derived.figure({r: a[period] for r, a in reads.items()})
            out.extend(ask(sel, bool(period)) if got is None else got)
    return base, slow
