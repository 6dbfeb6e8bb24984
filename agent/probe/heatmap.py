"""A bandwidth heatmap as a PNG, written with the standard library only (zlib, struct).

:func:`heatmap_png` draws one square cell per (row, column): a measured value is coloured by
its ratio to the best value in the grid (a viridis-like ramp, dark purple for ~0, yellow for
the best), a failure (``None``) is solid red crossed by a white X, so a failed pair never
reads as a slow one. Row and column indices are drawn in a 3x5 pixel digit font. Pure: it
returns the PNG's bytes; the caller writes them.

PNG layout (RFC 2083): the 8-byte signature, then chunks ``length | type | data | crc32``:
IHDR (width, height, bit depth 8, colour type 2 = RGB, compression 0, filter 0, interlace 0),
one IDAT holding the zlib stream of the scanlines (each prefixed by filter type 0), IEND.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"

RGB = tuple[int, int, int]

BACKGROUND: RGB = (255, 255, 255)
TEXT: RGB = (40, 40, 40)
FAILURE: RGB = (214, 39, 40)
FAILURE_MARK: RGB = (255, 255, 255)
#: viridis at 0, 0.25, 0.5, 0.75, 1 (matplotlib's table, rounded)
RAMP: tuple[RGB, ...] = (
    (68, 1, 84),
    (59, 82, 139),
    (33, 145, 140),
    (94, 201, 98),
    (253, 231, 37),
)

# 3x5 digits, one string of 3 columns per row ("#" is ink)
_DIGITS: dict[str, tuple[str, ...]] = {
    "0": ("###", "#.#", "#.#", "#.#", "###"),
    "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"),
    "3": ("###", "..#", "###", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"),
    "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"),
    "7": ("###", "..#", ".#.", ".#.", ".#."),
    "8": ("###", "#.#", "###", "#.#", "###"),
    "9": ("###", "#.#", "###", "..#", "###"),
}
_SCALE = 2  # font pixels per glyph pixel
_GLYPH_W = 3 * _SCALE
_GLYPH_H = 5 * _SCALE
_GAP = 1  # grid line between cells, background coloured


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack("!I", len(data)) + body + struct.pack("!I", zlib.crc32(body) & 0xFFFFFFFF)


def png_bytes(width: int, height: int, rows: Sequence[bytes]) -> bytes:
    """An 8-bit RGB PNG of ``height`` scanlines of ``3 * width`` bytes each."""
    if width < 1 or height < 1 or len(rows) != height:
        raise ValueError(f"need {height} rows for a {width}x{height} image, got {len(rows)}")
    if any(len(r) != 3 * width for r in rows):
        raise ValueError(f"every row must hold {3 * width} bytes (RGB)")
    raw = b"".join(b"\x00" + r for r in rows)
    header = struct.pack("!IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


def ramp(ratio: float) -> RGB:
    """The colour of ``ratio`` (clamped to 0..1) on :data:`RAMP`, linearly interpolated."""
    r = min(1.0, max(0.0, ratio)) * (len(RAMP) - 1)
    i = min(int(r), len(RAMP) - 2)
    t = r - i
    a, b = RAMP[i], RAMP[i + 1]
    return (
        round(a[0] + (b[0] - a[0]) * t),
        round(a[1] + (b[1] - a[1]) * t),
        round(a[2] + (b[2] - a[2]) * t),
    )


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.px = [bytearray(bytes(BACKGROUND) * width) for _ in range(height)]

    def put(self, x: int, y: int, colour: RGB) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self.px[y][3 * x : 3 * x + 3] = bytes(colour)

    def fill(self, x0: int, y0: int, w: int, h: int, colour: RGB) -> None:
        line = bytes(colour) * w
        for y in range(y0, y0 + h):
            self.px[y][3 * x0 : 3 * (x0 + w)] = line

    def text(self, x0: int, y0: int, label: str) -> None:
        for k, ch in enumerate(label):
            glyph = _DIGITS.get(ch)
            if glyph is None:
                continue
            gx = x0 + k * (_GLYPH_W + _SCALE)
            for gy, row in enumerate(glyph):
                for cx, ink in enumerate(row):
                    if ink == "#":
                        self.fill(gx + cx * _SCALE, y0 + gy * _SCALE, _SCALE, _SCALE, TEXT)

    def rows(self) -> list[bytes]:
        return [bytes(r) for r in self.px]


def _text_width(label: str) -> int:
    return len(label) * (_GLYPH_W + _SCALE) - _SCALE if label else 0


def cell_colour(value: float | None, best: float) -> RGB:
    """A cell's fill: :data:`FAILURE` for None, else the ramp at ``value / best``."""
    if value is None:
        return FAILURE
    return ramp(value / best if best > 0 else 0.0)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where things are in a heatmap image: its size, the grid's top-left corner (after the
    label margins) and the cell size."""

    width: int
    height: int
    left: int
    top: int
    cell: int

    def cell_origin(self, row: int, col: int) -> tuple[int, int]:
        """(x, y) of the top-left pixel of cell (row, col)."""
        return (
            self.left + _GAP + col * (self.cell + _GAP),
            self.top + _GAP + row * (self.cell + _GAP),
        )


def layout(row_labels: Sequence[str], col_labels: Sequence[str], cell: int = 24) -> Layout:
    """The layout of a heatmap with these labels (one per row and column)."""
    left = max(_text_width(s) for s in row_labels) + 6
    top = _GLYPH_H + 6
    return Layout(
        width=left + len(col_labels) * (cell + _GAP) + _GAP,
        height=top + len(row_labels) * (cell + _GAP) + _GAP,
        left=left,
        top=top,
        cell=cell,
    )


def heatmap_png(
    values: Sequence[Sequence[float | None]],
    *,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    cell: int = 24,
) -> bytes:
    """The grid ``values[row][col]`` as a PNG (``None``: a failed cell, red with a white X).

    Labels default to the row and column indices; only digits are drawn.
    """
    n_rows = len(values)
    n_cols = len(values[0]) if n_rows else 0
    if n_rows == 0 or n_cols == 0 or any(len(r) != n_cols for r in values):
        raise ValueError("the grid must be a non-empty rectangle")
    if cell < 5:
        raise ValueError("cells must be at least 5 pixels wide")
    rows_l = list(row_labels) if row_labels is not None else [str(i) for i in range(n_rows)]
    cols_l = list(col_labels) if col_labels is not None else [str(j) for j in range(n_cols)]
    if len(rows_l) != n_rows or len(cols_l) != n_cols:
        raise ValueError("one label per row and per column")
    box = layout(rows_l, cols_l, cell)
    canvas = _Canvas(box.width, box.height)
    measured = [v for r in values for v in r if v is not None]
    best = max(measured) if measured else 0.0
    for j, label in enumerate(cols_l):
        x0, _ = box.cell_origin(0, j)
        canvas.text(x0 + (cell - _text_width(label)) // 2, 3, label)
    for i, label in enumerate(rows_l):
        _, y0 = box.cell_origin(i, 0)
        canvas.text(box.left - 3 - _text_width(label), y0 + (cell - _GLYPH_H) // 2, label)
        for j, value in enumerate(values[i]):
            x0, y0 = box.cell_origin(i, j)
            canvas.fill(x0, y0, cell, cell, cell_colour(value, best))
            if value is None:
                for d in range(2, cell - 2):
                    for t in (0, 1):  # two pixels thick
                        canvas.put(x0 + d + t, y0 + d, FAILURE_MARK)
                        canvas.put(x0 + cell - 1 - d - t, y0 + d, FAILURE_MARK)
    return png_bytes(box.width, box.height, canvas.rows())
