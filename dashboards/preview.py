"""PNG previews of the dashboards, drawn with matplotlib from the same queries Grafana runs,
against a real Prometheus holding a backfilled lab scenario (tests/lab).

    PYTHONPATH=. python dashboards/preview.py ib_link_bad dashboards/previews

Panels are laid out by their gridPos; a timeseries is drawn from a range query, a bar gauge
from an instant query (one bar per series, in the query's order), a matrix as a heatmap.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ALARM_WORDS = ("finding", "down", "failure", "saturated", "narrower", "not up")
SCALES = {"Bps": (1e9, "GB/s"), "pps": (1.0, "/s"), "cps": (1.0, "/s"), "s": (1e-3, "ms")}


def _api(url: str, path: str, params: dict[str, str]) -> list[dict[str, object]]:
    with _OPENER.open(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
        body = json.load(r)
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def _legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out.replace("  ", " ").strip()


def _scale(unit: str) -> tuple[float, str]:
    if unit == "percentunit":
        return 0.01, "%"
    return SCALES.get(unit, (1.0, ""))


def _x(t: float) -> float:
    return mdates.epoch2num(t) if hasattr(mdates, "epoch2num") else t / 86400


def _stackplot(ax: Axes, series: list[dict[str, object]], legend: str, div: float) -> int:
    times = sorted({float(t) for s in series for t, _ in s["values"]})  # type: ignore[attr-defined]
    if not times:
        return 0
    rows = []
    for s in series:
        by_t = {float(t): float(v) / div for t, v in s["values"]}  # type: ignore[attr-defined]
        rows.append([by_t.get(t, 0.0) for t in times])
    labels = [_legend(legend, s["metric"])[:38] for s in series]  # type: ignore[arg-type]
    ax.stackplot([_x(t) for t in times], *rows, labels=labels, alpha=0.6)
    return len(rows)


def draw(
    ax: Axes,
    panel: generate.Panel,
    exprs: list[tuple[str, str]],
    url: str,
    span: tuple[float, float, float],
) -> None:
    start, end, step = span
    div, suffix = _scale(panel.unit)
    ax.set_title(panel.title, fontsize=9, loc="left", fontweight="bold")
    ax.tick_params(labelsize=7)
    if panel.kind == "timeseries":
        n = 0
        for expr, legend in exprs:
            result = _api(
                url,
                "/api/v1/query_range",
                {"query": expr, "start": str(start), "end": str(end), "step": str(step)},
            )
            ranked = sorted(result, key=lambda s: -max(float(v) for _, v in s["values"]))  # type: ignore[index]
            if panel.stack:  # as Grafana stacks it: areas on one time grid, 0 where absent
                n += _stackplot(ax, ranked[:6], legend, div)
                continue
            for s in ranked[:6]:
                xs = [
                    mdates.epoch2num(float(t)) if hasattr(mdates, "epoch2num") else float(t) / 86400
                    for t, _ in s["values"]
                ]  # type: ignore[index]
                ys = [float(v) / div for _, v in s["values"]]  # type: ignore[index]
                ax.plot(xs, ys, linewidth=1.1, label=_legend(legend, s["metric"])[:38])  # type: ignore[arg-type]
                n += 1
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
        if panel.unit in ("Bps", "percentunit"):
            ax.set_ylim(bottom=0)
        ax.set_ylabel(suffix, fontsize=7)
        ax.grid(alpha=0.3)
        if n:
            ax.legend(fontsize=6, loc="upper left", ncol=2 if n > 3 else 1, framealpha=0.7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    elif panel.kind == "bargauge":
        expr, legend = exprs[0]
        result = _api(url, "/api/v1/query", {"query": expr, "time": str(end)})[:10]
        names = [_legend(legend, s["metric"])[:40] for s in result]  # type: ignore[arg-type]
        vals = [float(s["value"][1]) / div for s in result]  # type: ignore[index]
        if not vals:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            return
        alarm = any(w in panel.title.lower() for w in ALARM_WORDS)
        colors = ["#d62728" if alarm and v > 0 else "#5b8ff9" for v in vals]
        top = max(*vals, 1)
        ys = list(range(len(vals)))[::-1]
        ax.barh(ys, vals, color=colors, height=0.7)
        ax.set_yticks([])
        for y, name, v in zip(ys, names, vals, strict=True):
            ax.text(top * 0.01, y, name, va="center", fontsize=7, color="black")
            ax.text(top * 1.22, y, f"{v:.3g}{suffix}", va="center", ha="right", fontsize=7)
        ax.set_xlim(0, top * 1.25)
        ax.set_ylim(-0.6, max(len(vals), 4) - 0.4)
    else:  # matrix
        expr, _ = exprs[0]
        result = _api(url, "/api/v1/query", {"query": expr, "time": str(end)})
        row, col = panel.matrix
        rows = sorted({s["metric"].get(row, "") for s in result})  # type: ignore[union-attr]
        cols = sorted({s["metric"].get(col, "") for s in result})  # type: ignore[union-attr]
        grid = [[math.nan] * len(cols) for _ in rows]
        for s in result:
            m = s["metric"]
            grid[rows.index(m.get(row, ""))][cols.index(m.get(col, ""))] = (
                float(s["value"][1]) / div
            )  # type: ignore[index, union-attr]
        im = ax.imshow(grid, cmap="RdYlGn", aspect="auto")
        ax.set_xticks(range(len(cols)), cols, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_xlabel(col, fontsize=7)
        ax.set_ylabel(row, fontsize=7)
        for i, r in enumerate(grid):
            for j, v in enumerate(r):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7)
        plt.colorbar(im, ax=ax, label=suffix)


def render_board(
    board: generate.Board, url: str, span: tuple[float, float, float], node: str, out: Path
) -> Path:
    unit, head = 0.3, 0.5  # inches per grid row, title band
    bottom = max(p_y + p.h for p, p_y in _positions(board))
    height = bottom * unit + head
    fig = plt.figure(figsize=(18, height))
    fig.suptitle(
        f"{board.title}   (lab scenario; node={node if board.single_node else 'All'})",
        fontsize=12,
        x=0.01,
        y=1 - 0.12 / height,
        ha="left",
    )
    for p, y in _positions(board):
        x = p_x[p.title]
        top_in = head + y * unit + 0.3  # room for the panel title
        bottom_in = head + (y + p.h) * unit - 0.3  # room for the tick labels
        ax = fig.add_axes(
            (x / 24 + 0.03, 1 - bottom_in / height, p.w / 24 - 0.045, (bottom_in - top_in) / height)
        )
        exprs = [(_subst(e, board, node), lg) for e, lg in p.targets]
        draw(ax, p, exprs, url, span)
    path = out / f"{generate.path_of(board).stem}.png"
    fig.savefig(path, dpi=70)
    plt.close(fig)
    return path


p_x: dict[str, int] = {}


def _positions(board: generate.Board) -> list[tuple[generate.Panel, int]]:
    out = []
    x = y = row_h = 0
    for p in board.panels:
        if x + p.w > 24:
            x, y, row_h = 0, y + row_h, 0
        p_x[p.title] = x
        out.append((p, y))
        x += p.w
        row_h = max(row_h, p.h)
    return out


def _subst(expr: str, board: generate.Board, node: str) -> str:
    values = {
        "$__rate_interval": "4m",
        "$cluster": ".*",
        "$node": node if board.single_node else ".*",
        "$namespace": "training",
        "$job": "llm",
    }
    for k, v in values.items():
        expr = expr.replace(k, v)
    return expr


def main(argv: list[str]) -> int:
    from tests.lab.backfill import build_tsdb, read_timeline, start_prometheus
    from tests.lab.cluster import scratch_dir
    from tests.lab.scenarios import SCENARIOS

    scenario = SCENARIOS[argv[0]]
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    node = scenario.cause.node if scenario.cause else "node-00"
    with scratch_dir("fslab-preview-") as work:
        tsdb = build_tsdb(scenario, 2.0, 60.0, work)
        start, end, step, _ = read_timeline(work)
        with start_prometheus(tsdb) as url:
            for board in generate.BOARDS:
                print(render_board(board, url, (start, end, step), node, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
