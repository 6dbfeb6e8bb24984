"""Adaptive timing of one message size (agent/probe/measure/timing.py, pure), and the worker timing
adaptively for real over gloo."""

from __future__ import annotations

import pytest

from agent.probe.measure import worker
from agent.probe.measure.launch import run_local
from agent.probe.measure.records import WorkerSpec
from agent.probe.measure.timing import Blocks, TimingPolicy, fastest, spread


def policy(**changes: float) -> TimingPolicy:
    base: dict[str, float] = {"warmup": 5, "iterations": 20, "max_seconds": 1.0}
    base.update(changes)
    return TimingPolicy(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("estimate", "ops"),
    [
        (10e-6, 500),  # 8 KiB all_reduce on NVLink: 500 x 10 us = the 5 ms block
        (45e-6, 112),  # 1 MiB
        (0.5e-3, 20),  # 64 MiB: the spec's 20 iterations already last 10 ms
        (1e-9, 1000),  # capped: one graph holds at most 1000 collectives
        (0.0, 1000),  # a nonsense estimate takes the cap, never a division by zero
        (float("nan"), 1000),
    ],
)
def test_block_size_fills_the_target_block(estimate: float, ops: int) -> None:
    assert policy().block_ops(estimate) == ops


def test_the_fixed_method_is_one_block_of_the_spec_iterations() -> None:
    fixed = policy(max_seconds=0.0)
    assert not fixed.adaptive
    assert fixed.block_ops(10e-6) == 20
    blocks = Blocks(fixed, 20)
    assert not blocks.done(0.0)
    blocks.add(2e-3)
    assert blocks.done(0.0)
    assert (blocks.result(), blocks.timed_iterations(), blocks.run_iterations()) == (2e-3, 20, 20)


def test_blocks_stop_once_the_last_three_agree_and_use_only_those() -> None:
    """A GPU warming up: slow first blocks (clocks ramping, first graph launch), then three
    within 2 %. The result is their median; everything before counts as warm-up."""
    blocks = Blocks(policy(), 100)
    for mean in (30e-6, 14e-6, 10.3e-6, 10.1e-6):
        blocks.add(mean)
        assert not blocks.done(0.01)
    blocks.add(10.2e-6)
    assert blocks.stable
    assert blocks.done(0.01)
    assert blocks.result() == pytest.approx(10.2e-6)
    assert blocks.timed_iterations() == 300
    assert blocks.run_iterations() == 500


def test_blocks_stop_at_the_time_cap_when_never_stable() -> None:
    blocks = Blocks(policy(max_seconds=0.5), 10)
    for mean in (1.0, 2.0, 1.0, 2.0):
        blocks.add(mean)
        assert not blocks.done(0.4)
    assert blocks.done(0.5)
    assert blocks.result() == 2.0  # median of the last three: 2, 1, 2
    assert blocks.timed_iterations() == 30


def _timed(means: tuple[float, ...]) -> Blocks:
    blocks = Blocks(policy(), 100)
    for mean in means:
        blocks.add(mean)
    return blocks


@pytest.mark.parametrize(
    ("graph", "eager", "winner"),
    [
        # one H200, NCCL sending to itself (bench/probe_graph_variants.py, us per call):
        # at 8 KiB the eager loop waits on the CPU, at 64 MiB the graph's stream joins cost
        ((9.3e-6,) * 3, (39.2e-6,) * 3, "graph"),
        ((63.6e-6,) * 3, (43.1e-6,) * 3, "eager"),
        ((10e-6,) * 3, (10e-6,) * 3, "eager"),  # a tie: the first timed
    ],
)
def test_auto_reports_the_faster_method(
    graph: tuple[float, ...], eager: tuple[float, ...], winner: str
) -> None:
    assert fastest({"eager": _timed(eager), "graph": _timed(graph)}) == winner


def test_fastest_needs_a_method() -> None:
    with pytest.raises(ValueError, match="no method"):
        fastest({})


def test_spread_and_empty_blocks() -> None:
    assert spread([1.0, 1.02, 1.01]) == pytest.approx(0.02)
    assert spread([0.0, 1.0]) == float("inf")
    with pytest.raises(ValueError, match="no block"):
        Blocks(policy(), 1).result()


@pytest.mark.parametrize(
    "changes",
    [{"iterations": 0}, {"warmup": -1}, {"max_seconds": -1.0}, {"max_seconds": float("nan")}],
)
def test_policy_refuses_nonsense(changes: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        policy(**changes)


def test_timing_policy_defaults_by_backend() -> None:
    spec = WorkerSpec(kind="all_reduce", rank=0, world_size=2, master_addr="a", master_port=1)
    assert worker.timing_policy(spec, "nccl").adaptive  # GPUs: adaptive, 1 s per size at most
    assert worker.timing_policy(spec, "nccl").max_seconds == 1.0
    assert not worker.timing_policy(spec, "gloo").adaptive  # CPU: the fixed method
    capped = WorkerSpec(
        kind="all_reduce",
        rank=0,
        world_size=2,
        master_addr="a",
        master_port=1,
        iterations=5000,
        max_seconds_per_size=0.0,
    )
    assert not worker.timing_policy(capped, "nccl").adaptive
    assert worker.timing_policy(capped, "nccl").max_block_ops == 5000


@pytest.mark.parametrize("kind", ["all_reduce", "sendrecv"])
def test_adaptive_timing_over_gloo_runs_agreed_blocks(kind: str) -> None:
    """Two real gloo ranks time adaptively: every rank must take the same stop decision or
    one would hang in a collective; the record counts the iterations behind the figure (a
    whole number of blocks of at least the spec's iterations) and the warm-up before."""
    spec = WorkerSpec(
        kind=kind,
        rank=0,
        world_size=2,
        master_addr="127.0.0.1",
        master_port=0,
        backend="gloo",
        sizes=(8192, 65536),
        warmup=2,
        iterations=5,
        timeout_seconds=10.0,
        max_seconds_per_size=0.2,
    )
    records = run_local(spec, 2)
    assert [r.size_bytes for r in records] == [8192, 65536]
    for rec in records:
        assert rec.error is None, rec.error
        assert rec.time_seconds is not None
        assert 0 < rec.time_seconds < 0.1
        # 1 to 3 blocks of k >= 5 iterations used; warm-up: 2 + the 5-iteration estimate
        assert rec.iterations >= 5
        assert rec.warmup >= 2 + 5
