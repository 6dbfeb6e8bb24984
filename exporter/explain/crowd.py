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
spine. Imports nothing of the explain package.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def spine_scan(
    hits: Sequence[tuple[float, str]], uplinks: int, others: Sequence[float], other_count: int
) -> SpineTest | None:
    """The spine test (module docstring). ``hits``: (score, leaf) of the spine's erring
    uplinks; ``uplinks``: all the job's uplinks to it; ``others``: the scores of the erring
    uplinks to other spines, of ``other_count`` uplinks to them. None when no ``m`` of two
    or more spans two leaves."""
    ranked = sorted(hits, key=lambda h: -h[0])
    candidates = [
        m for m in range(2, len(ranked) + 1) if len({leaf for _, leaf in ranked[:m]}) >= 2
    ]
    if not candidates:
        return None
    best: SpineTest | None = None
    for m in candidates:
        weakest = ranked[m - 1][0]
        strong = sum(1 for o in others if o >= weakest)
        q = chance_of(strong, other_count)
        p = binomial_tail(m, uplinks, q)
        if best is None or p < best.p:
            best = SpineTest(p, m, weakest, q, strong, len(candidates))
    assert best is not None
    return SpineTest(
        min(1.0, best.p * len(candidates)),
        best.m,
        best.weakest,
        best.q,
        best.others_as_strong,
        best.tried,
    )
