"""The reproducibility check both explain labs run: every figure of every cause's evidence,
its printed PromQL run as an instant query at its printed time, returns the figure."""

from __future__ import annotations

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
