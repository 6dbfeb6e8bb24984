"""The reproducibility checks the explain labs run: every figure of every cause's evidence,
its PromQL run as an instant query at its time, returns the figure; in the JSON's terms
(the report's measurements) and as the text output prints it (each ``promql:`` line)."""

from __future__ import annotations

import calendar
import re
import time

import pytest

from exporter.explain.client import PrometheusClient
from exporter.explain.evidence import key, queries
from exporter.explain.report import Report


def assert_every_figure_reproduces(client: PrometheusClient, report: Report) -> int:
    """Asserts each available figure (baseline and slow) within 5 %; returns how many."""
    checked = 0
    for f in report.causes:
        for m in f.measurements:
            if m.unavailable:
                continue
            k = key(m.check, m.labels)
            for q, figure in zip(queries(m), (m.baseline, m.slow), strict=True):
                if q is None or figure is None:
                    continue
                # the device's row (a whole-job check answers for every device)
                got = [s for s in client.query(q.promql, q.at) if key(m.check, s.labels) == k]
                assert len(got) == 1, (q.promql, got)
                assert got[0].value == pytest.approx(figure, rel=0.05, abs=1e-9), (q, m.text)
                checked += 1
    return checked


_QUERY = re.compile(r"^\s+(promql|baseline): (.+)$")
_RETURNS = re.compile(
    r"^\s+returns (?P<fig>-?[\d,]*\.?\d+(?:e[-+]?\d+)?)(?P<unit> ?[^\d\s,.]\S*)?"
    r"(?: in its row \((?P<row>[^)]*)\))? "
    r"at (?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC"
    r"(?:; over \[(?P<range>\d+s)\] at (?P<bat>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC, "
    r"the baseline: (?P<bfig>[^\s%/]+))?"
)
_FIGURE = re.compile(r"^-?[\d,]*\.?\d+(?:e[-+]?\d+)?")


def _figure(text: str) -> float:
    found = _FIGURE.match(text)
    assert found, text
    return float(found.group(0).replace(",", ""))


def _unix(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def _row(sel: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', sel))


def _check(client: PrometheusClient, promql: str, at: float, figure: float, row: str) -> None:
    want = _row(row)
    got = [
        s.value
        for s in client.query(promql, at)
        if all(s.labels.get(k) == v for k, v in want.items())
    ]
    assert len(got) == 1, (promql, at, got)
    # the printed figure carries 2-3 significant digits
    assert got[0] == pytest.approx(figure, rel=0.06, abs=1e-9), (promql, at, figure)


def assert_every_printed_query_reproduces(client: PrometheusClient, text: str) -> int:
    """The text output's every ``promql:``/``baseline:`` line, run at the time the line after
    it prints, returns the figure printed there (and the baseline's, over its printed range
    and time); returns how many figures were checked."""
    checked = 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        query = _QUERY.match(line)
        if not query or i + 1 >= len(lines):
            continue
        ret = _RETURNS.match(lines[i + 1])
        if not ret:
            continue
        promql = query.group(2)
        row = ret.group("row") or ""
        _check(client, promql, _unix(ret.group("at")), _figure(ret.group("fig")), row)
        checked += 1
        if ret.group("range"):
            # the same query over the baseline's range: every range of it is the period's
            first = re.search(r"\[(\d+s)\]", promql)
            assert first, promql
            base = promql.replace(first.group(0), f"[{ret.group('range')}]")
            _check(client, base, _unix(ret.group("bat")), _figure(ret.group("bfig")), row)
            checked += 1
    return checked
