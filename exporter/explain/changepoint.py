"""When did the job's throughput drop? A robust single median-shift detector.

The split ``k`` of the series ``y`` is the one that minimises the L1 cost of two segments,
``sum |y[:k] - median(y[:k])| + sum |y[k:] - median(y[k:])|`` (a least-absolute-deviation
change point, the ``l1`` cost of the ``ruptures`` library, in a few lines). At that split
the drop of the median is scaled by the pooled median absolute deviation (MAD x 1.4826, a
robust standard deviation) of the two segments; it is reported when it is both large
against the noise (``min_score`` robust standard deviations) and large in itself
(``min_drop`` of the baseline median), and only downwards. Medians and MADs ignore
outliers such as one slow step at a checkpoint, which a mean-based CUSUM would not; one
shift is what an SRE asks about ("since when is it slow?"). Candidates are first taken on
a stride (at most ``COARSE`` of them) and then refined at full resolution around the best
one, so a 6-hour series at 15 s costs tens of milliseconds. Pure Python: no numpy on the
query path.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MAD_TO_SIGMA = 1.4826
COARSE = 160


@dataclass(frozen=True, slots=True)
class Shift:
    """A drop: ``at`` is the time of the first slow point (``index`` into the series)."""

    index: int
    at: float
    before: float  # median of the baseline segment
    after: float  # median of the slow segment
    drop_ratio: float  # (before - after) / before
    score: float  # (before - after) / pooled robust sigma


def _mad(values: Sequence[float], median: float) -> float:
    return statistics.median([abs(v - median) for v in values])


def _cost(y: Sequence[float], k: int) -> float:
    a, b = y[:k], y[k:]
    ma, mb = statistics.median(a), statistics.median(b)
    return sum(abs(v - ma) for v in a) + sum(abs(v - mb) for v in b)


def _stat(y: Sequence[float], k: int) -> tuple[float, float, float]:
    a, b = y[:k], y[k:]
    ma, mb = statistics.median(a), statistics.median(b)
    pooled = (len(a) * _mad(a, ma) + len(b) * _mad(b, mb)) / len(y)
    # a floor keeps a perfectly flat series from dividing by zero: 0.1 % of the level
    sigma = max(MAD_TO_SIGMA * pooled, 1e-3 * max(abs(ma), abs(mb)), 1e-12)
    return (ma - mb) / sigma, ma, mb


def find_drop(
    times: Sequence[float],
    values: Sequence[float],
    *,
    min_segment: int = 5,
    min_drop: float = 0.05,
    min_score: float = 4.0,
) -> Shift | None:
    """The most significant downward median shift, or None when there is none."""
    pairs = [(t, v) for t, v in zip(times, values, strict=True) if math.isfinite(v)]
    n = len(pairs)
    if n < 2 * min_segment:
        return None
    y = [v for _, v in pairs]
    lo, hi = min_segment, n - min_segment
    stride = max(1, (hi - lo) // COARSE)
    best_k, best = lo, math.inf
    for k in range(lo, hi + 1, stride):
        c = _cost(y, k)
        if c < best:
            best_k, best = k, c
    for k in range(max(lo, best_k - stride), min(hi, best_k + stride) + 1):
        c = _cost(y, k)
        if c < best:
            best_k, best = k, c
    score, before, after = _stat(y, best_k)
    if before <= 0:
        return None
    drop = (before - after) / before
    if drop < min_drop or score < min_score:
        return None
    return Shift(best_k, pairs[best_k][0], before, after, drop, score)
