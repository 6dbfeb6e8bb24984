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

Owns the computations; imports only the client's answer type and the pairing of answers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.explain.client import Pair
from exporter.explain.pairing import aligned

#: a port's labels in the shared reads' answers (each port once: see pairing.aligned)
_PORT = ("instance", "device", "port")

#: per-port rates several checks share (``{sel}``, ``{d}`` as in a check's template)
SHARED_READS: dict[str, str] = {
    "tx": "rate(fabricscope_infiniband_port_transmitted_bytes_total{{{sel}}}[{d}])",
    "rx": "rate(fabricscope_infiniband_port_received_bytes_total{{{sel}}}[{d}])",
    "wait": "rate(fabricscope_infiniband_port_transmit_wait_total{{{sel}}}[{d}])",
}


@dataclass(frozen=True, slots=True)
class Derived:
    """A check whose figures are computed from :data:`SHARED_READS` (``reads``) by
    ``figure`` instead of asking Prometheus its template; only while the check's template
    is ``template`` (the one ``figure`` computes: a changed template is asked as it is)."""

    template: str
    reads: tuple[str, ...]
    figure: Callable[[Mapping[str, Sequence[Pair]]], list[Pair]]


def _by_labels(pairs: Sequence[Pair]) -> dict[tuple[tuple[str, str], ...], Pair]:
    """A one-to-one PromQL match's key: all the labels."""
    return {tuple(sorted(labels.items())): (labels, value) for labels, value in pairs}


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
    if aligned(reads["tx"], reads["rx"], _PORT):  # the same ports in the same order
        both = zip(reads["tx"], reads["rx"], strict=True)
        moved = [(labels, tx + rx) for (labels, tx), (_, rx) in both]
    else:
        rx = _by_labels(reads["rx"])
        moved = [
            (labels, tx + rx[k][1])
            for k, (labels, tx) in _by_labels(reads["tx"]).items()
            if k in rx
        ]
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
    if aligned(reads["wait"], reads["tx"], _PORT):  # the same ports in the same order
        for (labels, wait), (_, tx) in zip(reads["wait"], reads["tx"], strict=True):
            whole = wait + tx / 4
            out.append((labels, wait / whole if whole else math.nan))
        return out
    by_port = _by_labels(reads["tx"])
    for k, (labels, wait) in _by_labels(reads["wait"]).items():
        if k in by_port:
            whole = wait + by_port[k][1] / 4
            out.append((labels, wait / whole if whole else math.nan))
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
}


def derive(
    derived: Derived,
    units: Sequence[tuple[str, str, int, str]],
    answers: Sequence[tuple[list[Pair], list[Pair]]],
) -> tuple[list[Pair], list[Pair]]:
    """A derived check's baseline and slow answers from its reads' (per group of nodes:
    every figure is per port or per node, so each group is computed on its own)."""
    groups: dict[str, dict[str, tuple[list[Pair], list[Pair]]]] = defaultdict(dict)
    for (_, read, _, sel), answer in zip(units, answers, strict=True):
        groups[sel][read] = answer
    base: list[Pair] = []
    slow: list[Pair] = []
    for reads in groups.values():
        base += derived.figure({r: a[0] for r, a in reads.items()})
        slow += derived.figure({r: a[1] for r, a in reads.items()})
    return base, slow
