"""``--plot FILE.png``: the throughput and the top causes' evidence on one time axis.

Each cause's panel draws the series its strongest evidence line names: the same PromQL the
table prints (the device's own expression, in the line's unit, its ``{peers}`` the node),
over a range of a few steps (never under four scrape intervals) instead of the period, with
the baseline and slow figures of the line drawn over their periods as dashed segments. The
y axis says the unit (the check's ``axis``). :func:`panels` gathers what is drawn (tests
read it), :func:`plot` draws it.

matplotlib is an optional dependency (``pip install fabricscope[explain]``), imported only
when a plot is asked for.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.explain.client import PrometheusClient, Series
from exporter.explain.evidence import Measurement, Window, _fmt, key
from exporter.explain.judge import scrape_interval
from exporter.explain.rank import Finding
from exporter.explain.report import Report

TOP = 3


class PlotUnavailableError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Panel:
    """One cause's row: the strongest evidence line, the PromQL drawn and its series."""

    finding: Finding
    measurement: Measurement | None
    promql: str
    seconds: int  # the range of the drawn expression
    series: tuple[Series, ...]

    @property
    def ylabel(self) -> str:
        if self.measurement is None:
            return "value"
        check = self.measurement.check
        if check.mode == "events":
            return f"{check.axis_label} per {_span(self.seconds)}"
        if check.axis_label.startswith("/"):  # a rate: name what it counts
            return f"{check.name.replace('_', ' ')} {check.axis_label}"
        return check.axis_label


def _span(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def panels(client: PrometheusClient, report: Report) -> list[Panel]:
    """What :func:`plot` draws for the top causes: one range query each."""
    out = []
    for f in report.causes[:TOP]:
        m = next((m for m in f.measurements if not m.unavailable and m.slow is not None), None)
        if m is None:
            series = client.query_range(f.promql, report.start, report.end, report.step)
            out.append(Panel(f, None, f.promql, 0, tuple(series[:6])))
            continue
        check = m.check
        sel, peers = check.device_selector(m.labels), check.peer_selector(m.labels)
        if m.job_selector:  # the whole job's answer, the device one row of it
            sel = peers = m.job_selector
        interval = scrape_interval(client, check, sel, report.periods)
        seconds = int(max(60, 4 * report.step, math.ceil(4 * interval)))
        expr = check.shown(sel, f"{seconds}s", peers)
        series = client.query_range(expr, report.start, report.end, report.step)
        if m.job_selector:
            series = [s for s in series if key(check, s.labels) == key(check, m.labels)]
        out.append(Panel(f, m, expr, seconds, tuple(series[:6])))
    return out


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
    rows_data = panels(client, report)
    rows = 1 + len(rows_data)
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
    for i, panel in enumerate(rows_data, 1):
        a = axes[i][0]
        f = panel.finding
        m = panel.measurement
        line = m.text if m is not None else f.evidence[0]
        for k, s in enumerate(panel.series):
            a.plot(_dates(s.times), s.values, lw=1.2, label=line if k == 0 else None)
        if m is not None and m.check.mode != "events":  # events: counts per range drawn
            unit = m.check.unit
            for value, window, name in (
                (m.baseline, m.base_window, "baseline"),
                (m.slow, m.slow_window, "slow"),
            ):
                _figure(a, value, window, f"{name}: {_fmt(value)}{unit}")
        a.set_title(f"#{i} {f.title}: {f.device} (score {f.score:.2f})", loc="left", fontsize=10)
        a.set_ylabel(panel.ylabel)
        if _unit_interval(panel):  # a share or a 0/1 flag: its whole range, not a zoom
            a.set_ylim(-0.05, 1.1)
        a.ticklabel_format(axis="y", style="plain", useOffset=False)
        if panel.series:  # the evidence line, where it hides the least of the series
            a.legend(loc="best", fontsize=8, framealpha=0.85)
    for row in axes:
        a = row[0]
        a.axvspan(slow0, slow1, color="tab:red", alpha=0.08, lw=0)
        a.axvline(slow0, color="tab:red", lw=1, ls="--")
        a.grid(alpha=0.3)
    if not rows_data:
        axes[0][0].text(0.5, 0.05, report.verdict, transform=axes[0][0].transAxes, ha="center")
    axes[-1][0].xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
    axes[-1][0].set_xlabel("time (UTC); shaded: slow period; dashed: the printed figures")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _unit_interval(panel: Panel) -> bool:
    label = panel.ylabel
    if "share" not in label and label != "0/1":
        return False
    values = [v for s in panel.series for v in s.values if math.isfinite(v)]
    return bool(values) and all(0.0 <= v <= 1.0 for v in values)


def _figure(ax: object, value: float | None, window: Window | None, label: str) -> None:
    """A printed figure as a dashed segment over the window it was taken in."""
    if value is None or window is None:
        return
    x = _dates([window.at - window.seconds, window.at])
    ax.plot(x, [value, value], color="tab:gray", lw=1.2, ls="--")  # type: ignore[attr-defined]
    ax.annotate(  # type: ignore[attr-defined]
        label, (x[1], value), xytext=(-4, 3), textcoords="offset points", ha="right", fontsize=7
    )
