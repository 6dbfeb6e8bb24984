"""``fabricscope agent --once --throughput.file`` (the Slurm textfile-collector path) reads
the file whole: the value printed is the last line's, whatever the per-stream CPU budget of
a serving agent, and a read that cannot finish within --sampling.timeout says so."""

from __future__ import annotations

import re
from pathlib import Path

from tests.agentrun import throughput_once

LINES = 400_000


def composer_log(path: Path, lines: int) -> None:
    """Composer's console logger, one throughput line per batch (tests/fixtures/throughput-logs
    holds a real one)."""
    with path.open("w") as f:
        for n in range(1, lines + 1):
            f.write(f"\t Train throughput/tokens_per_sec: {n}\n")


def value(text: str, name: str) -> float | None:
    m = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_once_reads_a_400000_line_log_whole(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    composer_log(log, LINES)
    # a budget no pass of this file fits in: a serving agent reads it over many passes
    done = throughput_once(
        [f"{log}=llm"],
        tmp_path,
        "--throughput.stream-cpu-budget=10ms",
        "--sampling.timeout=120s",
    )
    assert done.returncode == 0, done.stderr
    assert value(done.stdout, "fabricscope_throughput_tokens_per_second") == LINES
    assert value(done.stdout, "fabricscope_throughput_lines_parsed_total") == LINES
    assert 'fabricscope_throughput_errors_total{reason="cpu_budget"} 0.0' in done.stdout
    assert "warning" not in done.stderr


def test_once_that_cannot_read_whole_in_time_says_so(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    composer_log(log, LINES)
    done = throughput_once([f"{log}=llm"], tmp_path, "--sampling.timeout=2s")
    assert done.returncode == 0, done.stderr
    assert value(done.stdout, "fabricscope_throughput_tokens_per_second") is None  # not stale
    assert "not read whole within --sampling.timeout (2s)" in done.stderr
