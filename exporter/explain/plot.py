"""``--plot FILE.png``: the throughput and the top causes' series on one time axis.

matplotlib is an optional dependency (``pip install fabricscope[explain]``), imported only
when a plot is asked for.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from exporter.explain.client import PrometheusClient, Series
from exporter.explain.rank import Finding
from exporter.explain.report import Report

TOP = 3


class PlotUnavailableError(Exception):
    pass


def _dates(times: Sequence[float]) -> list[datetime.datetime]:
    return [datetime.datetime.fromtimestamp(t, datetime.UTC) for t in times]


def plot(client: PrometheusClient, report: Report, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "--plot needs matplotlib: pip install 'fabricscope[explain]'"
        ) from exc
    top: list[Finding] = report.causes[:TOP]
    series: list[list[Series]] = [
        client.query_range(f.promql, report.start, report.end, report.step) for f in top
    ]
    rows = 1 + len(top)
    fig, axes = plt.subplots(
        rows, 1, sharex=True, figsize=(11, 2.3 + 2.1 * rows), squeeze=False, layout="constrained"
    )
    p = report.periods
    slow0, slow1 = _dates([p.slow_start, p.slow_end])
    ax = axes[0][0]
    tp = report.throughput
    if tp.series is not None:
        ax.plot(_dates(tp.series.times), tp.series.values, color="black", lw=1.4)
    ax.set_ylabel(tp.unit or "throughput")
    job = report.job.job + (f" ({report.job.namespace})" if report.job.namespace else "")
    title = f"fabricscope explain: {job} throughput"
    if report.shift is not None:
        title += f", {-100 * report.shift.drop_ratio:+.1f}% from {slow0:%H:%M} UTC"
    ax.set_title(title, loc="left", fontsize=11)
    for i, (finding, result) in enumerate(zip(top, series, strict=True), 1):
        a = axes[i][0]
        for s in result[:6]:
            a.plot(_dates(s.times), s.values, lw=1.2)
        a.set_title(
            f"#{i} {finding.title}: {finding.device} (score {finding.score:.2f})",
            loc="left",
            fontsize=10,
        )
        a.set_ylabel(_ylabel(finding))
        a.text(
            0.005,
            0.96,
            finding.evidence[0],
            transform=a.transAxes,
            ha="left",
            va="top",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
    for row in axes:
        a = row[0]
        a.axvspan(slow0, slow1, color="tab:red", alpha=0.08, lw=0)
        a.axvline(slow0, color="tab:red", lw=1, ls="--")
        a.grid(alpha=0.3)
    if not top:
        axes[0][0].text(
            0.5, 0.05, "no fabric cause found", transform=axes[0][0].transAxes, ha="center"
        )
    axes[-1][0].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
    axes[-1][0].set_xlabel("time (UTC); shaded: slow period")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ylabel(finding: Finding) -> str:
    expr = finding.promql
    if expr.startswith("rate(") or "(rate(" in expr:
        return "per second"
    if expr.startswith("increase("):
        return "events"
    return "value"
