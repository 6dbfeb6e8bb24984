"""The GPU-pair matrix: its schedule, parallel rounds, CSV, and the matplotlib heatmap decoded
back (Pillow) and sampled cell by cell."""

from __future__ import annotations

import csv
import io
import itertools
import threading

import matplotlib
import pytest
from PIL import Image
from PIL.Image import Image as PngImage

from agent.probe.render import heatmap
from agent.probe.render.heatmap import Axis
from agent.probe.render.matrix import (
    CSV_COLUMNS,
    MatrixCell,
    format_grid,
    grid,
    matrix_rounds,
    reasons_grid,
    run_matrix,
    to_csv,
)
from agent.probe.render.matrix import (
    heatmap as matrix_heatmap,
)

RGB = tuple[int, int, int]


def decode_png(data: bytes) -> PngImage:
    """The PNG decoded (Pillow, an independent decoder), as RGB; checks it is a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    image.load()
    return image.convert("RGB")


def pixel(image: PngImage, xy: tuple[int, int]) -> RGB:
    value = image.getpixel(xy)
    assert isinstance(value, tuple)
    r, g, b = value[:3]
    return (int(r), int(g), int(b))


def hex_rgb(colour: str) -> RGB:
    return (int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16))


def viridis(x: float) -> RGB:
    r, g, b, _ = matplotlib.colormaps["viridis"](x)
    return (round(r * 255), round(g * 255), round(b * 255))


def close(a: RGB, b: RGB, tolerance: int = 3) -> bool:
    return all(abs(p - q) <= tolerance for p, q in zip(a, b, strict=True))


# --- the schedule -------------------------------------------------------------------------


@pytest.mark.parametrize(("local_n", "remote_n"), [(1, 1), (2, 2), (2, 3), (3, 2), (8, 8), (4, 7)])
def test_every_pair_once_and_no_device_twice_in_a_round(local_n: int, remote_n: int) -> None:
    rounds = matrix_rounds(local_n, remote_n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == sorted(itertools.product(range(local_n), range(remote_n)))
    for r in rounds:
        assert len({i for i, _ in r}) == len(r) == len({j for _, j in r})
    assert len(rounds) == max(local_n, remote_n)


def test_round_r_pairs_local_i_with_remote_i_plus_r() -> None:
    assert matrix_rounds(4, 4)[1] == ((0, 1), (1, 2), (2, 3), (3, 0))


def cell(i: int, j: int, bw: float | None, reason: str = "", size: int = 1 << 20) -> MatrixCell:
    return MatrixCell(i, j, str(i), str(j), size, bw, reason, "why" if reason else "")


def test_a_rounds_pairs_run_in_parallel_and_report_progress() -> None:
    rounds = matrix_rounds(3, 3)
    # each pair waits for the other two of its round: only concurrent pairs get through
    barrier = threading.Barrier(3, timeout=10.0)
    lines: list[str] = []

    def measure(i: int, j: int) -> list[MatrixCell]:
        barrier.wait()
        if (i, j) == (2, 0):
            return [cell(i, j, None, "timeout")]
        return [cell(i, j, 1e9 * (i + 1))]

    cells = run_matrix(rounds, measure, progress=lines.append)
    assert [(c.local, c.remote) for c in cells] == list(itertools.product(range(3), range(3)))
    assert len(lines) == 9
    assert [line.split(":")[0] for line in lines] == [f"pair {k}/9" for k in range(1, 10)]
    assert "pair 9/9: local " in lines[-1]
    assert any(line.endswith("local 2 -> remote 0: FAILED (timeout: why)") for line in lines)
    assert any(line.endswith("local 1 -> remote 1: 2.00 GB/s") for line in lines)


def test_stop_ends_the_matrix_between_rounds() -> None:
    done: list[tuple[int, int]] = []

    def measure(i: int, j: int) -> list[MatrixCell]:
        done.append((i, j))
        return [cell(i, j, 1.0)]

    cells = run_matrix(matrix_rounds(2, 2), measure, stop=lambda: bool(done))
    assert len(cells) == 2 and sorted(done) == [(0, 0), (1, 1)]


# --- CSV and grid -----------------------------------------------------------------------------


def test_csv_has_one_row_per_pair_and_size() -> None:
    cells = [
        cell(0, 0, 12.5e9, size=1 << 20),
        cell(0, 0, 20e9, size=1 << 28),
        cell(0, 1, None, "init_failure", size=1 << 20),
        cell(0, 1, None, "init_failure", size=1 << 28),
    ]
    rows = list(csv.reader(io.StringIO(to_csv(cells))))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert rows[1:] == [
        ["0", "0", "1048576", "1.25e+10", "ok", ""],
        ["0", "0", "268435456", "2e+10", "ok", ""],
        ["0", "1", "1048576", "", "failed", "init_failure"],
        ["0", "1", "268435456", "", "failed", "init_failure"],
    ]


def test_the_grid_takes_the_largest_size_and_fails_a_pair_with_any_failed_size() -> None:
    cells = [
        cell(0, 0, 1e9, size=4),
        cell(0, 0, 3e9, size=8),
        cell(1, 0, 5e9, size=4),
        cell(1, 0, None, "timeout", size=8),
    ]
    assert grid(cells, 2, 2) == [[3e9, None], [None, None]]
    assert format_grid(cells, ["0", "1"], ["0", "1"]).splitlines() == [
        "local\\remote         0        1",
        "           0      3.00     FAIL",
        "           1      FAIL     FAIL",
    ]


# --- the PNG --------------------------------------------------------------------------------


def axis(title: str, n: int, groups: tuple[tuple[str, int], ...] = ()) -> Axis:
    return Axis(title, tuple(str(i) for i in range(n)), groups)


def test_heatmap_cells_are_coloured_failed_red_and_not_measured_grey() -> None:
    values: list[list[float | None]] = [[10e9, 5e9, None], [0.0, None, 2.5e9]]
    reasons = [["", "", "timeout"], ["", "", ""]]
    data = heatmap.heatmap_png(
        values, rows=axis("node-a GPU", 2), cols=axis("node-b GPU", 3), title="t", reasons=reasons
    )
    image = decode_png(data)
    box = heatmap.layout(2, 3, failures=True)
    assert image.size == box.size_px

    def cell(i: int, j: int) -> RGB:  # near the cell's top edge: off the text and the X
        return pixel(image, box.cell_px(i, j, dy=-0.35))

    assert close(cell(0, 0), viridis(1.0))  # the best pair: the top of the scale
    assert close(cell(1, 0), viridis(0.0))  # 0 B/s: the bottom
    assert close(cell(0, 1), viridis(0.5))
    assert cell(0, 2) == hex_rgb(heatmap.FAILURE_FILL)  # failed: red
    assert cell(1, 1) == hex_rgb(heatmap.NOT_MEASURED_FILL)  # no value, no reason: grey
    red = hex_rgb(heatmap.FAILURE_FILL)
    assert all(not close(cell(i, j), red, 40) for i, j in ((0, 0), (1, 0), (0, 1), (1, 2)))
    # the cross over the failed cell, white, between the centre and a corner
    assert close(pixel(image, box.cell_px(0, 2, dx=-0.25, dy=-0.25)), (255, 255, 255), 120)


def ink(image: PngImage, box: heatmap.Layout, i: int, j: int) -> int:
    """Pixels in the middle third of cell (i, j) that differ from its fill: the text."""
    fill = pixel(image, box.cell_px(i, j, dy=-0.35))
    x0, y0 = box.cell_px(i, j, dx=-0.33, dy=-0.2)
    x1, y1 = box.cell_px(i, j, dx=0.33, dy=0.2)
    return sum(
        not close(pixel(image, (x, y)), fill, 30) for x in range(x0, x1) for y in range(y0, y1)
    )


@pytest.mark.parametrize("n", [2, 16, 64])
def test_heatmap_writes_a_value_in_every_measured_cell(n: int) -> None:
    """Legible at every grid size: each measured cell has text in it, the image grows with
    the grid (cells of at least 24 pixels), and it is a real, bounded image."""
    values: list[list[float | None]] = [
        [None if i == j else 263e9 - 3e9 * ((i + j) % 5) for j in range(n)] for i in range(n)
    ]
    groups = (("node-a", n // 2), ("node-b", n - n // 2))
    data = heatmap.heatmap_png(
        values, rows=axis("GPU", n, groups), cols=axis("GPU", n, groups), title="t"
    )
    image = decode_png(data)
    box = heatmap.layout(n, n, failures=False)
    assert image.size == box.size_px
    assert box.cell_in * heatmap.DPI >= 24
    assert image.size[0] < 2000 and image.size[1] < 2000
    for i, j in ((0, 1), (n - 1, 0), (n // 2, n - 1)):
        assert ink(image, box, i, j) > 3, (i, j)
    assert pixel(image, box.cell_px(0, 0, dy=-0.35)) == hex_rgb(heatmap.NOT_MEASURED_FILL)


def test_matrix_heatmap_marks_failures_by_reason() -> None:
    cells = [
        MatrixCell(0, 0, "0", "0", 1 << 20, 2e9),
        MatrixCell(0, 1, "0", "1", 1 << 20, None, "timeout", "t"),
        MatrixCell(1, 0, "1", "0", 1 << 20, None, "gpu_busy", "b"),
    ]
    assert reasons_grid(cells, 2, 2) == [["", "timeout"], ["gpu_busy", ""]]
    image = decode_png(heatmap_of(cells))
    box = heatmap.layout(2, 2, failures=True)
    red = hex_rgb(heatmap.FAILURE_FILL)
    assert pixel(image, box.cell_px(0, 1, dy=-0.35)) == red
    assert pixel(image, box.cell_px(1, 0, dy=-0.35)) == red
    assert pixel(image, box.cell_px(1, 1, dy=-0.35)) == hex_rgb(heatmap.NOT_MEASURED_FILL)
    assert ink(image, box, 0, 1) > 3  # its reason code


def heatmap_of(cells: list[MatrixCell]) -> bytes:
    return matrix_heatmap(cells, ["0", "1"], ["0", "1"], local_node="a", remote_node="b")


def test_reason_codes() -> None:
    assert heatmap.reason_code("timeout") == "TMO"
    assert heatmap.reason_code("wrong_result") == "BAD"
    assert heatmap.reason_code("weird") == "WEIR"


@pytest.mark.parametrize(
    "values", [[], [[]], [[1.0], [1.0, 2.0]]], ids=["no rows", "no columns", "ragged"]
)
def test_heatmap_refuses_a_grid_that_is_not_a_rectangle(values: list[list[float | None]]) -> None:
    with pytest.raises(ValueError, match="rectangle"):
        heatmap.heatmap_png(values, rows=axis("r", 1), cols=axis("c", 1), title="t")


def test_heatmap_refuses_labels_or_groups_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="one label per row"):
        heatmap.heatmap_png([[1.0]], rows=axis("r", 2), cols=axis("c", 1), title="t")
    with pytest.raises(ValueError, match="cover the labels"):
        axis("r", 3, (("a", 1), ("b", 1)))
