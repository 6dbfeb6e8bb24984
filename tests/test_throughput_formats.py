"""Table tests for the throughput parsers (agent/throughput/formats.py) on real log lines
(tests/fixtures/throughput-logs, PROVENANCE.md there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.throughput.formats import Reading, parse_line

LOGS = Path(__file__).parent / "fixtures" / "throughput-logs"


def latest(path: Path) -> dict[str, tuple[str, float]]:
    """Field -> (format, latest value) after parsing every line of a fixture log."""
    out: dict[str, tuple[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        r = parse_line(line)
        if r is not None:
            for name, v in r.values():
                out[name] = (r.format, v)
    return out


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "\t Train throughput/tokens_per_sec: 222.2194",
            Reading("composer", tokens_per_second=222.2194),
        ),
        (
            "         Train throughput/samples_per_sec: 2.7330",
            Reading("composer", samples_per_second=2.733),
        ),
        (
            "         Train throughput/batches_per_sec: 0.0027",
            Reading("composer", iterations_per_second=0.0027),
        ),
        ("         Train throughput/device/tokens_per_sec: 1255.1776", None),
        ("         Train time/token: 29254495", None),
    ],
)
def test_composer_lines(line: str, expected: Reading | None) -> None:
    assert parse_line(line) == expected


def test_composer_logs() -> None:
    assert latest(LOGS / "composer" / "rocm-mpt30b-2node.log") == {
        "tokens_per_second": ("composer", 20082.8418),
        "samples_per_second": ("composer", 2.733),
        "iterations_per_second": ("composer", 0.0027),
    }
    assert latest(LOGS / "composer" / "moe-wandb-batch20.log")["tokens_per_second"] == (
        "composer",
        222.2194,
    )
