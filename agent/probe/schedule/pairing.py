"""Coordinator-free pairing schedule for cross-node probes that also localises faults.

Every agent computes the same schedule from inputs every agent has, so nothing coordinates:
the sorted member list and the round number (the plain circle schedule,
:mod:`agent.probe.schedule.circle`) and, for localisation, the shared observations (judged
by :mod:`agent.probe.schedule.localise`).

The schedule uses that evidence (:func:`plan_round`): nodes whose newest unexplained
outcome is a failure (suspects) meet a known-good partner they have not failed with (their
circle partner when it qualifies, else a referee chosen in a per-round order every agent
derives from a hash of the round and the name), so the two ends of a failing pair are tested
with distinct good nodes in the same round; a failing pair whose ends both passed since is
retested directly; a confirmed bad link is retested often enough to stay in the evidence
window. Everyone else keeps the circle; partners displaced by those pairs meet each other.
Round ``r`` is planned from rounds ``<= r - 1 - settle_rounds`` only, so a result still being
published when a round starts cannot make two agents plan different rounds; a retest is
planned once, not again in the rounds whose planners cannot see its result yet.

Limits: a bad link is first exercised when the circle pairs its ends, once per cycle (up to
N - 1 rounds); the localisation rounds cover the cycle's pairs only approximately (a
displaced pair waits for the next cycle); a membership change reshuffles the circle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from agent.probe.schedule.circle import Pair, circle_partner, members_of, plain_pairs
from agent.probe.schedule.localise import TUNING, Assessment, Outcome, Tuning, assess

__all__ = ["pairs_for_round", "partner_of", "plan_round"]


def _ranked_pairs(ms: Sequence[str], ranked: Iterable[tuple[int, int]]) -> tuple[Pair, ...]:
    ordered = sorted((min(i, j), max(i, j)) for i, j in ranked)
    return tuple(Pair(ms[i], ms[j]) for i, j in ordered)


def _referee_key(round_no: int, name: str) -> bytes:
    """A per-round order of referees that every agent computes alike (no global RNG)."""
    return hashlib.blake2b(f"{round_no}\0{name}".encode(), digest_size=8).digest()


def plan_round(assessment: Assessment, round_no: int) -> tuple[Pair, ...]:
    """Round ``round_no``'s disjoint pairs given the evidence in ``assessment``.

    Without suspects or retests this is exactly the circle schedule. Otherwise: retest pairs
    first, then each suspect (in rank order) keeps its circle partner if that partner is good
    and new to it, else takes the first free good referee it has not failed with, in the
    round's referee order; the nodes left without their circle partner meet each other in
    rank order (an odd one out sits out). Ordered by host rank.
    """
    ms = assessment.members
    n = len(ms)
    if n < 2:
        return ()
    if not assessment.suspects and not assessment.retests:
        return plain_pairs(ms, round_no)
    rank = {m: i for i, m in enumerate(ms)}
    base = [circle_partner(i, n, round_no) for i in range(n)]
    taken = [False] * n
    chosen: list[tuple[int, int]] = []

    def take(i: int, j: int) -> None:
        taken[i] = taken[j] = True
        chosen.append((i, j))

    for a, b in assessment.retests:
        i, j = rank[a], rank[b]
        if not taken[i] and not taken[j]:
            take(i, j)

    good = assessment.good
    referees: list[int] | None = None
    for s in assessment.suspects:
        si = rank[s]
        if taken[si]:
            continue
        avoid = assessment.failed_with.get(s, frozenset())

        def fits(j: int, s: str = s, avoid: frozenset[str] = avoid) -> bool:
            name = ms[j]
            return (
                not taken[j]
                and name in good
                and name not in avoid
                and frozenset((s, name)) not in assessment.bad_link_pairs
            )

        q = base[si]
        if q >= 0 and fits(q):
            take(si, q)
            continue
        if referees is None:
            referees = sorted((rank[g] for g in good), key=lambda j: _referee_key(round_no, ms[j]))
        for j in referees:
            if j != si and fits(j):
                take(si, j)
                break

    orphans: list[int] = []
    for i in range(n):
        if taken[i]:
            continue
        j = base[i]
        if j < 0 or taken[j]:
            orphans.append(i)
        elif i < j:
            chosen.append((i, j))
    for k in range(0, len(orphans) - 1, 2):
        chosen.append((orphans[k], orphans[k + 1]))
    return _ranked_pairs(ms, chosen)


def pairs_for_round(
    members: Sequence[str],
    round_no: int,
    observations: Iterable[Outcome] | None = None,
    *,
    tuning: Tuning = TUNING,
) -> tuple[Pair, ...]:
    """The disjoint pairs of ``round_no``: the circle schedule, or, given the shared
    observations, the schedule that also localises faults (planned from rounds
    ``<= round_no - 1 - tuning.settle_rounds``)."""
    if observations is None:
        return plain_pairs(members, round_no)
    upto = round_no - 1 - tuning.settle_rounds
    return plan_round(assess(members, observations, upto=upto, tuning=tuning), round_no)


def partner_of(
    me: str,
    members: Sequence[str],
    round_no: int,
    observations: Iterable[Outcome] | None = None,
    *,
    tuning: Tuning = TUNING,
) -> Pair | None:
    """``me``'s pair in ``round_no``, or None when ``me`` sits out."""
    ms = members_of(members)
    if me not in ms:
        raise ValueError(f"{me!r} is not a member")
    if observations is None:
        n = len(ms)
        if n < 2:
            return None
        i = ms.index(me)
        j = circle_partner(i, n, round_no)
        if j < 0:
            return None
        return Pair(ms[min(i, j)], ms[max(i, j)])
    for p in pairs_for_round(ms, round_no, observations, tuning=tuning):
        if me in (p.host, p.guest):
            return p
    return None
