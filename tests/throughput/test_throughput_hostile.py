"""Hostile lines against every throughput parser: parse time must be linear in the line.

Each case is text crafted against one pattern (the 60,000-digit ``time`` of the issue that
froze the agent, runs of separators a backtracking engine would try every split of, many
partial matches, a progress bar of carriage returns, a tenant's catastrophic regex). Every
built-in parser is called directly, *without* the per-line cap :func:`parse_line` applies,
at 1 KB, 10 KB, 100 KB and 1 MB: the test fails when the time per byte at 1 MB is more
than a few times that at 10 KB (quadratic growth gives 100x), or when 1 MB takes more than
half a second. With Python's ``re`` the nanogpt case alone took 0.29 s at 2,000 digits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agent.throughput.formats import (
    MAX_PARSE_CHARS,
    Reading,
    compile_custom,
    parse_composer,
    parse_custom,
    parse_deepspeed,
    parse_hf_trainer,
    parse_lightning,
    parse_line,
    parse_megatron,
    parse_nanogpt,
    parse_torchtitan,
    parse_window,
)

SIZES = (1_000, 10_000, 100_000, 1_000_000)
#: allowed growth of the time per byte from 10 KB to 1 MB (linear: ~1; quadratic: ~100)
MAX_GROWTH = 6.0
#: a 1 MB hostile line, whatever the parser
MAX_SECONDS_PER_MB = 0.5


def fill(head: str, unit: str, tail: str, size: int) -> str:
    body = size - len(head) - len(tail)
    return head + (unit * (body // len(unit) + 1))[: max(body, 0)] + tail


CATASTROPHIC = compile_custom(r"^(?:a+)+(?P<tokens_per_second>\d+)$")
CUSTOM_SUFFIX = compile_custom(r"(?P<step_seconds>\d+(?:\.\d+)?)ms")

# (name, parser, line of a given size)
CASES: list[tuple[str, Callable[[str], Reading | None], Callable[[int], str]]] = [
    (
        "nanogpt iter: 60,000-digit time without 'ms'",
        parse_nanogpt,
        lambda n: fill("iter 1: loss x, time ", "1", "", n),
    ),
    (
        "nanogpt iter: loss without comma",
        parse_nanogpt,
        lambda n: fill("iter 1: loss ", "x", "", n),
    ),
    (
        "modded-nanogpt: step_avg digits without 'ms'",
        parse_nanogpt,
        lambda n: fill("step:1/2 train_time:1ms step_avg:", "9", "", n),
    ),
    (
        "modded-nanogpt: repeated step_avg",
        parse_nanogpt,
        lambda n: fill("step:1/2 ", "step_avg:1", "", n),
    ),
    ("llm.c: pipes and ms", parse_nanogpt, lambda n: fill("step 1/2 |", "| 1 ms |", "", n)),
    (
        "composer: digits and commas",
        parse_composer,
        lambda n: fill("Train throughput/tokens_per_sec: ", "1,", "", n),
    ),
    (
        "composer: many partial keys",
        parse_composer,
        lambda n: fill("", "Train throughput/x", "", n),
    ),
    (
        "composer: many matches",
        parse_composer,
        lambda n: fill("", " Train throughput/tokens_per_sec: 1", "", n),
    ),
    (
        "megatron: digits with commas and dots",
        parse_megatron,
        lambda n: fill("elapsed time per iteration (ms): ", "1,1.", "", n),
    ),
    (
        "megatron: exponent-looking run",
        parse_megatron,
        lambda n: fill("elapsed time per iteration (ms): 1", "e1", "", n),
    ),
    ("deepspeed: commas", parse_deepspeed, lambda n: fill("CurrSamplesPerSec=", "1,", "", n)),
    ("deepspeed: spaces", parse_deepspeed, lambda n: fill("samples/sec:", " ", "x", n)),
    (
        "torchtitan: mfu without percent",
        parse_torchtitan,
        lambda n: fill("tps: 1 mfu: ", "1", "", n),
    ),
    ("torchtitan: spaces", parse_torchtitan, lambda n: fill("tps:", " ", "x", n)),
    (
        "hf_trainer: dict digits",
        parse_hf_trainer,
        lambda n: fill("{'train_samples_per_second': ", "1", "", n),
    ),
    ("hf_trainer: tqdm digits without unit", parse_hf_trainer, lambda n: fill("", "1", " it/", n)),
    ("hf_trainer: tqdm dots", parse_hf_trainer, lambda n: fill("s/it ", "1.", "", n)),
    ("hf_trainer: carriage returns", parse_hf_trainer, lambda n: fill("1it/s", "\r", "", n)),
    ("lightning: redraws", parse_lightning, lambda n: fill("Epoch 0: 1it/s", "\r ", "", n)),
    (
        "lightning: digits without unit",
        parse_lightning,
        lambda n: fill("Epoch 0: ", "9", " s/i", n),
    ),
    (
        "custom ^(?:a+)+(?P<...>\\d+)$ (exponential under re)",
        lambda line: parse_custom(CATASTROPHIC, line),
        lambda n: fill("", "a", "!", n),
    ),
    (
        "custom digits then ms, without ms",
        lambda line: parse_custom(CUSTOM_SUFFIX, line),
        lambda n: fill("", "1", "", n),
    ),
]


def best_of(fn: Callable[[], object], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize(("parser", "line_of"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_time_is_linear_in_the_line(
    parser: Callable[[str], Reading | None], line_of: Callable[[int], str]
) -> None:
    per_byte: dict[int, float] = {}
    for size in SIZES:
        line = line_of(size)
        assert len(line) == size
        seconds = best_of(lambda line=line: parser(line))  # type: ignore[misc]
        per_byte[size] = seconds / size
    growth = per_byte[1_000_000] / per_byte[10_000]
    summary = ", ".join(f"{s} B: {per_byte[s] * 1e9:.1f} ns/B" for s in SIZES)
    assert growth < MAX_GROWTH, f"time per byte grew {growth:.1f}x from 10 KB to 1 MB ({summary})"
    assert per_byte[1_000_000] * 1_000_000 < MAX_SECONDS_PER_MB, summary


def test_the_issue_line_is_parsed_in_microseconds_not_minutes() -> None:
    """The line that froze the agent for 3 minutes, through the sampler's entry point."""
    line = "iter 1: loss x, time " + "1" * 60_000
    seconds = best_of(lambda: parse_line(line, CATASTROPHIC))
    assert parse_line(line, CATASTROPHIC) is None
    assert seconds < 0.05


@pytest.mark.parametrize(("parser", "line_of"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_line_looks_at_a_bounded_window(
    parser: Callable[[str], Reading | None], line_of: Callable[[int], str]
) -> None:
    line = line_of(1_000_000)
    window = parse_window(line)
    assert window is None or len(window) <= MAX_PARSE_CHARS
    assert best_of(lambda: parse_line(line, CATASTROPHIC)) < 0.05


def test_window_is_the_latest_redraw_of_a_bar() -> None:
    bar = "\r".join(f"Epoch 0: {i}/9 [00:01<00:02, {i}.00it/s]" for i in range(1, 10))
    assert parse_window(bar) == "Epoch 0: 9/9 [00:01<00:02, 9.00it/s]"
    assert parse_window(bar + "\r   \r") == "Epoch 0: 9/9 [00:01<00:02, 9.00it/s]"
    assert parse_line("x" * 2_000 + "\r" + bar) == Reading(
        "lightning", iterations_per_second=9.0, step_seconds=1 / 9.0
    )
    # a line over the cap is not parsed at all, even if a figure is in its first bytes
    long = "iter 1: loss 1.0, time 12.5ms" + " " * MAX_PARSE_CHARS
    assert parse_window(long) is None
    assert parse_line(long) is None
    assert parse_line(long.rstrip()) is not None
