"""PNG previews of the dashboards, drawn with matplotlib from the same queries Grafana runs,
against a real Prometheus holding a backfilled lab scenario (tests/lab).

    PYTHONPATH=. python dashboards/preview.py ib_link_bad dashboards/previews
    PYTHONPATH=. python dashboards/preview.py fabric dashboards/previews   # *-fabric.png
    PYTHONPATH=. python dashboards/preview.py dcgm dashboards/previews     # node-dcgm.png

Panels are laid out by their gridPos; a timeseries is drawn from a range query with every
series named in a legend below it, a bar gauge from an instant query (one bar per series, in
the query's order, every one), a matrix as a heatmap; a panel with ``stack`` is drawn
stacked, as Grafana does. Sized for the README's column (900 px,
10 px text); a row of panels is as tall as its legends need.
"""

from __future__ import annotations

import json
import math
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ALARM_WORDS = ("finding", "down", "failure", "saturated", "narrower", "not up")
SCALES = {
    "Bps": (1e9, "GB/s"),
    "bps": (1e9, "Gb/s"),
    "pps": (1.0, "/s"),
    "cps": (1.0, "/s"),
    "s": (1e-3, "ms"),
}
Span = tuple[float, float, float]  # start, end, step (unix seconds)


def _api(url: str, path: str, params: dict[str, str]) -> list[dict[str, object]]:
    with _OPENER.open(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=30) as r:
        body = json.load(r)
    result: list[dict[str, object]] = body["data"]["result"]
    return result


#: Drawn at the size the README shows the Job preview (GitHub's column is about 900 px wide),
#: at 72 dpi so that a point is a pixel: legends and ticks 10 px, titles 12 px.
WIDTH_PX = 900
DPI = 72
FONT = 10
TITLE_FONT = 12
PAD = 8  # px between panels
LINE_PX = 14  # one legend row or one bar
TITLE_PX = 22
TICKS_PX = 22  # x tick labels below a plot
YAXIS_PX = 44  # y tick labels left of a plot
PLOT_PX_PER_ROW = 15  # plot height per grid row of the panel


def _legend(fmt: str, labels: dict[str, str]) -> str:
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out.replace("  ", " ").strip()


def _scale(unit: str) -> tuple[float, str]:
    if unit == "percentunit":
        return 0.01, "%"
    return SCALES.get(unit, (1.0, ""))


@dataclass
class Drawn:
    """One panel's data, fetched before the layout: every series, named."""

    panel: generate.Panel
    x: int  # grid column
    series: list[tuple[str, list[float], list[float]]] = field(default_factory=list)
    bars: list[tuple[str, float]] = field(default_factory=list)
    matrix: tuple[list[str], list[str], list[list[float]]] | None = None

    def legend_layout(self, width_px: float) -> tuple[int, int]:
        """(columns, rows) of the legend below a timeseries ``width_px`` wide."""
        if not self.series:
            return 1, 0
        longest = max(len(name) for name, _, _ in self.series)
        entry = longest * FONT * 0.58 + 30  # DejaVu Sans: about 0.58 em a character
        cols = max(1, min(len(self.series), int(width_px // entry)))
        return cols, math.ceil(len(self.series) / cols)

    def height_px(self, width_px: float) -> float:
        """What the panel needs: title, plot, tick labels and legend (or one line a bar)."""
        p = self.panel
        if p.kind == "bargauge":
            return TITLE_PX + max(len(self.bars), 2) * LINE_PX + TICKS_PX
        plot = p.h * PLOT_PX_PER_ROW
        if p.kind == "timeseries":
            return TITLE_PX + plot + TICKS_PX + self.legend_layout(width_px)[1] * LINE_PX + 4
        return TITLE_PX + plot + TICKS_PX + 16


def fetch(
    panel: generate.Panel, x: int, exprs: list[tuple[str, str]], url: str, span: Span
) -> Drawn:
    start, end, step = span
    div, _ = _scale(panel.unit)
    d = Drawn(panel, x)
    if panel.kind == "timeseries":
        for expr, legend in exprs:
            result = _api(
                url,
                "/api/v1/query_range",
                {"query": expr, "start": str(start), "end": str(end), "step": str(step)},
            )
            for s in result:
                values = s["values"]  # type: ignore[index]
                xs = [float(t) / 86400 for t, _ in values]  # type: ignore[misc]
                ys = [float(v) / div for _, v in values]  # type: ignore[misc]
                d.series.append((_legend(legend, s["metric"]), xs, ys))  # type: ignore[arg-type]
        d.series.sort(key=lambda s: (-max(s[2], default=0), s[0]))
    elif panel.kind == "bargauge":
        expr, legend = exprs[0]
        result = _api(url, "/api/v1/query", {"query": expr, "time": str(end)})
        d.bars = [
            (_legend(legend, s["metric"]), float(s["value"][1]) / div)  # type: ignore[index, arg-type]
            for s in result
        ]
    else:  # matrix
        expr, _ = exprs[0]
        result = _api(url, "/api/v1/query", {"query": expr, "time": str(end)})
        row, col = panel.matrix
        rows = sorted({s["metric"].get(row, "") for s in result})  # type: ignore[union-attr]
        cols = sorted({s["metric"].get(col, "") for s in result})  # type: ignore[union-attr]
        grid = [[math.nan] * len(cols) for _ in rows]
        for s in result:
            m = s["metric"]
            grid[rows.index(m.get(row, ""))][cols.index(m.get(col, ""))] = (  # type: ignore[union-attr]
                float(s["value"][1]) / div  # type: ignore[index]
            )
        d.matrix = (rows, cols, grid)
    return d


def draw(fig: Figure, d: Drawn, box: tuple[float, float, float, float], height: float) -> None:
    """Draw ``d`` in ``box`` (left, top, width, height in px from the figure's top left)."""
    left, top, w, h = box
    p = d.panel
    _, suffix = _scale(p.unit)

    def axes(x0: float, y0: float, ww: float, hh: float) -> Axes:
        return fig.add_axes((x0 / WIDTH_PX, 1 - (y0 + hh) / height, ww / WIDTH_PX, hh / height))

    fig.text(
        (left + 2) / WIDTH_PX,
        1 - (top + 4) / height,
        p.title,
        fontsize=TITLE_FONT,
        fontweight="bold",
        va="top",
    )
    if p.kind == "timeseries":
        cols, _ = d.legend_layout(w)
        below = top + TITLE_PX + p.h * PLOT_PX_PER_ROW + TICKS_PX
        plot_h = p.h * PLOT_PX_PER_ROW  # the legend right below it, whatever the row's height
        ax = axes(left + YAXIS_PX, top + TITLE_PX, w - YAXIS_PX - 4, plot_h)
        ax.tick_params(labelsize=FONT)
        if not d.series:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            return
        cmap = plt.get_cmap("tab10" if len(d.series) <= 10 else "tab20")
        colors = [cmap(i % cmap.N) for i in range(len(d.series))]
        lines: list[Artist] = []
        if p.stack:  # as Grafana stacks it: areas on one time grid, 0 where absent
            grid = sorted({x for _, xs, _ in d.series for x in xs})
            rows = []
            for _, xs, ys in d.series:
                at = dict(zip(xs, ys, strict=True))
                rows.append([at.get(x, 0.0) for x in grid])
            lines = list(ax.stackplot(grid, *rows, colors=colors, alpha=0.6))
            for poly, (name, _, _) in zip(lines, d.series, strict=True):
                poly.set_label(name)
            totals = [sum(col) for col in zip(*rows, strict=True)]
            d = replace(d, series=[("", grid, totals), ("", grid, [0.0] * len(grid))])
        else:
            for (name, xs, ys), color in zip(d.series, colors, strict=True):
                (line,) = ax.plot(xs, ys, linewidth=1.4, color=color, label=name)
                lines.append(line)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))
        ax.xaxis.set_major_locator(mdates.MinuteLocator(byminute=(0, 30)))
        ax.margins(x=0.01)
        lo = min(min(ys) for _, _, ys in d.series)
        hi = max(max(ys) for _, _, ys in d.series)
        if p.unit in ("Bps", "percentunit") or lo >= 0:
            lo = 0.0
        span = (hi - lo) or 1.0
        # no line on the frame: a margin above the highest and below the lowest value
        ax.set_ylim(lo - 0.06 * span, hi + 0.1 * span)
        if suffix:
            ax.set_ylabel(suffix, fontsize=FONT)
        ax.grid(alpha=0.3)
        fig.legend(
            lines,
            [ln.get_label() for ln in lines],
            loc="upper left",
            bbox_to_anchor=((left + 4) / WIDTH_PX, 1 - below / height),
            ncol=cols,
            fontsize=FONT,
            frameon=False,
            borderaxespad=0,
            borderpad=0,
            handlelength=1.4,
            handletextpad=0.4,
            columnspacing=1.2,
            labelspacing=(LINE_PX - FONT) / FONT,
        )
    elif p.kind == "bargauge":
        # one line a bar, from the top, whatever the row's height (a neighbour's may be taller)
        ax = axes(left + 4, top + TITLE_PX, w - 8, max(len(d.bars), 2) * LINE_PX)
        ax.tick_params(labelsize=FONT)
        if not d.bars:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            return
        vals = [v for _, v in d.bars]
        alarm = any(word in p.title.lower() for word in ALARM_WORDS)
        colors = ["#d62728" if alarm and v > 0 else "#5b8ff9" for v in vals]
        top_v = max(*vals, 1)
        ys = list(range(len(vals)))[::-1]
        ax.barh(ys, vals, color=colors, height=0.7)
        ax.set_yticks([])
        for y, (name, v) in zip(ys, d.bars, strict=True):
            ax.text(top_v * 0.01, y, name, va="center", fontsize=FONT, color="black")
            ax.text(top_v * 1.27, y, f"{v:.3g}{suffix}", va="center", ha="right", fontsize=FONT)
        ax.set_xlim(0, top_v * 1.3)
        ax.set_ylim(-0.6, max(len(vals), 2) - 0.4)
    else:  # matrix
        assert d.matrix is not None
        rows_l, cols_l, grid = d.matrix
        ax = axes(left + 70, top + TITLE_PX, w - 150, h - TITLE_PX - TICKS_PX - 16)
        im = ax.imshow(grid, cmap="RdYlGn", aspect="auto")
        row, col = p.matrix
        ax.set_xticks(range(len(cols_l)), cols_l, fontsize=FONT)
        ax.set_yticks(range(len(rows_l)), rows_l, fontsize=FONT)
        ax.set_xlabel(col, fontsize=FONT)
        ax.set_ylabel(row, fontsize=FONT)
        for i, r in enumerate(grid):
            for j, v in enumerate(r):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=FONT)
        bar = fig.colorbar(im, ax=ax, label=suffix)
        bar.ax.tick_params(labelsize=FONT)


def render_board(
    board: generate.Board,
    url: str,
    span: Span,
    node: str,
    out: Path,
    *,
    source: str = "lab scenario",
    suffix: str = "",
) -> Path:
    """Every panel's data first, then the layout: each row of the dashboard's grid as tall
    as its tallest panel needs (its legend naming every series, every bar drawn). Written
    to ``out/<board><suffix>.png``."""
    bands: dict[int, list[Drawn]] = {}
    for p, y, x in _positions(board):
        exprs = [(_subst(e, board, node, span), lg) for e, lg in p.targets]
        bands.setdefault(y, []).append(fetch(p, x, exprs, url, span))
    head = 40
    heights = {
        y: max(d.height_px(d.panel.w / 24 * WIDTH_PX - 2 * PAD) for d in ds)
        for y, ds in bands.items()
    }
    height = head + sum(heights.values()) + PAD * len(bands)
    fig = plt.figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI)
    fig.text(
        8 / WIDTH_PX,
        1 - 10 / height,
        f"{board.title}   ({source}; node={node if board.single_node else 'All'})",
        fontsize=14,
        va="top",
    )
    top = float(head)
    for y in sorted(bands):
        for d in bands[y]:
            box = (d.x / 24 * WIDTH_PX + PAD, top, d.panel.w / 24 * WIDTH_PX - 2 * PAD, heights[y])
            draw(fig, d, box, height)
        top += heights[y] + PAD
    path = out / f"{generate.path_of(board).stem}{suffix}.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _positions(board: generate.Board) -> list[tuple[generate.Panel, int, int]]:
    """(panel, grid row, grid column) in Grafana's left-to-right, top-to-bottom flow."""
    out = []
    x = y = row_h = 0
    for p in board.panels:
        if x + p.w > 24 or (p.new_row and x):
            x, y, row_h = 0, y + row_h, 0
        out.append((p, y, x))
        x += p.w
        row_h = max(row_h, p.h)
    return out


def _subst(expr: str, board: generate.Board, node: str, span: Span) -> str:
    values = {
        "$__rate_interval": "4m",
        "$__range": f"{span[1] - span[0]:.0f}s",
        "$cluster": ".*",
        "$node": node if board.single_node else ".*",
        "$namespace": "training",
        "$job": "llm",
    }
    for k, v in values.items():
        expr = expr.replace(k, v)
    return expr


def fabric(out: Path) -> int:
    """The Fleet and Node boards on the simulated fat tree (tests/fabric_lab.py): 30 healthy
    minutes, then 30 with a leaf's host ports erring at the switch end, another leaf's uplinks
    erring and waiting, one cable erring; the Node board of host5 (the bad cable)."""
    from tests.fabric_lab import fabric_run
    from tests.lab.cluster import scratch_dir

    with (
        scratch_dir("fslab-fabric-") as work,
        fabric_run(work, healthy=30, faulty=30, step=60.0) as served,
    ):
        span = (served.start, served.end, served.step)
        for board in (generate.FLEET, generate.NODE_BOARD):
            path = render_board(
                board,
                served.url,
                span,
                "host5",
                out,
                source="simulated fat tree",
                suffix="-fabric",
            )
            print(path)
    return 0


def dcgm(out: Path, seconds: float = 150.0) -> int:
    """The Node board beside dcgm-exporter and node_exporter: the recorded dcgm-exporter
    output, the real node_exporter and the real agent on the DGX fixture node ``dgx-01``, as
    tests/deploy/test_joins.py serves them, scraped every 5 s for ``seconds``."""
    import tempfile
    import time

    from tests.deploy.test_joins import dgx01, node_exporter_on_dgx

    with (
        tempfile.TemporaryDirectory(prefix="fslab-dcgm-") as work,
        node_exporter_on_dgx() as address,
        dgx01(Path(work), address, scrape_interval="5s") as prom,
    ):
        start = time.time()
        time.sleep(seconds)
        path = render_board(
            generate.NODE_BOARD,
            prom.url,
            (start, time.time(), 10.0),
            "dgx-01",
            out,
            source=f"recorded dcgm-exporter, node_exporter 1.5 and the agent, {seconds:.0f} s",
            suffix="-dcgm",
        )
        print(path)
    return 0


def main(argv: list[str]) -> int:
    from tests.lab.backfill import build_tsdb, read_timeline, start_prometheus
    from tests.lab.cluster import scratch_dir
    from tests.lab.scenarios import ALL_SCENARIOS

    if argv[0] == "fabric":
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        return fabric(out)
    if argv[0] == "dcgm":
        out = Path(argv[1])
        out.mkdir(parents=True, exist_ok=True)
        return dcgm(out)
    scenario = ALL_SCENARIOS[argv[0]]
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    node = scenario.cause.node if scenario.cause else "node-00"
    with scratch_dir("fslab-preview-") as work:
        tsdb = build_tsdb(scenario, 2.0, 60.0, work)
        start, end, step, _ = read_timeline(work)
        with start_prometheus(tsdb) as url:
            for board in generate.BOARDS:
                if board is generate.FLEET:
                    continue  # drawn from a 500-node fleet: bench/alert_noise.py --preview
                print(render_board(board, url, (start, end, step), node, out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
