"""The probe against nccl-tests, size by size: reads nccl-tests logs, runs the probe at the
same sizes (``timing`` auto, the default, and graph and eager beside it), and writes a ratio
table (markdown + JSON). Driven by ``scripts/gpu_probe_accuracy.sh`` on a GPU machine.

    python bench/probe_accuracy.py --nccl-tests-dir DIR --out OUT [--backend nccl]
        [--sizes 8K,...,64M] [--ranks 2] [--timings auto,graph,eager] [--heatmap]

``DIR`` holds ``all_reduce_perf.log``, ``sendrecv_perf.log`` and optionally
``latency_perf.log`` (all_reduce_perf at 8 bytes), run over as many ranks as ``--ranks``.
The ratio is nccl-tests' time over the probe's (= the probe's busbw over nccl-tests': one
formula on both sides), so it also reads at one rank, where all_reduce has no bus
bandwidth. all_reduce is compared with nccl-tests' in-place column, sendrecv with the
out-of-place one (the probe's sendrecv receives into a second buffer).

``--ranks 1`` is the one-GPU timing check: the same collective on the same GPU and NCCL
(sendrecv to itself: a copy through NCCL's kernel), which tests the timing method at every
size but not the fabric; all_reduce on one rank moves nothing, so it is shown, not judged.

Exit status 0 when every size >= 1 MiB is within 10 % of nccl-tests under the probe's default
timing (``auto``), else 1. Smaller sizes are shown against a 20 % mark but fail the run only
when the probe has no figure for them: there both sides time mostly the host's cost of
launching a call, which differs between nccl-tests' C and the probe's Python (the docs give
the measured figures).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.probe.measure.formulas import busbw
from agent.probe.measure.launch import run_local
from agent.probe.measure.records import SpecError, WorkerSpec

MiB = 1 << 20
#: the issue's targets: |probe / nccl-tests - 1| at or above 1 MiB, and below
TOLERANCE_LARGE = 0.10
TOLERANCE_SMALL = 0.20


#: which nccl-tests column each probe kind is compared with: the probe's all_reduce is in
#: place (one buffer), its sendrecv sends one buffer and receives into another
COLUMN = {"all_reduce": "in-place", "sendrecv": "out-of-place", "latency": "in-place"}


@dataclass(frozen=True, slots=True)
class Row:
    """One nccl-tests result: size in bytes, time (us) and busbw (GB/s) of one column."""

    size: int
    time_us: float
    busbw_gbps: float


def parse_nccl_tests(text: str, column: str = "in-place") -> dict[int, Row]:
    """One column (``in-place`` or ``out-of-place``) of every data row of an nccl-tests
    ``*_perf`` log, by size. Works for the old layout (``error`` column, ``N/A``) and the
    new (``#wrong``, a root column): a data row starts with the size and ends with
    ``time algbw busbw error`` twice (out-of-place, then in-place). Comment, NCCL INFO and
    summary lines are skipped."""
    if column not in ("in-place", "out-of-place"):
        raise ValueError(f"column {column!r} is not in-place or out-of-place")
    end = -1 if column == "in-place" else -5
    rows: dict[int, Row] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 12 or not fields[0].isdigit() or not fields[1].isdigit():
            continue
        try:
            time_us, _algbw, busbw = (float(f) for f in fields[end - 3 : end])
        except ValueError:
            continue
        rows[int(fields[0])] = Row(int(fields[0]), time_us, busbw)
    return rows


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def probe(
    kind: str, sizes: tuple[int, ...], backend: str, timing: str, ranks: int = 2
) -> dict[int, float]:
    """Time in us of one iteration per size of one probe over ``ranks`` local ranks."""
    try:
        spec = WorkerSpec(
            kind=kind,
            rank=0,
            world_size=ranks,
            master_addr="127.0.0.1",
            master_port=0,
            backend=backend,
            sizes=sizes,
            timing=timing,
            max_seconds_per_size=None if backend == "nccl" else 0.5,
            timeout_seconds=120.0,
        )
    except SpecError as exc:  # gloo has no send to itself at one rank
        print(f"# probe {kind}: not run: {exc}", file=sys.stderr)
        return {}
    out: dict[int, float] = {}
    for rec in run_local(spec, ranks):
        if rec.error is not None:
            print(f"# probe {kind} {timing} {rec.size_bytes}: {rec.error}", file=sys.stderr)
            continue
        if rec.time_seconds is not None:
            out[rec.size_bytes] = rec.time_seconds * 1e6
    return out


def busbw_gbps(kind: str, size: int, time_us: float | None, ranks: int) -> float | None:
    """nccl-tests' busbw (GB/s) of one iteration of ``time_us``."""
    if time_us is None or not time_us > 0:
        return None
    return busbw(kind, size, time_us * 1e-6, ranks) / 1e9


def speed_ratio(reference_us: float | None, probe_us: float | None) -> float | None:
    """nccl-tests' time over the probe's: the probe's bandwidth over nccl-tests'."""
    if reference_us is None or probe_us is None or not reference_us > 0 or not probe_us > 0:
        return None
    return reference_us / probe_us


def within(size: int, ratio: float | None) -> bool:
    if ratio is None:
        return False
    return abs(ratio - 1) <= (TOLERANCE_LARGE if size >= MiB else TOLERANCE_SMALL)


def table(
    reference: dict[str, dict[int, Row]],
    measured: dict[tuple[str, str], dict[int, float]],
    sizes: tuple[int, ...],
    ranks: int = 2,
) -> tuple[str, list[dict[str, object]], bool]:
    """The markdown table, the JSON rows, and whether every ratio of the default timing
    (``auto``) is on target. ``measured``: the probe's time in us per (kind, timing) and
    size. At one rank all_reduce moves nothing (both sides time an empty call): its rows are
    shown, not judged."""
    lines = [
        "| collective | size | nccl-tests us | busbw GB/s | probe us | busbw | ratio "
        "| graph us | eager us | on target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows: list[dict[str, object]] = []
    ok = True
    for kind in ("all_reduce", "sendrecv"):
        ref = reference.get(kind, {})
        judged = not (kind == "all_reduce" and ranks == 1)
        for size in sizes:
            r = ref.get(size)
            ref_us = r.time_us if r else None
            us = {t: measured.get((kind, t), {}).get(size) for t in ("auto", "graph", "eager")}
            ratio = speed_ratio(ref_us, us["auto"])
            hit = within(size, ratio) if judged else None
            # below 1 MiB the table reports a ratio (the docs say why they differ); a size the
            # probe has no figure for fails at any size: it did not run
            if size >= MiB or (judged and us["auto"] is None):
                ok &= hit is not False
            rows.append(
                {
                    "collective": kind,
                    "size_bytes": size,
                    "ranks": ranks,
                    "nccl_tests_column": COLUMN[kind],
                    "nccl_tests_time_us": ref_us,
                    "nccl_tests_busbw_gbps": r.busbw_gbps if r else None,
                    "probe_time_us": us["auto"],
                    "probe_busbw_gbps": busbw_gbps(kind, size, us["auto"], ranks),
                    "ratio": ratio,
                    "probe_graph_time_us": us["graph"],
                    "ratio_graph": speed_ratio(ref_us, us["graph"]),
                    "probe_eager_time_us": us["eager"],
                    "ratio_eager": speed_ratio(ref_us, us["eager"]),
                    "on_target": hit,
                }
            )
            verdict = "(one rank: no work)" if hit is None else "yes" if hit else "NO"
            lines.append(
                f"| {kind} | {_size(size)} | {_f(ref_us)} | {_f(r.busbw_gbps if r else None)} "
                f"| {_f(us['auto'])} | {_f(busbw_gbps(kind, size, us['auto'], ranks))} "
                f"| {_f(ratio, 3)} | {_f(us['graph'])} | {_f(us['eager'])} | {verdict} |"
            )
    lat_ref = reference.get("latency", {}).get(8)
    lat = {t: measured.get(("latency", t), {}).get(8) for t in ("auto", "graph", "eager")}
    if lat_ref is not None or any(v is not None for v in lat.values()):
        ratio = speed_ratio(lat_ref.time_us if lat_ref else None, lat["auto"])
        lines.append(
            f"| latency (all_reduce) | 8 B | {_f(lat_ref.time_us if lat_ref else None)} | "
            f"| {_f(lat['auto'])} | | {_f(ratio, 3)} | {_f(lat['graph'])} | {_f(lat['eager'])} "
            "| (not a target) |"
        )
        rows.append(
            {
                "collective": "latency",
                "ranks": ranks,
                "nccl_tests_time_us": lat_ref.time_us if lat_ref else None,
                "probe_time_us": lat["auto"],
                "probe_graph_time_us": lat["graph"],
                "probe_eager_time_us": lat["eager"],
                "ratio": ratio,
            }
        )
    return "\n".join(lines), rows, ok


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _size(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def device_count(backend: str) -> int:
    """GPUs of this host (NCCL), or 2 CPU slots (gloo)."""
    if backend != "nccl":
        return 2
    import torch

    return int(torch.cuda.device_count())


def heatmap(out: Path, backend: str) -> None:
    """A GPU x GPU sendrecv heatmap of every GPU of this host (64 MiB; a GPU with itself not
    measured). sendrecv between two ranks is an exchange (each sends to and receives from
    the other), so each pair is measured once and shown in both cells."""
    import socket

    from agent.probe.render.heatmap import Axis, heatmap_png

    n = device_count(backend)
    values: list[list[float | None]] = [[None] * n for _ in range(n)]
    reasons = [[""] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            spec = WorkerSpec(
                kind="sendrecv",
                rank=0,
                world_size=2,
                master_addr="127.0.0.1",
                master_port=0,
                backend=backend,
                devices=(i, j),
                sizes=(64 * MiB,) if backend == "nccl" else (1 * MiB,),
            )
            (rec,) = run_local(spec, 2)[-1:]
            values[i][j] = values[j][i] = rec.busbw_bytes_per_second
            reasons[i][j] = reasons[j][i] = rec.reason or ""
    host = socket.gethostname()
    labels = tuple(str(i) for i in range(n))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    size = "64 MiB" if backend == "nccl" else "1 MiB"
    device = "GPU" if backend == "nccl" else "CPU slot"  # as the --matrix heatmap says
    png = heatmap_png(
        values,
        rows=Axis(f"{host} {device} (rank 0)", labels),
        cols=Axis(f"{host} {device} (rank 1)", labels),
        title=f"sendrecv busbw per {device} pair, {size}, {backend}\n{host}, {when}",
        reasons=reasons,
    )
    (out / "heatmap.png").write_bytes(png)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nccl-tests-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    p.add_argument("--sizes", default="8K,16K,32K,64K,128K,256K,512K,1M,2M,4M,8M,16M,32M,64M")
    p.add_argument("--timings", default="auto,graph,eager", help="auto (host) is judged")
    p.add_argument("--ranks", type=int, default=2, help="local ranks (1: one-GPU timing check)")
    p.add_argument("--heatmap", action="store_true")
    ns = p.parse_args(argv)
    if ns.ranks < 1 or (ns.heatmap and ns.ranks < 2):
        p.error("--ranks must be >= 1, and >= 2 with --heatmap")
    sizes = tuple(parse_size(s) for s in ns.sizes.split(","))
    reference: dict[str, dict[int, Row]] = {}
    for kind, name in (
        ("all_reduce", "all_reduce_perf.log"),
        ("sendrecv", "sendrecv_perf.log"),
        ("latency", "latency_perf.log"),
    ):
        path = ns.nccl_tests_dir / name
        if path.exists():
            reference[kind] = parse_nccl_tests(path.read_text(), COLUMN[kind])
    measured: dict[tuple[str, str], dict[int, float]] = {}
    for timing in ns.timings.split(","):
        for kind in ("all_reduce", "sendrecv", "latency"):
            t0 = time.monotonic()
            measured[(kind, timing)] = probe(
                kind, (8,) if kind == "latency" else sizes, ns.backend, timing, ns.ranks
            )
            print(f"# probe {kind} {timing}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    text, rows, ok = table(reference, measured, sizes, ns.ranks)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "accuracy.md").write_text(text + "\n")
    (ns.out / "accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
    if ns.heatmap:
        heatmap(ns.out, ns.backend)
    print(f"# on target (auto timing, {ns.ranks} rank(s)): {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
