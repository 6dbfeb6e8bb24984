"""Whether the erring uplinks to one spine are one fault or chance: the spine's test.

A spine's evidence is every uplink of the job's leaves that lands on it, each read at both
ends of its cable (the stronger end's score is the cable's: a spine port that corrupts what
it sends shows at the leaf end, one that corrupts what it receives at its own). The
question is whether the uplinks that err there are independent cable faults that happened
to land on one spine. Counting them is not enough: on a large fabric a few erring uplinks
are common (trickles), and two of them share one of ``S`` spines one time in about ``S``,
so a count alone names a spine only when it holds many. What counting ignores is how
strongly each errs: two uplinks to one spine erring at several times the significance,
while none of the job's uplinks to the other spines errs even half as strongly, is not
what a trickle gives.

So the test scans the spine's erring uplinks from the strongest down (:func:`spine_scan`).
For the ``m`` strongest, from at least two leaves, the weakest of them scoring ``s``: the
chance that an uplink errs at least that strongly on its own is ``q(s)``, the share of the
job's uplinks to the *other* spines that do (drawn towards a prior of one in fifty that
weighs as much as ten uplinks seen, :data:`PRIOR_FAULTS` in :data:`PRIOR_UPLINKS`, so a
clean fabric still leaves room for chance); the binomial tail of ``m`` or more of the
spine's ``n`` uplinks doing so is that ``m``'s chance. The smallest over the ``m`` tried,
times the number tried (Bonferroni over the scan), is the spine's p-value; the caller
multiplies it by the spines tested. At ``m`` = all of them and ``s`` = the evidence floor
this is the count-only test; with two erring uplinks it is never less sensitive than it.
A fabric-wide event (every spine's uplinks err as strongly) leaves ``q`` high and names no
spine.

A leaf's ports are tested the same way (:func:`leaf_scan`), with what a leaf has that a
spine has not: the job's ports are many and spread over the leaves by placement, so the
chance of the ``m`` strongest of a leaf's ports erring at least as strongly as the weakest
of them (``s``) is the hypergeometric tail of ``m`` or more of the ``n(s)`` job ports that
do falling under the leaf (:func:`crowding`; exact, conditioned on how many err that
strongly, so no prior is needed), scanned from the strongest down and corrected for the
scan as above. The scan itself (:func:`scan`) is one for both: the strongest ``m`` of a
switch's erring ports or uplinks, for every ``m`` of two or more that spans two of its
nodes or leaves. Imports nothing of the explain package.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: the prior for the chance that one uplink errs on its own in a window: PRIOR_FAULTS
#: erring uplinks in PRIOR_UPLINKS, one in fifty, as much weight as ten uplinks seen
#: (a Beta(0.2, 9.8) prior)
PRIOR_FAULTS = 0.2
PRIOR_UPLINKS = 10.0


def binomial_tail(k: int, n: int, q: float) -> float:
    """``P(X >= k)`` for ``X`` binomial with ``n`` trials of probability ``q``."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) * q**i * (1.0 - q) ** (n - i) for i in range(k, n + 1))


def chance_of(others_hit: int, others: int) -> float:
    """The per-uplink chance ``q``: the posterior mean of the share of the job's ``others``
    uplinks to other spines that err (``others_hit`` of them) under the prior."""
    return min(1.0, (max(others_hit, 0) + PRIOR_FAULTS) / (max(others, 0) + PRIOR_UPLINKS))


@dataclass(frozen=True, slots=True)
class SpineTest:
    """The spine test's answer: ``p`` (Bonferroni over the scan, not over the spines), the
    number ``m`` of strongest uplinks it rests on, the weakest of their scores, the
    per-uplink chance ``q`` of erring that strongly, how many of the other spines' uplinks
    did, and how many ``m`` were tried."""

    p: float
    m: int
    weakest: float
    q: float
    others_as_strong: int
    tried: int


def crowding(k: int, population: int, on_switch: int, evidence: int) -> float:
    """``P(X >= k)`` for ``X`` hypergeometric: ``evidence`` ports drawn at random from
    ``population``, ``on_switch`` of which are under the switch (exact, in integers)."""
    if k <= 0:
        return 1.0
    top = min(on_switch, evidence)
    if k > top:
        return 0.0
    num = sum(
        math.comb(on_switch, i) * math.comb(population - on_switch, evidence - i)
        for i in range(k, top + 1)
    )
    return num / math.comb(population, evidence)


@dataclass(frozen=True, slots=True)
class Scanned:
    """The scan's answer: the smallest chance over the ``m`` tried (not yet corrected), the
    ``m`` it was found at, the weakest score of those ``m`` and how many ``m`` were tried."""

    p: float
    m: int
    weakest: float
    tried: int


def scan(
    hits: Sequence[tuple[float, str]], chance: Callable[[int, float], float]
) -> Scanned | None:
    """The switch's erring ports or uplinks ``hits`` (score, the node or leaf each belongs
    to) from the strongest down: for every ``m`` of two or more whose strongest ``m`` span
    two nodes or leaves, ``chance(m, weakest score of them)``; the smallest. None when no
    ``m`` spans two."""
    ranked = sorted(hits, key=lambda h: -h[0])
    candidates = [m for m in range(2, len(ranked) + 1) if len({who for _, who in ranked[:m]}) >= 2]
    best: Scanned | None = None
    for m in candidates:
        weakest = ranked[m - 1][0]
        p = chance(m, weakest)
        if best is None or p < best.p:
            best = Scanned(p, m, weakest, len(candidates))
    return best


def spine_scan(
    hits: Sequence[tuple[float, str]], uplinks: int, others: Sequence[float], other_count: int
) -> SpineTest | None:
    """The spine test (module docstring). ``hits``: (score, leaf) of the spine's erring
    uplinks; ``uplinks``: all the job's uplinks to it; ``others``: the scores of the erring
    uplinks to other spines, of ``other_count`` uplinks to them. None when no ``m`` of two
    or more spans two leaves."""

    def as_strong(s: float) -> int:
        return sum(1 for o in others if o >= s)

    found = scan(hits, lambda m, s: binomial_tail(m, uplinks, chance_of(as_strong(s), other_count)))
    if found is None:
        return None
    strong = as_strong(found.weakest)
    return SpineTest(
        min(1.0, found.p * found.tried),
        found.m,
        found.weakest,
        chance_of(strong, other_count),
        strong,
        found.tried,
    )


@dataclass(frozen=True, slots=True)
class LeafTest:
    """The leaf test's answer: ``p`` (Bonferroni over the scan, not over the leaves), the
    number ``m`` of the leaf's strongest ports it rests on, the weakest of their scores, how
    many of the job's ports err at least that strongly, and how many ``m`` were tried."""

    p: float
    m: int
    weakest: float
    as_strong: int
    tried: int


def leaf_scan(
    hits: Sequence[tuple[float, str]], ports: int, scores: Sequence[float], population: int
) -> LeafTest | None:
    """The leaf test (module docstring). ``hits``: (score, node) of the leaf's evidence
    ports; ``ports``: the job's ports under it; ``scores``: the scores of all the job's
    evidence ports (the leaf's included), of ``population`` ports on known leaves. None
    when no ``m`` of two or more spans two nodes."""

    def as_strong(s: float) -> int:
        return sum(1 for o in scores if o >= s)

    found = scan(hits, lambda m, s: crowding(m, population, ports, as_strong(s)))
    if found is None:
        return None
    return LeafTest(
        min(1.0, found.p * found.tried),
        found.m,
        found.weakest,
        as_strong(found.weakest),
        found.tried,
    )
