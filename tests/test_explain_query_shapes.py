"""``bench/explain_query_shapes.py`` reads Prometheus's own query log as Prometheus writes
it (tests/fixtures/prometheus-query-log: two explain runs, recorded) and pairs a check's
baseline and slow-period instant queries into one range query of two steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import explain_query_shapes as qs

LOG = Path(__file__).parent / "fixtures" / "prometheus-query-log" / "explain-1024-excerpt.jsonl"


def test_the_last_run_is_read_without_the_benchmarks_own_count() -> None:
    asked = qs.last_run(LOG)
    assert [e for e, _ in asked] == ["query_range", "query", "query"]
    assert not any(p["query"].startswith("count(") for _, p in asked)
    # the second run's three: the first run's unrelated query is not in it
    assert not any("nccl_env" in p["query"] for _, p in asked)


def test_a_checks_two_periods_become_one_range_query_of_two_steps() -> None:
    as_asked, one_range, pairs = qs.shapes(qs.last_run(LOG))
    assert pairs == 1
    assert [e for e, _ in as_asked] == ["query_range", "query", "query"]
    assert [e for e, _ in one_range] == ["query_range", "query_range"]
    assert one_range[0] == as_asked[0]  # what is not a pair is asked as logged
    _, merged = one_range[1]
    base, slow = (p for e, p in as_asked[1:])
    # both periods over the longer window, at the baseline's end and the slow period's end
    assert "[1995s]" in merged["query"] and "[1590s]" not in merged["query"]
    assert merged["query"] == base["query"]
    assert merged["start"] == base["time"] and merged["end"] == slow["time"]
    assert float(merged["step"]) == pytest.approx(float(slow["time"]) - float(base["time"]))
    assert float(merged["step"]) == 1605.0  # 03:33:15 to 04:00:00


def test_an_empty_log_is_one_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "queries.jsonl"
    empty.write_text("\n")
    with pytest.raises(SystemExit, match="no query logged"):
        qs.last_run(empty)
