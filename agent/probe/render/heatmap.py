"""A GPU-pair bandwidth heatmap as a PNG a person can read (matplotlib).

Only ``fabricscope probe --matrix`` draws one: matplotlib is imported inside
:func:`heatmap_png`, never when this module is imported, so the resident agent never loads
it (a test checks). Pure otherwise: it returns the PNG's bytes; the caller writes them.

What the image shows:

- one cell per (row GPU, column GPU), coloured by its value on a viridis scale whose
  colour bar names the quantity and its unit (GB/s = 10^9 bytes per second, as nccl-tests);
- the value written in every measured cell (fewer digits as the grid grows; at 64 x 64 the
  integer GB/s still fits);
- a failed cell is red, crossed, with its reason as a short code (``TMO`` timeout, ...)
  explained under the grid with how many cells failed for it, so a failure never reads as a
  slow pair; a cell with no value and no reason (a GPU with itself, a pair not reached) is
  light grey with a dash: not measured, not failed;
- axes titled with the node and ``GPU``; tick labels are GPU numbers; where an axis spans
  several nodes (:class:`Axis` ``groups``), the node names are written along it and the
  nodes are separated by lines;
- the title the caller gives (collective, size, nodes, time).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

#: the failure reasons' short codes written in failed cells (``missing``: no result)
REASON_CODES = {
    "timeout": "TMO",
    "init_failure": "INIT",
    "peer_unreachable": "UNR",
    "auth_failure": "AUTH",
    "wrong_result": "BAD",
    "gpu_busy": "BUSY",
    "crashed": "CRSH",
    "peer_declined": "DECL",
}
NOT_MEASURED_FILL = "#e6e6e6"
FAILURE_FILL = "#d62728"
FAILURE_MARK = "#ffffff"
COLORMAP = "viridis"
DPI = 100
#: pixels per cell, by grid size: large enough for the value, small enough for 64 x 64
_CELL_PX = ((8, 64), (16, 48), (32, 34), (10_000, 24))


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis of the grid: its title, one tick label per row (or column), and optional
    node groups: ``(node name, count)`` runs of consecutive labels, in order."""

    title: str
    labels: tuple[str, ...]
    groups: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.groups and sum(n for _, n in self.groups) != len(self.labels):
            raise ValueError("the node groups must cover the labels exactly")
        if any(n < 1 for _, n in self.groups):
            raise ValueError("a node group holds at least one label")


def reason_code(reason: str) -> str:
    """The short code of a failure reason (unknown reasons: their first 4 letters)."""
    return REASON_CODES.get(reason, reason[:4].upper() or "FAIL")


def cell_pixels(n: int) -> int:
    """Pixels per cell side for a grid whose larger side has ``n`` cells."""
    return next(px for limit, px in _CELL_PX if n <= limit)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the grid sits in the image, in inches at :data:`DPI` (the figure's size, the
    grid's lower-left corner, one cell's side)."""

    n_rows: int
    n_cols: int
    width_in: float
    height_in: float
    left_in: float
    bottom_in: float
    cell_in: float

    @property
    def size_px(self) -> tuple[int, int]:
        return round(self.width_in * DPI), round(self.height_in * DPI)

    def cell_px(self, row: int, col: int, dx: float = 0.0, dy: float = 0.0) -> tuple[int, int]:
        """Pixel (x, y from the top) of cell (row, col)'s centre, moved by ``dx``/``dy``
        cells (right, down)."""
        x = (self.left_in + (col + 0.5 + dx) * self.cell_in) * DPI
        y_up = (self.bottom_in + (self.n_rows - row - 0.5 - dy) * self.cell_in) * DPI
        return int(x), int(self.height_in * DPI - y_up)


def layout(n_rows: int, n_cols: int, *, failures: bool) -> Layout:
    """The layout of an ``n_rows`` x ``n_cols`` heatmap (``failures``: room for their
    legend under the grid)."""
    n = max(n_rows, n_cols)
    cell_in = cell_pixels(n) / DPI
    left_in, right_in, top_in = 1.3, 1.6, 0.9
    bottom_in = 0.8 + (0.25 if n > 16 else 0.0) + (0.45 if failures else 0.0)
    width_in = max(left_in + n_cols * cell_in + right_in, 6.0)
    height_in = top_in + n_rows * cell_in + bottom_in
    return Layout(n_rows, n_cols, width_in, height_in, left_in, bottom_in, cell_in)


def _value_text(value: float, n: int) -> str:
    """A cell's value in the displayed unit: one decimal up to 16 cells a side, then whole
    numbers (three digits of GB/s fit a 24-pixel cell)."""
    if n <= 16 and abs(value) < 1000:
        return f"{value:.1f}"
    return f"{value:.0f}"


def heatmap_png(
    values: Sequence[Sequence[float | None]],
    *,
    rows: Axis,
    cols: Axis,
    title: str,
    reasons: Sequence[Sequence[str]] | None = None,
    quantity: str = "busbw",
    unit: str = "GB/s",
    scale: float = 1e9,
) -> bytes:
    """The grid ``values[row][col]`` (bytes per second; None: failed) as a PNG.

    ``reasons[row][col]`` names why a cell without a value failed; an empty reason (or no
    ``reasons``) marks it not measured.
    Values are divided by ``scale`` and shown in ``unit``; the colour bar reads
    ``quantity (unit)``.
    """
    n_rows = len(values)
    n_cols = len(values[0]) if n_rows else 0
    if n_rows == 0 or n_cols == 0 or any(len(r) != n_cols for r in values):
        raise ValueError("the grid must be a non-empty rectangle")
    if len(rows.labels) != n_rows or len(cols.labels) != n_cols:
        raise ValueError("one label per row and per column")
    if reasons is not None and (len(reasons) != n_rows or any(len(r) != n_cols for r in reasons)):
        raise ValueError("reasons must have the grid's shape")
    # matplotlib only here: the resident agent imports this module's callers, never this
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    shown = [[None if v is None else v / scale for v in row] for row in values]
    measured = [v for row in shown for v in row if v is not None]
    vmax = max(measured) if measured else 1.0
    vmin = min(measured) if measured else 0.0
    if vmax <= vmin:
        vmin, vmax = (0.0, vmax) if vmax > 0 else (0.0, 1.0)
    n = max(n_rows, n_cols)
    small = n > 16
    font = 6.0 if n > 32 else 7.5 if small else 9.0
    tick_font = 6.0 if n > 32 else 8.0
    # room around the grid: tick labels and axis titles left and below, the colour bar
    # right, the title above, the failure legend at the bottom
    failed_any = reasons is not None and any(
        v is None and reasons[i][j] for i, row in enumerate(shown) for j, v in enumerate(row)
    )
    box = layout(n_rows, n_cols, failures=failed_any)
    width_in, height_in = box.width_in, box.height_in
    left_in, bottom_in, cell_in = box.left_in, box.bottom_in, box.cell_in
    fig = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes(
        (
            left_in / width_in,
            bottom_in / height_in,
            n_cols * cell_in / width_in,
            n_rows * cell_in / height_in,
        )
    )
    cmap = mpl.colormaps[COLORMAP]
    norm = Normalize(vmin=vmin, vmax=vmax)
    grid = [[math.nan if v is None else v for v in row] for row in shown]
    image = ax.imshow(
        grid, cmap=cmap, norm=norm, aspect="auto", interpolation="nearest", origin="upper"
    )
    failures: dict[str, int] = {}
    for i, row in enumerate(shown):
        for j, v in enumerate(row):
            if v is None:
                reason = reasons[i][j] if reasons is not None else ""
                if not reason:
                    ax.add_patch(
                        mpl.patches.Rectangle(
                            (j - 0.5, i - 0.5), 1, 1, facecolor=NOT_MEASURED_FILL, edgecolor="none"
                        )
                    )
                    ax.text(j, i, "-", ha="center", va="center", fontsize=font, color="#707070")
                    continue
                failures[reason] = failures.get(reason, 0) + 1
                ax.add_patch(
                    mpl.patches.Rectangle(
                        (j - 0.5, i - 0.5), 1, 1, facecolor=FAILURE_FILL, edgecolor="none"
                    )
                )
                ax.plot(
                    [j - 0.4, j + 0.4], [i - 0.4, i + 0.4], color=FAILURE_MARK, lw=0.8, alpha=0.6
                )
                ax.plot(
                    [j - 0.4, j + 0.4], [i + 0.4, i - 0.4], color=FAILURE_MARK, lw=0.8, alpha=0.6
                )
                ax.text(
                    j,
                    i,
                    reason_code(reason),
                    ha="center",
                    va="center",
                    fontsize=font * 0.85,
                    fontweight="bold",
                    color="white",
                )
                continue
            r, g, b, _ = cmap(norm(v))
            light = 0.299 * r + 0.587 * g + 0.114 * b > 0.5
            ax.text(
                j,
                i,
                _value_text(v, n),
                ha="center",
                va="center",
                fontsize=font,
                color="black" if light else "white",
            )
    ax.set_xticks(range(n_cols))
    ax.set_yticks(range(n_rows))
    ax.set_xticklabels(cols.labels, fontsize=tick_font, rotation=90 if small else 0)
    ax.set_yticklabels(rows.labels, fontsize=tick_font)
    ax.xaxis.set_ticks_position("bottom")
    ax.tick_params(length=2, pad=2)
    ax.set_xlabel(cols.title, fontsize=10)
    ax.set_ylabel(rows.title, fontsize=10)
    # thin grid lines between cells, heavier ones between nodes
    ax.set_xticks([x - 0.5 for x in range(1, n_cols)], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, n_rows)], minor=True)
    ax.grid(which="minor", color="white", linewidth=0.4 if small else 0.8)
    ax.tick_params(which="minor", length=0)
    _node_groups(ax, rows, cols, font)
    ax.set_title(title, fontsize=11, pad=22 if len(cols.groups) > 1 else 10)
    cbar_gap = 0.5 if len(rows.groups) > 1 else 0.25
    cbar_ax = fig.add_axes(
        (
            (left_in + n_cols * cell_in + cbar_gap) / width_in,
            bottom_in / height_in,
            0.2 / width_in,
            n_rows * cell_in / height_in,
        )
    )
    cbar = fig.colorbar(image, cax=cbar_ax)
    cbar.set_label(f"{quantity} ({unit})", fontsize=10)
    cbar.ax.tick_params(labelsize=8)
    if failures:
        handles = [
            Patch(
                facecolor=FAILURE_FILL,
                label=f"{reason_code(reason)} = {reason}: {count} pair{'s' * (count != 1)}",
            )
            for reason, count in sorted(failures.items())
        ]
        fig.legend(
            handles=handles,
            loc="lower left",
            bbox_to_anchor=(0.01, 0.0),
            ncol=min(3, len(handles)),
            fontsize=8,
            frameon=False,
            title="failed (red, crossed)",
            title_fontsize=8,
        )
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return out.getvalue()


def _node_groups(ax: object, rows: Axis, cols: Axis, font: float) -> None:
    """Node names along an axis that spans several nodes, and lines between the nodes."""
    from matplotlib.axes import Axes

    assert isinstance(ax, Axes)
    for axis, horizontal in ((rows, False), (cols, True)):
        if len(axis.groups) < 2:
            continue
        start = 0
        for name, count in axis.groups:
            middle = start + (count - 1) / 2
            if start:
                if horizontal:
                    ax.axvline(start - 0.5, color="black", linewidth=1.5)
                else:
                    ax.axhline(start - 0.5, color="black", linewidth=1.5)
            if horizontal:
                ax.annotate(
                    name,
                    xy=(middle, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=font + 1,
                    fontweight="bold",
                )
            else:
                ax.annotate(
                    name,
                    xy=(1.0, middle),
                    xycoords=("axes fraction", "data"),
                    xytext=(3, 0),
                    textcoords="offset points",
                    ha="left",
                    va="center",
                    rotation=-90,
                    fontsize=font + 1,
                    fontweight="bold",
                )
            start += count
