"""Uplink evidence held to its counting noise (judge.counting_only): a steady trickle on an
uplink is not a cable fault, a real rise still is. The trickle is the one the accuracy
benchmark's stronger background (--trickle 2) turned into a false cause: 1.18 -> 2.25/min."""

from __future__ import annotations

from exporter.explain.client import Sample
from exporter.explain.evidence import Window, compare
from exporter.explain.judge import counting_only
from exporter.explain.switches import UPLINK_CHECKS

SYMBOLS = UPLINK_CHECKS[0]
LABELS = {"switch_guid": "0xf452140300aa0001", "switch_port": "37"}
BASE = Window(1200.0, 10_000.0)
SLOW = Window(900.0, 10_900.0)


def _scored(base_per_min: float, slow_per_min: float) -> tuple[float, float]:
    result = compare(
        SYMBOLS,
        [Sample(LABELS, base_per_min / 60)],
        [Sample(LABELS, slow_per_min / 60)],
        SLOW.seconds / BASE.seconds,
        base_window=BASE,
        slow_window=SLOW,
    )
    (held,) = counting_only([result])
    return result.measurements[0].score, held.measurements[0].score


def test_a_steady_trickle_on_an_uplink_does_not_stand_out() -> None:
    alone, held = _scored(1.18, 2.25)
    assert alone >= 1.0  # against its significance level alone it stood out
    assert held < 1.0  # a rate of ~1.2/min counts this much more by chance


def test_a_real_rise_on_an_uplink_still_stands_out() -> None:
    alone, held = _scored(0.24, 30.0)
    assert held >= 4.0
    assert held == alone  # the significance level, not the noise, sets its bar


def test_non_counting_uplink_checks_and_quiet_ports_are_left_alone() -> None:
    share = UPLINK_CHECKS[-1]
    assert not share.counting
    result = compare(share, [Sample(LABELS, 0.01)], [Sample(LABELS, 0.4)], 0.75)
    assert counting_only([result])[0].measurements == result.measurements
    quiet = compare(SYMBOLS, [Sample(LABELS, 0.0)], [Sample(LABELS, 0.0)], 0.75)
    assert counting_only([quiet])[0].measurements == quiet.measurements
