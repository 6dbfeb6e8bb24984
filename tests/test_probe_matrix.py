"""The GPU-pair matrix: its schedule, parallel rounds, CSV, and the stdlib PNG heatmap decoded
back byte by byte."""

from __future__ import annotations

import csv
import io
import itertools
import struct
import threading
import zlib

import pytest

from agent.probe import heatmap
from agent.probe.matrix import (
    CSV_COLUMNS,
    MatrixCell,
    format_grid,
    grid,
    matrix_rounds,
    run_matrix,
    to_csv,
)

RGB = tuple[int, int, int]


def decode_png(data: bytes) -> tuple[int, int, list[list[RGB]]]:
    """(width, height, pixels) of an 8-bit RGB, non-interlaced, filter-0 PNG; checks the
    signature, every chunk's CRC and the IHDR fields on the way."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack("!I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack("!I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append((kind, body))
        pos += 12 + length
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour, comp, filt, interlace = struct.unpack("!IIBBBBB", chunks[0][1])
    assert (depth, colour, comp, filt, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(chunks[1][1])
    stride = 1 + 3 * width
    assert len(raw) == height * stride
    pixels = []
    for y in range(height):
        line = raw[y * stride : (y + 1) * stride]
        assert line[0] == 0  # filter type None
        pixels.append([(line[1 + 3 * x], line[2 + 3 * x], line[3 + 3 * x]) for x in range(width)])
    return width, height, pixels


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


def test_heatmap_is_a_valid_png_with_failures_in_red_and_the_best_in_yellow() -> None:
    values: list[list[float | None]] = [[10.0, 5.0, None], [0.0, None, 2.5]]
    data = heatmap.heatmap_png(values, cell=12)
    width, height, pixels = decode_png(data)
    box = heatmap.layout(["0", "1"], ["0", "1", "2"], 12)
    assert (width, height) == (box.width, box.height)

    def centre(i: int, j: int) -> RGB:
        x, y = box.cell_origin(i, j)
        return pixels[y + 1][x + box.cell // 2]  # on the cell, off the failure X

    assert centre(0, 0) == heatmap.RAMP[-1]  # the best pair
    assert centre(1, 0) == heatmap.RAMP[0]  # 0 B/s
    assert centre(0, 1) == heatmap.ramp(0.5)
    assert centre(0, 2) == centre(1, 1) == heatmap.FAILURE
    x, y = box.cell_origin(0, 2)
    assert pixels[y + box.cell // 2][x + box.cell // 2] == heatmap.FAILURE_MARK  # the X
    measured = {centre(0, 0), centre(1, 0), centre(0, 1), centre(1, 2)}
    assert heatmap.FAILURE not in measured  # a failure never looks like a slow pair


def test_heatmap_draws_the_labels() -> None:
    _, _, pixels = decode_png(heatmap.heatmap_png([[1.0]], row_labels=["7"], col_labels=["3"]))
    ink = sum(px == heatmap.TEXT for row in pixels for px in row)
    assert ink == 2 * 2 * (7 + 11)  # "7" and "3" have 7 and 11 glyph pixels, drawn 2x2


def test_ramp_is_clamped_and_interpolated() -> None:
    assert heatmap.ramp(-1.0) == heatmap.RAMP[0]
    assert heatmap.ramp(2.0) == heatmap.RAMP[-1]
    assert heatmap.ramp(0.25) == heatmap.RAMP[1]
    assert heatmap.ramp(0.125) == tuple(
        round((a + b) / 2) for a, b in zip(heatmap.RAMP[0], heatmap.RAMP[1], strict=True)
    )


@pytest.mark.parametrize(
    "values", [[], [[]], [[1.0], [1.0, 2.0]]], ids=["no rows", "no columns", "ragged"]
)
def test_heatmap_refuses_a_grid_that_is_not_a_rectangle(values: list[list[float | None]]) -> None:
    with pytest.raises(ValueError, match="rectangle"):
        heatmap.heatmap_png(values)


def test_png_bytes_checks_row_sizes() -> None:
    with pytest.raises(ValueError):
        heatmap.png_bytes(2, 1, [b"\x00" * 5])
    width, height, pixels = decode_png(heatmap.png_bytes(1, 2, [b"\x01\x02\x03", b"\x04\x05\x06"]))
    assert (width, height, pixels) == (1, 2, [[(1, 2, 3)], [(4, 5, 6)]])
