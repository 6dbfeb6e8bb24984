"""Backfill: hours of a scenario into a real Prometheus TSDB in seconds.

Every step, every node's exposition comes from the real agent (:func:`tests.lab.agent.
render_once`); each sample gets the node as ``instance`` (as the ServiceMonitor's relabeling
names it), ``job="fabricscope"`` and the step's timestamp, and the whole run is written as
OpenMetrics for ``promtool tsdb create-blocks-from openmetrics``. promtool 2.42 wants
timestamps in seconds and a final ``# EOF``; HELP/TYPE lines are dropped (the OpenMetrics
parser wants a counter family's TYPE without ``_total``; the TSDB keeps no types anyway), so
every family is ``unknown`` to it, which changes nothing for queries.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from tests.lab.agent import render_once
from tests.lab.cluster import Cluster, Timeline, scratch_dir, timeline
from tests.lab.node import healthy_tree, throughput_flags
from tests.lab.scenarios import SCENARIOS, Scenario
from tests.promharness import PROMTOOL
from tests.promharness import start_prometheus as _start_prometheus

log = logging.getLogger(__name__)

JOB = "fabricscope"


def openmetrics_lines(body: bytes, instance: str, ts: float) -> Iterator[str]:
    """The samples of one exposition with ``job``/``instance`` labels and a timestamp."""
    extra = f'instance="{instance}",job="{JOB}"'
    stamp = f"{ts:.3f}".rstrip("0").rstrip(".")
    for line in body.decode().splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series.endswith("}"):
            name, _, labels = series[:-1].partition("{")
            yield (
                f"{name}{{{extra},{labels}}} {value} {stamp}\n"
                if labels
                else (f"{name}{{{extra}}} {value} {stamp}\n")
            )
        else:
            yield f"{series}{{{extra}}} {value} {stamp}\n"


def play_nodes(
    scenario: str, indices: Sequence[int], tl: Timeline, workdir: Path, out: Path
) -> int:
    """Play nodes ``indices`` of ``scenario`` over ``tl``, appending their samples to
    ``out`` (each series in time order); returns the number of samples. Runs in a worker
    process: nodes are independent, so they are split across processes."""
    logging.getLogger("agent").setLevel(logging.WARNING)
    samples = 0
    with Cluster(SCENARIOS[scenario], workdir, workdir / "cache", only=indices) as c:
        flags = throughput_flags(c.nodes)
        with out.open("w") as f:
            for i in range(tl.steps):
                c.advance(tl, i)
                now = tl.at(i)
                for node in c.nodes:
                    body = render_once(node, now, flags[node.name])
                    for line in openmetrics_lines(body, node.name, now):
                        f.write(line)
                        samples += 1
    return samples


def write_openmetrics(
    scenario: Scenario, tl: Timeline, workdir: Path, out: Path, workers: int | None = None
) -> int:
    """Play ``scenario`` over ``tl`` and write one OpenMetrics file; returns its samples."""
    healthy_tree(workdir / "cache")  # once, before the workers copy it
    n = max(1, min(workers or os.cpu_count() or 1, scenario.nodes))
    groups = [list(range(scenario.nodes))[k::n] for k in range(n)]
    parts = [workdir / f"part-{k}.om" for k in range(n)]
    if n == 1:
        samples = play_nodes(scenario.name, groups[0], tl, workdir, parts[0])
    else:
        ctx = multiprocessing.get_context("spawn")  # grpc does not survive fork
        with ProcessPoolExecutor(n, mp_context=ctx) as pool:
            futures = [
                pool.submit(play_nodes, scenario.name, g, tl, workdir, p)
                for g, p in zip(groups, parts, strict=True)
            ]
            samples = sum(f.result() for f in futures)
    with out.open("wb") as f:
        for p in parts:
            with p.open("rb") as src:
                shutil.copyfileobj(src, f)
            p.unlink()
        f.write(b"# EOF\n")
    return samples


def build_tsdb(
    scenario: Scenario,
    hours: float,
    step: float,
    out_dir: Path,
    *,
    end: float | None = None,
) -> Path:
    """Backfill ``hours`` of ``scenario`` at ``step`` seconds into ``out_dir/tsdb``; returns
    that directory (serve it with :func:`start_prometheus`)."""
    tl = timeline(scenario, hours, step, end)
    out_dir.mkdir(parents=True, exist_ok=True)
    om = out_dir / f"{scenario.name}.om.txt"
    t0 = time.perf_counter()
    with scratch_dir() as scratch:
        samples = write_openmetrics(scenario, tl, scratch, om)
    t1 = time.perf_counter()
    tsdb = out_dir / "tsdb"
    result = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"promtool create-blocks-from failed: {result.stderr[-2000:]}")
    om.unlink()
    log.info(
        "%s: %d steps x %d nodes, %d samples rendered in %.1f s, blocks in %.1f s",
        scenario.name,
        tl.steps,
        scenario.nodes,
        samples,
        t1 - t0,
        time.perf_counter() - t1,
    )
    (out_dir / "timeline").write_text(f"{tl.start} {tl.end} {tl.step} {tl.fault_start}\n")
    return tsdb


def read_timeline(out_dir: Path) -> tuple[float, float, float, float]:
    """``(start, end, step, fault_start)`` of the run backfilled into ``out_dir``."""
    start, end, step, fault = (float(x) for x in (out_dir / "timeline").read_text().split())
    return start, end, step, fault


@contextmanager
def start_prometheus(tsdb_dir: Path) -> Iterator[str]:
    """A real Prometheus serving the backfilled blocks; yields its URL."""
    with _start_prometheus(tsdb_dir.parent / "prometheus", [], tsdb_path=tsdb_dir) as prom:
        yield prom.url
