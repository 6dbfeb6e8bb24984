"""The GPU-pair matrix between this node and a peer: every (local GPU, remote GPU) pair's
sendrecv bandwidth, measured round by round with disjoint pairs in parallel.

Round ``r`` pairs local position ``i`` with remote position ``(i + r) mod M`` where
``M = max(L, R)`` (``L`` local and ``R`` remote devices), leaving out positions a node does
not have: every pair is measured exactly once in ``M`` rounds, and no device is in two pairs
of a round, so each pair runs in its own 2-rank world (its own store and port) next to the
others without sharing a GPU. What a pair measures is the caller's ``measure(i, j)``; this
module schedules, reports progress, and turns the cells into CSV and a heatmap.
"""

from __future__ import annotations

import csv
import io
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.probe.render.heatmap import Axis, heatmap_png

CSV_COLUMNS = (
    "local_gpu",
    "remote_gpu",
    "size_bytes",
    "busbw_bytes_per_second",
    "status",
    "reason",
)


@dataclass(frozen=True, slots=True)
class MatrixCell:
    """One pair at one message size. ``local``/``remote`` are positions in the two nodes'
    device lists; ``local_gpu``/``remote_gpu`` their labels (NVML index, CPU slot).
    ``busbw_bytes_per_second`` is None when ``reason`` says why the pair failed."""

    local: int
    remote: int
    local_gpu: str
    remote_gpu: str
    size_bytes: int
    busbw_bytes_per_second: float | None
    reason: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason and self.busbw_bytes_per_second is not None


def matrix_rounds(local_n: int, remote_n: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Disjoint ``(local, remote)`` pairs per round, covering every pair exactly once."""
    if local_n < 1 or remote_n < 1:
        raise ValueError("both nodes need at least one device")
    m = max(local_n, remote_n)
    rounds = []
    for r in range(m):
        pairs = tuple((i, (i + r) % m) for i in range(local_n) if (i + r) % m < remote_n)
        if pairs:
            rounds.append(pairs)
    return tuple(rounds)


def run_matrix(
    rounds: Sequence[Sequence[tuple[int, int]]],
    measure: Callable[[int, int], Sequence[MatrixCell]],
    *,
    progress: Callable[[str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[MatrixCell]:
    """Measure every round's pairs in parallel (one thread each), round after round, and
    report each finished pair (``"pair 3/16: local 0 -> remote 2: 12.3 GB/s"``). ``stop()``
    is asked between rounds: True ends the matrix early. ``measure`` must not raise."""
    total = sum(len(r) for r in rounds)
    cells: list[MatrixCell] = []
    lock = threading.Lock()
    done = 0

    def one(i: int, j: int) -> None:
        nonlocal done
        got = list(measure(i, j))
        with lock:
            cells.extend(got)
            done += 1
            if progress is not None:
                progress(f"pair {done}/{total}: {describe_pair(i, j, got)}")

    for pairs in rounds:
        if stop is not None and stop():
            break
        threads = [
            threading.Thread(target=one, args=pair, name=f"matrix {pair}", daemon=True)
            for pair in pairs
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return sorted(cells, key=lambda c: (c.local, c.remote, c.size_bytes))


def _gbps(value: float) -> str:
    return f"{value / 1e9:.2f} GB/s"


def describe_pair(i: int, j: int, cells: Sequence[MatrixCell]) -> str:
    """One line for a finished pair: its busbw at the largest size, or why it failed."""
    if not cells:
        return f"local {i} -> remote {j}: no result"
    head = f"local {cells[0].local_gpu} -> remote {cells[0].remote_gpu}"
    last = max(cells, key=lambda c: c.size_bytes)
    if last.ok and last.busbw_bytes_per_second is not None:
        return f"{head}: {_gbps(last.busbw_bytes_per_second)}"
    return f"{head}: FAILED ({last.reason}{': ' + last.detail if last.detail else ''})"


def to_csv(cells: Sequence[MatrixCell]) -> str:
    """The cells as CSV with :data:`CSV_COLUMNS` (status ``ok`` or ``failed``)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in cells:
        bw = "" if c.busbw_bytes_per_second is None else f"{c.busbw_bytes_per_second:.6g}"
        writer.writerow(
            (c.local_gpu, c.remote_gpu, c.size_bytes, bw, "ok" if c.ok else "failed", c.reason)
        )
    return buf.getvalue()


def grid(cells: Sequence[MatrixCell], local_n: int, remote_n: int) -> list[list[float | None]]:
    """``[local][remote]`` busbw at each pair's largest size; None for a failed or missing
    pair (any failed size fails the pair)."""
    out: list[list[float | None]] = [[None] * remote_n for _ in range(local_n)]
    by_pair: dict[tuple[int, int], list[MatrixCell]] = {}
    for c in cells:
        by_pair.setdefault((c.local, c.remote), []).append(c)
    for (i, j), got in by_pair.items():
        if all(c.ok for c in got):
            out[i][j] = max(got, key=lambda c: c.size_bytes).busbw_bytes_per_second
    return out


def reasons_grid(cells: Sequence[MatrixCell], local_n: int, remote_n: int) -> list[list[str]]:
    """``[local][remote]`` the first failure reason of each pair ("" for a measured pair and
    for a pair with no cell: not measured, e.g. a matrix stopped early)."""
    out = [[""] * remote_n for _ in range(local_n)]
    by_pair: dict[tuple[int, int], list[MatrixCell]] = {}
    for c in cells:
        by_pair.setdefault((c.local, c.remote), []).append(c)
    for (i, j), got in by_pair.items():
        out[i][j] = next((c.reason or "crashed" for c in got if not c.ok), "")
    return out


def _size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def heatmap(
    cells: Sequence[MatrixCell],
    local_labels: Sequence[str],
    remote_labels: Sequence[str],
    *,
    local_node: str = "local",
    remote_node: str = "remote",
    when: str = "",
    device: str = "GPU",
) -> bytes:
    """The matrix as a PNG (:mod:`agent.probe.render.heatmap`): rows are this node's devices,
    columns the peer's; each cell the pair's sendrecv busbw at its largest size, or why it
    failed; the title names the collective, size, nodes and ``when``. ``device`` names what
    the axes count (``GPU``, or ``CPU slot`` under gloo)."""
    sizes = sorted({c.size_bytes for c in cells})
    size = _size_text(sizes[-1]) if sizes else "no size"
    title = f"sendrecv busbw per {device} pair, {size}: {local_node} -> {remote_node}"
    if when:
        title += f"\n{when}"
    return heatmap_png(
        grid(cells, len(local_labels), len(remote_labels)),
        rows=Axis(f"{local_node} {device}", tuple(local_labels)),
        cols=Axis(f"{remote_node} {device}", tuple(remote_labels)),
        title=title,
        reasons=reasons_grid(cells, len(local_labels), len(remote_labels)),
    )


def format_grid(
    cells: Sequence[MatrixCell],
    local_labels: Sequence[str],
    remote_labels: Sequence[str],
) -> str:
    """The matrix as text: busbw in GB/s per pair, ``FAIL`` for failed pairs."""
    values = grid(cells, len(local_labels), len(remote_labels))
    width = 9
    lines = ["local\\remote " + "".join(f"{x:>{width}}" for x in remote_labels)]
    for label, row in zip(local_labels, values, strict=True):
        text = "".join(f"{'FAIL':>{width}}" if v is None else f"{v / 1e9:>{width}.2f}" for v in row)
        lines.append(f"{label:>12} {text}")
    return "\n".join(lines)
