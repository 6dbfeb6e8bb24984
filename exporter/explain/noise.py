"""How far a check's figures move when nothing changed: coverage, spread and counting noise.

A check compares one figure over the baseline with the same figure over the slow period.
Two things make that comparison lie when nothing changed, and this module measures both
from the series itself, for every check alike:

* **Coverage.** ``rate()`` over a period that a series covers only in part divides the
  counts of the covered part by the whole period (a baseline whose series began 2 minutes
  before its end reads a seventh of the truth over 14 minutes). The period is cut into
  *tiles* of equal length; the share of tiles where the check's own expression has a value
  is the period's coverage, and the first and last such tiles bound the part of the period
  the figure is taken over. A period covered less than :data:`MIN_COVERAGE` is not scored.
* **Noise.** Each check's change is held to the spread of the same expression over the
  tiles of its own baseline: ``noise`` is the standard deviation of the baseline's tile
  values, a tile being shorter than the period, so a figure over the whole period wanders
  less than that. For event counters (``Check.counts``) the counting noise of both periods
  under the baseline's rate, Poisson (variance = the count), is added in quadrature. A
  rate's baseline count is taken at the upper end of its one-sigma Poisson interval
  (:func:`poisson_upper`), never at the count itself: a trickle seen 0 times in a short
  baseline has not shown a rate of 0, and 0 then 1 is what such a trickle does by chance
  (a rate of 0.5/min counts 0 in 52 s and 1 or more in the next 67 s in about a quarter
  of windows). The
  change scores against ``max(significant, Z * noise)`` (:data:`Z`): a series that did
  not change stays below 1 whatever its level, and a change that clears both its
  significance level and its series' own noise scores as before.

Pure functions: :mod:`exporter.explain.judge` queries the tiles and applies them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: a change must exceed this many standard deviations of its own noise to score its
#: significance level (the tile spread is itself an over-estimate of a period's noise)
Z = 3.0
#: a period whose series has a value in fewer of its tiles is not scored
MIN_COVERAGE = 0.25
#: tiles a period is cut into at most (fewer when the scrape interval forbids)
TILES = 12
#: a tile spans at least this many scrape intervals, so rate() finds two samples in it
MIN_SAMPLES_PER_TILE = 2.5


def tile_seconds(period: float, interval: float) -> float:
    """The tile length for a period of ``period`` seconds scraped every ``interval``: the
    period cut in :data:`TILES`, but never shorter than :data:`MIN_SAMPLES_PER_TILE`
    scrape intervals (then fewer tiles), whole seconds."""
    shortest = MIN_SAMPLES_PER_TILE * max(interval, 1.0)
    return float(max(1, math.ceil(max(period / TILES, shortest))))


@dataclass(frozen=True, slots=True)
class Tiles:
    """One device's tile values in one period: ``(tile end, value)`` of the tiles that lie
    inside the period, ``None`` where the expression had no value; ``seconds`` each."""

    seconds: float
    values: tuple[tuple[float, float | None], ...]

    @property
    def coverage(self) -> float:
        """The share of the period's tiles where the series has a value (0 without tiles)."""
        if not self.values:
            return 0.0
        return sum(1 for _, v in self.values if v is not None) / len(self.values)

    @property
    def span(self) -> tuple[float, float] | None:
        """(start, end) from the first tile with a value to the last; None when none."""
        present = [t for t, v in self.values if v is not None]
        if not present:
            return None
        return present[0] - self.seconds, present[-1]

    @property
    def spread(self) -> float | None:
        """The standard deviation of the values (None with fewer than two)."""
        vals = [v for _, v in self.values if v is not None]
        if len(vals) < 2:
            return None
        return statistics.stdev(vals)


def poisson_upper(count: float) -> float:
    """The upper end of the one-sigma (84 %) Poisson interval of a count ``count``
    (Gehrels 1986: ``n + sqrt(n + 3/4) + 1``, within a few per cent of the exact bound;
    1.87 at 0, where the exact is 1.84)."""
    n = max(count, 0.0)
    return n + math.sqrt(n + 0.75) + 1.0


def poisson_rate_sigma(base_rate: float, base_seconds: float, slow_seconds: float) -> float:
    """The standard deviation of (slow rate - baseline rate) for events counted at the
    baseline's rate in both periods (the counts' variance is the count), the baseline's
    count taken at :func:`poisson_upper` (so a count of 0 still allows a trickle)."""
    bw = max(base_seconds, 1.0)
    rate = poisson_upper(max(base_rate, 0.0) * bw) / bw
    return math.sqrt(rate / bw + rate / max(slow_seconds, 1.0))


def poisson_events_sigma(base_count: float, ratio: float) -> float:
    """The standard deviation of (slow count - baseline count x ``ratio``) when the slow
    period, ``ratio`` times the baseline's length, counts events at the baseline's rate."""
    n = max(base_count, 0.0)
    return math.sqrt(n * ratio + n * ratio * ratio)


def combine(*sigmas: float | None) -> float:
    """Independent noise sources added in quadrature (absent ones left out)."""
    return math.sqrt(sum(s * s for s in sigmas if s is not None))


def bar(significant: float, sigma: float) -> float:
    """The change that scores 1.0: the significance level, or ``Z`` noise if larger."""
    return max(significant, Z * sigma)


def score(change: float, significant: float, sigma: float = 0.0) -> float:
    """``log2(1 + change / bar)``; 0 when the change is not positive (or not a number)."""
    if not math.isfinite(change) or change <= 0:
        return 0.0
    return math.log2(1.0 + change / bar(significant, sigma))


def values_spread(values: Sequence[float]) -> float:
    """The standard deviation of ``values`` (0 with fewer than two)."""
    return statistics.stdev(values) if len(values) >= 2 else 0.0
