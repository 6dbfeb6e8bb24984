"""The throughput drop detector: table tests on series shaped like real training logs
(noise, checkpoint dips, missing points)."""

from __future__ import annotations

import math
import random

import pytest

from exporter.explain.changepoint import find_drop


def series(levels: list[tuple[int, float]], noise: float = 0.01, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [lvl * (1 + rng.gauss(0, noise)) for n, lvl in levels for _ in range(n)]


def test_finds_a_drop_at_the_right_point_despite_outliers() -> None:
    y = series([(300, 55803.1), (180, 36769.7)])
    for i in range(0, 480, 120):  # checkpoint dips to 60 %, before and after the drop
        y[i] *= 0.6
    y[305] = 0.0  # one broken reading
    shift = find_drop([float(i) for i in range(len(y))], y)
    assert shift is not None
    assert shift.index == 300 and shift.at == 300.0
    assert shift.drop_ratio == pytest.approx(0.341, abs=0.01)
    assert shift.score > 20


@pytest.mark.parametrize(
    ("levels", "why"),
    [
        ([(480, 55803.1)], "flat"),
        ([(240, 36769.7), (240, 55803.1)], "a rise is not a drop"),
        ([(240, 55803.1), (240, 55803.1 * 0.97)], "3 % is under the 5 % floor"),
        ([(6, 100.0), (3, 50.0)], "too short to split"),
    ],
)
def test_no_drop(levels: list[tuple[int, float]], why: str) -> None:
    y = series(levels)
    assert find_drop([float(i) for i in range(len(y))], y) is None, why


def test_noise_bigger_than_the_step_is_not_a_drop() -> None:
    y = series([(240, 100.0), (240, 94.0)], noise=0.3)
    assert find_drop([float(i) for i in range(len(y))], y) is None


def test_missing_points_are_skipped() -> None:
    y = series([(100, 10.0), (100, 5.0)])
    y[50] = math.nan
    y[150] = math.inf
    shift = find_drop([float(i) for i in range(len(y))], y)
    assert shift is not None and shift.at == 100.0
