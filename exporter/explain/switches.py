"""Which switch: the job's ports grouped by the leaf switch their cables land on, and the
leaves' uplinks grouped by the spine at their far end.

At scale the slowdown an operator fears most is one bad switch: each node under it shows a
little congestion, a few errors, a lower rate, and no single port stands out. The agents'
ibpeer sampler says which leaf port every node port is cabled to
(``fabricscope_infiniband_peer_info``) and, for the uplinks each reads, which spine port a
leaf port is cabled to (``fabricscope_infiniband_switch_link_info``) with both ends'
counters (``fabricscope_infiniband_switch_port_*``). :mod:`exporter.explain.uplinks` joins them for
the job (:func:`topology`) and scores the uplinks of the job's leaves (:data:`UPLINK_CHECKS`,
:func:`evaluate_uplinks`); this module groups (:func:`group`):

1. **Ports under a leaf.** For each kind of evidence (a cause of the port checks: link
   errors, drops, congestion, lower rate, lower data share), the job's ports whose score for
   it reached :data:`MEMBER_SCORE` are the evidence ports. The test asks whether the evidence
   ports crowd onto one leaf beyond what the job's placement makes likely, weighing how
   strongly each errs (:func:`exporter.explain.crowd.leaf_scan`): with ``N`` of the job's
   ports on known leaves and ``K`` of them on leaf ``L``, for the ``m`` strongest of ``L``'s
   evidence ports, the weakest scoring ``s``, and the ``n(s)`` job ports scoring at least
   ``s``, the chance that ``m`` or more of the ``n(s)`` fall on ``L`` when they land on ports
   at random is the hypergeometric tail ``P(X >= m)``; its smallest over the ``m`` tried,
   times the number tried and the job's leaves (Bonferroni), is held against :data:`ALPHA`
   when the strongest of them stands out alone, and against :data:`ALPHA_UNSEEN` when none
   does: a crowd that makes a cause of ports none of which is one must be as unlikely as
   one port standing out by chance. A leaf is named only when ports of at least two of the
   job's nodes show the evidence: one node's fault (its NIC, its PCIe, its driver, all its
   ports under one leaf) stays that node's. A job placed on a single leaf can never name it
   (``K = N`` makes every tail 1): nothing tells the leaf from the job then.
2. **Uplinks.** An uplink whose end (either: the switch end counts, so a cable whose errors
   show only at the spine is found) scores at least :data:`MEMBER_SCORE` is evidence for a
   spine (at least one of the spine's at :data:`~exporter.explain.checks.THRESHOLD`); a
   leaf's or a cable's needs the threshold. A spine is named when uplinks of at least two
   of the job's leaves to it err and chance does not explain them
   (:func:`exporter.explain.crowd.spine_scan`): each of the job's uplinks is taken to err
   at least as strongly as the spine's on its own with probability ``q``, estimated from
   the job's uplinks to the *other* spines (the share of them that err that strongly,
   drawn towards a prior of one uplink in fifty); the binomial tail of ``m`` or more of the
   spine's ``n`` uplinks doing so, scanned over its strongest ``m`` and corrected for the
   scan and the spines tested, must fall under :data:`ALPHA`. Placement alone cannot
   decide this (with ``S`` spines, two erring uplinks land on one spine by chance one time
   in about ``S``), nor the count of erring uplinks alone: what names the spine is
   that one fault explains what would otherwise take two or more independent cable faults
   in one window, and that the job's other uplinks stay clean (a fabric-wide event errs on
   every spine's uplinks and names none). Two or more uplinks of one leaf, not taken by a
   spine, name the leaf; a single uplink is named as the cable it is.

A leaf named for several kinds (and for its uplinks) is one finding. Its score is its
strongest port's or uplink's (at least the threshold: the group stands out even when no
port alone does) plus ``0.5 * log2(nodes)``; the ports it names are folded into it: they
are not ranked again as their own findings of that cause (:func:`without`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from exporter.explain.checks import CAUSES, THRESHOLD
from exporter.explain.crowd import (
    binomial_tail,
    chance_of,
    leaf_scan,
    spine_scan,
)
from exporter.explain.evidence import (
    CheckResult,
    Measurement,
    Periods,
    queries,
)
from exporter.explain.rank import Finding
from exporter.explain.uplinks import (
    UPLINK_CHECKS,
    Cable,
    Port,
    SwitchPort,
    Topology,
    evaluate_uplinks,
    topology,
)

__all__ = [  # the fabric map and the uplinks' checks live in exporter.explain.uplinks
    "UPLINK_CHECKS",
    "Cable",
    "Topology",
    "evaluate_uplinks",
    "group",
    "topology",
    "without",
]

#: a port's score for a cause that makes it an evidence port of that cause
MEMBER_SCORE = 0.5
#: the chance (after Bonferroni over the job's leaves or spines) under which a crowd of
#: evidence ports on one switch is not the job's placement alone
ALPHA = 0.05
#: the same for a crowd of ports under a leaf none of which stands out alone: as unlikely
#: as one port's score of 1 by chance (its change clearing three standard deviations of
#: its noise, one-sided), since the crowd then makes a cause of what no port is
ALPHA_UNSEEN = 0.5 * math.erfc(3 / math.sqrt(2))
#: the port causes tested for crowding under a leaf
GROUPED_CAUSES = ("ib_link", "drops", "ib_congestion", "port_rate", "rail_share")
#: what each of them is called in a switch's evidence
KIND = {
    "ib_link": "link errors",
    "drops": "drops",
    "ib_congestion": "congestion",
    "port_rate": "a lower rate",
    "rail_share": "a lower data share",
}
#: the title of a single uplink's finding (a cable, not its switches)
UPLINK_CABLE_TITLE = "an uplink cable (switch to switch) errs, drops or congests"


def spine_chance(hit: int, uplinks: int, others_hit: int, others: int) -> tuple[float, float]:
    """The chance that ``hit`` or more of a spine's ``uplinks`` err as independent cable
    faults, and the per-uplink chance ``q`` it assumed: the posterior mean of the share of
    the job's ``others`` uplinks to other spines that err (``others_hit`` of them) under
    the prior of :mod:`exporter.explain.crowd`: the count-only special case of its
    :func:`~exporter.explain.crowd.spine_scan`."""
    q = chance_of(others_hit, others)
    return binomial_tail(hit, uplinks, q), q


@dataclass(frozen=True, slots=True)
class Grouping:
    """The switch findings and the (cause, instance, device, port) of the ports they name."""

    findings: tuple[Finding, ...] = ()
    folded: frozenset[tuple[str, str, str, str]] = frozenset()


@dataclass
class _Named:
    """A switch being named: its evidence lines (strongest first per part), score parts."""

    guid: str
    lines: list[tuple[float, str]] = field(default_factory=list)
    top: float = 0.0
    nodes: set[str] = field(default_factory=set)
    #: the measurements its evidence lines show (each with the PromQL of its figures)
    measurements: list[Measurement] = field(default_factory=list)


def _port_evidence(
    results: Iterable[CheckResult],
) -> dict[str, dict[Port, list[Measurement]]]:
    """Per grouped cause, each port's measurements with a positive score, strongest first."""
    out: dict[str, dict[Port, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.check.key != "port" or r.check.cause not in GROUPED_CAUSES:
            continue
        for m in r.measurements:
            if m.score > 0:
                lb = m.labels
                key = (lb.get("instance", ""), lb.get("device", ""), lb.get("port", ""))
                out[r.check.cause][key].append(m)
    for per_port in out.values():
        for ms in per_port.values():
            ms.sort(key=lambda m: -m.score)
    return out


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else "< 0.0001"


def group(
    results: Sequence[CheckResult],
    uplink_results: Sequence[CheckResult],
    topo: Topology,
    *,
    periods: Periods,
    step: float,
    link: str = "",
) -> Grouping:
    """Name the switches (see the module docstring); ``link`` is the by-switch panel."""
    named: dict[str, _Named] = {}
    folded: set[tuple[str, str, str, str]] = set()
    extra: list[Finding] = []
    population = dict(topo.cables)
    by_leaf: dict[str, list[Port]] = defaultdict(list)
    for key, c in population.items():
        by_leaf[c.switch_guid].append(key)
    leaves_tested = sum(1 for ports in by_leaf.values() if len(ports) >= 2)
    for cause, per_port in sorted(_port_evidence(results).items()):
        evidence = {
            k: ms for k, ms in per_port.items() if k in population and ms[0].score >= MEMBER_SCORE
        }
        n = len(evidence)
        if n < 2:
            continue
        scores = [ms[0].score for ms in evidence.values()]
        for leaf, ports in sorted(by_leaf.items()):
            hit = sorted((k for k in ports if k in evidence), key=lambda k: -evidence[k][0].score)
            nodes = {k[0] for k in hit}
            if len(hit) < 2 or len(nodes) < 2:
                continue
            # the leaf's ports from the strongest down, each crowd against the job's ports
            # erring at least as strongly (crowd.py); none standing out alone: the
            # stricter bar
            test = leaf_scan(
                [(evidence[k][0].score, k[0]) for k in hit], len(ports), scores, len(population)
            )
            if test is None:
                continue
            p_adj = min(1.0, test.p * max(leaves_tested, 1))
            alpha = ALPHA if evidence[hit[0]][0].score >= THRESHOLD else ALPHA_UNSEEN
            if p_adj > alpha:
                continue
            held = "" if alpha == ALPHA else f"; no port stands out alone: held to {alpha:.2g}"
            sw = named.setdefault(leaf, _Named(leaf))
            sw.nodes |= nodes
            top = evidence[hit[0]][0]
            sw.top = max(sw.top, top.score)
            sw.lines.append(
                (
                    top.score + 100.0,
                    f"{KIND[cause]} on {len(hit)} of the job's {len(ports)} ports under it "
                    f"({', '.join(sorted(nodes))}), {test.m} of them scoring "
                    f"{test.weakest:.2f} or more; {test.as_strong} of the job's "
                    f"{len(population)} ports show it as strongly ({n} at all): by chance "
                    f"placement p = {_fmt_p(p_adj)} (hypergeometric, x{test.tried} "
                    f"strengths scanned, x{max(leaves_tested, 1)} leaves"
                    f"{held})",
                )
            )
            for k in hit:
                m = evidence[k][0]
                cable = population[k]
                sw.lines.append(
                    (m.score, f"{k[0]} {k[1]}/{k[2]} (port {cable.switch_port}): {m.text}")
                )
                sw.measurements.append(m)
                for cm in evidence[k]:
                    folded.add((cm.check.cause, *k))
    _group_uplinks(uplink_results, topo, named, extra, periods)
    out = list(extra)
    for sw in named.values():
        lines = [t for _, t in sorted(sw.lines, key=lambda x: -x[0])]
        score = max(THRESHOLD, sw.top) + 0.5 * math.log2(max(len(sw.nodes), 1))
        ms = tuple(sorted(sw.measurements, key=lambda m: -m.score))
        promql, at = _reproduce(ms, periods)
        out.append(
            Finding(
                "switch",
                CAUSES["switch"].title,
                topo.switch_name(sw.guid),
                "",
                round(score, 2),
                tuple(lines),
                promql,
                link,
                measurements=ms,
                promql_at=at,
            )
        )
    return Grouping(tuple(out), frozenset(folded))


def _reproduce(ms: Sequence[Measurement], periods: Periods) -> tuple[str, float]:
    """The strongest measurement's slow-period PromQL and the time it returns its figure."""
    for m in ms:
        _, slow = queries(m)
        if slow is not None:
            return slow.promql, slow.at
    return "", periods.slow_end


def _group_uplinks(
    uplink_results: Sequence[CheckResult],
    topo: Topology,
    named: dict[str, _Named],
    extra: list[Finding],
    periods: Periods,
) -> None:
    """Uplink evidence into spine, leaf or single-cable findings (module docstring, 2)."""
    far_to_near = {far: near for near, far in topo.uplinks.items()}
    best: dict[SwitchPort, list[tuple[Measurement, str]]] = defaultdict(list)
    for r in uplink_results:
        for m in r.measurements:
            if m.score < MEMBER_SCORE:
                continue
            at = (m.labels.get("switch_guid", ""), m.labels.get("switch_port", ""))
            if at in topo.uplinks:
                best[at].append((m, "leaf end"))
            elif at in far_to_near:
                best[far_to_near[at]].append((m, "far end"))
    if not best:
        return
    for ms in best.values():
        ms.sort(key=lambda x: -x[0].score)
    by_spine: dict[str, list[SwitchPort]] = defaultdict(list)
    for near, far in topo.uplinks.items():
        by_spine[far[0]].append(near)
    spines_tested = sum(1 for ups in by_spine.values() if len(ups) >= 2)
    taken: set[SwitchPort] = set()
    for spine, ups in sorted(by_spine.items()):
        hit = [u for u in ups if u in best]
        leaves = {u[0] for u in hit}
        if len(leaves) < 2 or max(best[u][0][0].score for u in hit) < THRESHOLD:
            continue
        others = len(topo.uplinks) - len(ups)
        # the spine's evidence over all its uplinks, each the stronger end of its cable,
        # against how strongly the job's uplinks to the other spines err (crowd.py)
        test = spine_scan(
            [(best[u][0][0].score, u[0]) for u in hit],
            len(ups),
            [ms[0][0].score for u, ms in best.items() if u not in hit],
            others,
        )
        if test is None:
            continue
        p_adj = min(1.0, test.p * max(spines_tested, 1))
        if p_adj > ALPHA:
            continue
        sw = named.setdefault(spine, _Named(spine))
        sw.nodes |= leaves
        sw.top = max(sw.top, *(best[u][0][0].score for u in hit))
        sw.lines.append(
            (
                sw.top + 100.0,
                f"{len(hit)} of the job's leaves' {len(ups)} uplinks to it, from "
                f"{len(leaves)} leaves, show faults, {len(best) - len(hit)} of their "
                f"{others} uplinks to other spines do; {test.m} of its uplinks score "
                f"{test.weakest:.2f} or more, {test.others_as_strong} to other spines do: "
                f"as independent cable faults p = {_fmt_p(p_adj)} (binomial, each uplink "
                f"erring that strongly with q = {test.q:.2g}, x{test.tried} strengths "
                f"scanned, x{max(spines_tested, 1)} spines)",
            )
        )
        for u in hit:
            sw.lines += [(m.score, _uplink_line(topo, u, m, end)) for m, end in best[u][:2]]
            sw.measurements += [m for m, _ in best[u][:2]]
        taken |= set(hit)
    by_leaf: dict[str, list[SwitchPort]] = defaultdict(list)
    for u in best:
        if u not in taken and best[u][0][0].score >= THRESHOLD:
            by_leaf[u[0]].append(u)
    for leaf, ups in sorted(by_leaf.items()):
        if len(ups) >= 2:
            sw = named.setdefault(leaf, _Named(leaf))
            sw.top = max(sw.top, *(best[u][0][0].score for u in ups))
            sw.lines.append(
                (
                    sw.top + 100.0,
                    f"{len(ups)} of its uplinks show faults (at either end of the cable)",
                )
            )
            for u in sorted(ups):
                sw.lines += [(m.score, _uplink_line(topo, u, m, end)) for m, end in best[u][:2]]
                sw.measurements += [m for m, _ in best[u][:2]]
            continue
        u = ups[0]
        far = topo.uplinks[u]
        top = best[u][0][0]
        shown = tuple(m for m, _ in best[u])
        promql, when = _reproduce(shown, periods)
        extra.append(
            Finding(
                "switch",
                UPLINK_CABLE_TITLE,
                f"uplink cable {topo.short(u[0])} port {u[1]} <-> {topo.short(far[0])} "
                f"port {far[1]}",
                "",
                round(top.score, 2),
                tuple(_uplink_line(topo, u, m, end) for m, end in best[u]),
                promql,
                "",
                measurements=shown,
                promql_at=when,
            )
        )


def _uplink_line(topo: Topology, u: SwitchPort, m: Measurement, end: str) -> str:
    far = topo.uplinks[u]
    return (
        f"uplink {topo.short(u[0])} port {u[1]} -> {topo.short(far[0])} port {far[1]}, "
        f"{end}: {m.text}"
    )


def without(
    results: Sequence[CheckResult], folded: frozenset[tuple[str, str, str, str]]
) -> list[CheckResult]:
    """``results`` less the measurements a switch finding names (its folded ports)."""
    if not folded:
        return list(results)
    out = []
    for r in results:
        kept = [
            m
            for m in r.measurements
            if (
                r.check.cause,
                m.labels.get("instance", ""),
                m.labels.get("device", ""),
                m.labels.get("port", ""),
            )
            not in folded
        ]
        out.append(replace(r, measurements=kept) if len(kept) != len(r.measurements) else r)
    return out
