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
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.lab.agent import render_once
from tests.lab.cluster import Cluster, Timeline, make_scratch, timeline
from tests.lab.node import healthy_tree, throughput_flags
from tests.lab.scenarios import ALL_SCENARIOS, Scenario
from tests.promharness import PROMTOOL, backfill_recording_rules
from tests.promharness import start_prometheus as _start_prometheus

log = logging.getLogger(__name__)

JOB = "fabricscope"
FLEET_RULES = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "fleet.rules.yaml"
#: the run the CI tests share (tests/deploy/test_dashboards.py,
#: tests/explain/test_explain_lab.py): 45 minutes at one-minute steps, the cause from minute
#: 18 on; built once per session
TEST_HOURS = 0.75
TEST_STEP = 60.0


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
    with Cluster(ALL_SCENARIOS[scenario], workdir, workdir / "cache", only=indices) as c:
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


def _spawn_pool(workers: int) -> ProcessPoolExecutor:
    ctx = multiprocessing.get_context("spawn")  # grpc does not survive fork
    return ProcessPoolExecutor(workers, mp_context=ctx)


@dataclass
class Build:
    """A backfill under way: its nodes rendering (in ``pool`` or already done), then
    :meth:`finish` writes the blocks."""

    scenario: Scenario
    tl: Timeline
    out_dir: Path
    scratch: Path
    parts: list[Path]
    futures: list[Future[int]]
    t0: float

    def finish(self) -> Path:
        """Wait for the nodes, write the blocks into ``out_dir/tsdb``; returns that path."""
        tsdb = self.out_dir / "tsdb"
        try:
            samples = sum(f.result() for f in self.futures)
            om = self.scratch / f"{self.scenario.name}.om.txt"
            with om.open("wb") as f:
                for p in self.parts:
                    with p.open("rb") as src:
                        shutil.copyfileobj(src, f)
                    p.unlink()
                f.write(b"# EOF\n")
            t1 = time.perf_counter()
            result = subprocess.run(
                [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        if result.returncode != 0:
            raise RuntimeError(f"promtool create-blocks-from failed: {result.stderr[-2000:]}")
        tl = self.tl
        # the Fleet dashboard reads the per-node series these rules record every minute
        t2 = time.perf_counter()
        backfill_recording_rules(tsdb, [FLEET_RULES], tl.start, tl.end)
        log.info(
            "%s: %d steps x %d nodes, %d samples rendered in %.1f s, blocks in %.1f s, "
            "recording rules in %.1f s",
            self.scenario.name,
            tl.steps,
            self.scenario.nodes,
            samples,
            t1 - self.t0,
            t2 - t1,
            time.perf_counter() - t2,
        )
        (self.out_dir / "timeline").write_text(f"{tl.start} {tl.end} {tl.step} {tl.fault_start}\n")
        return tsdb


def start_build(
    scenario: Scenario,
    hours: float,
    step: float,
    out_dir: Path,
    pool: ProcessPoolExecutor,
    *,
    end: float | None = None,
) -> Build:
    """Submit every node of ``scenario`` to ``pool`` (one task per node, so a pool shared by
    several scenarios stays busy); :meth:`Build.finish` completes it."""
    tl = timeline(scenario, hours, step, end)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = make_scratch()  # removed by finish()
    healthy_tree(scratch / "cache")  # once, before the workers copy it
    parts = [scratch / f"part-{i}.om" for i in range(scenario.nodes)]
    futures = [
        pool.submit(play_nodes, scenario.name, [i], tl, scratch, part)
        for i, part in enumerate(parts)
    ]
    return Build(scenario, tl, out_dir, scratch, parts, futures, time.perf_counter())


def build_tsdb(
    scenario: Scenario,
    hours: float,
    step: float,
    out_dir: Path,
    *,
    end: float | None = None,
    workers: int | None = None,
) -> Path:
    """Backfill ``hours`` of ``scenario`` at ``step`` seconds into ``out_dir/tsdb``; returns
    that directory (serve it with :func:`start_prometheus`)."""
    n = max(1, min(workers or os.cpu_count() or 1, scenario.nodes))
    with _spawn_pool(n) as pool:
        return start_build(scenario, hours, step, out_dir, pool, end=end).finish()


def read_timeline(out_dir: Path) -> tuple[float, float, float, float]:
    """``(start, end, step, fault_start)`` of the run backfilled into ``out_dir``."""
    start, end, step, fault = (float(x) for x in (out_dir / "timeline").read_text().split())
    return start, end, step, fault


@contextmanager
def start_prometheus(tsdb_dir: Path) -> Iterator[str]:
    """A real Prometheus serving the backfilled blocks; yields its URL."""
    with _start_prometheus(tsdb_dir.parent / "prometheus", [], tsdb_path=tsdb_dir) as prom:
        yield prom.url


@dataclass(frozen=True, slots=True)
class ServedScenario:
    """A backfilled scenario a real Prometheus serves at ``url``; times in unix seconds."""

    scenario: Scenario
    url: str
    start: float
    end: float
    step: float
    fault_start: float
    tsdb: Path  # a copy of its blocks as built (raw series and fleet recording rules')


class ScenarioCache:
    """Each scenario backfilled once per (scenario, hours, step) and served until
    :meth:`close`: the test files that query the same scenarios (dashboards, explain) share
    one build and one Prometheus per scenario (``tests/conftest.py``'s ``lab_cache``).
    One worker pool renders every build; :meth:`prefetch` queues builds so the workers
    render the next scenario while promtool writes the blocks of this one."""

    def __init__(self, workdir: Path, workers: int | None = None) -> None:
        self._workdir = workdir
        self._workers = workers or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None
        self._pending: dict[tuple[str, float, float], Build] = {}
        self._served: dict[tuple[str, float, float], ServedScenario] = {}
        self._stack = ExitStack()

    def prefetch(self, names: Sequence[str], hours: float, step: float) -> None:
        """Start building ``names`` (those not built or under way) in the background."""
        for name in names:
            key = (name, hours, step)
            if key in self._served or key in self._pending:
                continue
            if self._pool is None:
                self._pool = self._stack.enter_context(_spawn_pool(self._workers))
            out = self._workdir / f"{name}-{hours:g}h-{step:g}s"
            self._pending[key] = start_build(ALL_SCENARIOS[name], hours, step, out, self._pool)

    def get(self, name: str, hours: float, step: float) -> ServedScenario:
        key = (name, hours, step)
        served = self._served.get(key)
        if served is None:
            self.prefetch([name], hours, step)
            build = self._pending.pop(key)
            tsdb = build.finish()
            start, end, step_, fault = read_timeline(build.out_dir)
            # the blocks as built, for other readers (vmctl): the serving Prometheus compacts
            # its directory (the recording rules' blocks overlap the raw ones) under them
            blocks = build.out_dir / "blocks"
            shutil.copytree(tsdb, blocks)
            url = self._stack.enter_context(start_prometheus(tsdb))
            served = self._served[key] = ServedScenario(
                ALL_SCENARIOS[name], url, start, end, step_, fault, blocks
            )
        return served

    def close(self) -> None:
        for build in self._pending.values():
            for f in build.futures:
                f.cancel()
        self._stack.close()
        for build in self._pending.values():
            shutil.rmtree(build.scratch, ignore_errors=True)
        self._pending.clear()

    def __enter__(self) -> ScenarioCache:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
