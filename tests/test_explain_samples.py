"""``bench/explain_samples.py`` sums Prometheus's own query log (tests/fixtures/
prometheus-query-log: two explain runs, recorded) by source, family and range function, and
passes over lines that are not a query entry instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import explain_samples as es
from bench.explain_query_shapes import last_run_entries

LOG = Path(__file__).parent / "fixtures" / "prometheus-query-log" / "explain-1024-excerpt.jsonl"


def test_the_last_runs_samples_by_source_family_and_function() -> None:
    entries, bad = last_run_entries(LOG)
    assert bad == 0
    got = es.summarise(entries)
    # the recorded run: the job's throughput (246,784 samples, a query_range of the plain
    # gauge) and one check's two periods, whose switch-end series the TSDB does not hold
    assert got["queries"] == 3 and got["samples"] == 246_784
    assert [(r["name"], r["queries"], r["samples"]) for r in got["by_source"]] == [
        ("throughput", 1, 246_784),
        ("infiniband", 2, 0),
    ]
    functions = {r["name"]: r["queries"] for r in got["by_function"]}
    assert functions == {"(instant)": 1, "last_over_time+rate": 2}
    assert got["by_family"][0]["share"] == 1.0


def test_families_past_the_top_are_one_row() -> None:
    entries, _ = last_run_entries(LOG)
    got = es.summarise(entries, top=1)
    assert [r["name"] for r in got["by_family"]] == [
        "fabricscope_throughput_tokens_per_second",
        "(1 more families)",
    ]
    assert sum(r["queries"] for r in got["by_family"]) == 3


def test_lines_that_are_not_query_entries_are_passed_over_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = LOG.read_text().splitlines()
    hostile = [
        lines[1][: len(lines[1]) // 2],  # cut short: Prometheus stopped mid-write
        "null",
        json.dumps({"params": {"query": "up"}}),  # no httpRequest
        json.dumps({"httpRequest": {"path": "/api/v1/query"}, "params": {}}),  # no query
        "\xff\xfe not JSON",
        json.dumps({"httpRequest": {"path": 7}, "params": {"query": "up"}}),  # path not text
        json.dumps({"httpRequest": "/api/v1/query", "params": {"query": "up"}}),  # no object
    ]
    log = tmp_path / "queries.jsonl"
    log.write_text("\n".join([*hostile, *lines, lines[-1][:40]]) + "\n")
    out = tmp_path / "samples.json"
    assert es.main(["--query-log", str(log), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["lines_passed_over"] == 8
    assert got["samples"] == 246_784
    assert "8 lines of the log were not a query entry" in capsys.readouterr().out


def test_a_missing_log_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert es.main(["--query-log", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read" in err
