"""The plain pairing schedule for cross-node probes: the round-robin circle method, which
every agent computes alike from the member list, so nothing coordinates.

- the member list is sorted and deduplicated (:func:`members_of`), so every agent ranks
  members the same way;
- the round number is an int every agent derives the same way (``floor(unix_time /
  round_s)``).

With ``m = N - 1`` (N even) or ``m = N`` (N odd), round ``r`` uses ``r mod m``: member
``i < m`` meets ``(2r - i) mod m``; the member that would meet itself meets the last member
(N even) or sits out (N odd, the bye). Every pair meets exactly once in
:func:`full_cycle_rounds` rounds, ``N // 2`` disjoint probes run in parallel per round, and
the lower-ranked member of each pair hosts the rendezvous.

The schedule that also localises faults is :mod:`agent.probe.schedule.pairing`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Pair",
    "circle_partner",
    "full_cycle_rounds",
    "meeting_round",
    "members_of",
    "plain_pairs",
]


@dataclass(frozen=True, slots=True)
class Pair:
    """One probe of a round. ``host`` is the lower-ranked (sorted-first) member and hosts the
    rendezvous; ``guest`` connects to it."""

    host: str
    guest: str

    def __post_init__(self) -> None:
        if not self.host < self.guest:
            raise ValueError(f"pair host {self.host!r} must sort before guest {self.guest!r}")

    def other(self, me: str) -> str:
        """The partner of ``me`` in this pair."""
        if me == self.host:
            return self.guest
        if me == self.guest:
            return self.host
        raise ValueError(f"{me!r} is not in {self}")


def members_of(members: Iterable[str]) -> tuple[str, ...]:
    """The member list every agent ranks the same way: deduplicated, sorted."""
    return tuple(sorted(set(members)))


def full_cycle_rounds(n: int) -> int:
    """Rounds in which the circle method meets every pair of ``n`` members once: n - 1 for
    even n, n for odd n (one bye per round), 0 when there is no pair."""
    if n < 0:
        raise ValueError(f"member count must be >= 0, got {n}")
    if n < 2:
        return 0
    return n - 1 if n % 2 == 0 else n


def circle_partner(i: int, n: int, round_no: int) -> int:
    """Rank of the partner of rank ``i`` among ``n >= 2`` members in ``round_no``; -1 = bye."""
    if n % 2 == 0:
        m = n - 1
        r = round_no % m
        if i == m:
            return r
        j = (2 * r - i) % m
        return m if j == i else j
    r = round_no % n
    j = (2 * r - i) % n
    return -1 if j == i else j


def plain_pairs(members: Sequence[str], round_no: int) -> tuple[Pair, ...]:
    """The circle schedule's pairs of ``round_no``, ordered by host rank."""
    ms = members_of(members)
    n = len(ms)
    if n < 2:
        return ()
    out = []
    for i in range(n):
        j = circle_partner(i, n, round_no)
        if j > i:
            out.append(Pair(ms[i], ms[j]))  # i ascending: ordered by host rank
    return tuple(out)


def meeting_round(members: Sequence[str], a: str, b: str) -> int:
    """The round (0 .. full cycle - 1) in which the circle schedule pairs ``a`` with ``b``."""
    ms = members_of(members)
    rank = {m: i for i, m in enumerate(ms)}
    if a not in rank or b not in rank or a == b:
        raise ValueError(f"{a!r} and {b!r} must be two distinct members")
    i, j = sorted((rank[a], rank[b]))
    n = len(ms)
    m = n - 1 if n % 2 == 0 else n
    if j == m:  # the fixed member of an even circle meets rank r in round r
        return i
    return (i + j) * ((m + 1) // 2) % m  # 2r = i + j (mod m), m odd
