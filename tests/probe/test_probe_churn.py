"""Probe series churn: a node meets a new peer every round, and a series naming the peer is a
new series. Over a simulated day of default 5-minute rounds (the real ledger aging results out,
the real renderer), a node's distinct probe series stay at most 4 per round plus a bounded
rest below full detail, whatever the cluster size; full detail keeps every series (13 a
round)."""

from __future__ import annotations

from agent.config import ProbeSettings
from agent.probe.measure.records import ProbeRecord
from agent.probe.run.results import ProbeLedger, ProbeRun
from exporter.metrics.probe import render
from exporter.metrics.spec import Detail, Families

ROUND = 300.0
ROUNDS = 288  # one day
SIZES = (1 << 20, 16 << 20, 64 << 20)  # NCCL's default sizes


def record(kind: str, size: int, world: int = 2) -> ProbeRecord:
    seconds = 2e-5 if kind == "latency" else size / 20e9
    bw = None if kind == "latency" else size / seconds
    return ProbeRecord(
        kind=kind, backend="nccl", world_size=world, size_bytes=size, iterations=20, warmup=5,
        time_seconds=seconds, algbw_bytes_per_second=bw, busbw_bytes_per_second=bw,
        correct=True, error=None,
    )  # fmt: skip


def distinct_series_over_a_day(detail: Detail, members: int) -> set[tuple[str, tuple[str, ...]]]:
    now = [1_700_000_000.0]
    ledger = ProbeLedger(ProbeSettings(enabled=True, round_seconds=ROUND), lambda: now[0])
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for r in range(ROUNDS):
        now[0] += ROUND
        peer = f"node-{1 + r % (members - 1):04d}"  # the circle meets every other member
        rail = str(r % 8)  # the guest's rail rotation
        sendrecv = tuple(record("sendrecv", s) for s in SIZES)
        ledger.record(ProbeRun("sendrecv", peer, rail, rail, now[0], 6.0, None, sendrecv))
        latency = (record("latency", 8),)
        ledger.record(ProbeRun("latency", peer, rail, rail, now[0], 4.0, None, latency))
        if r % 12 == 0:  # intra-node all_reduce hourly
            intra = tuple(record("all_reduce", s, world=8) for s in SIZES)
            ledger.record(ProbeRun("all_reduce", "", "", "", now[0], 9.0, None, intra))
        out = Families(detail)
        render(ledger.snapshot(None), out)
        seen |= {(spec.name, labels) for spec, samples in out.items() for labels, _ in samples}
    return seen


def test_distinct_probe_series_per_day_are_bounded_below_full_detail() -> None:
    large = distinct_series_over_a_day("default", members=1000)
    small = distinct_series_over_a_day("default", members=17)
    per_peer = {n for n, labels in large if any(v.startswith("node-") for v in labels)}
    assert per_peer == {
        "fabricscope_probe_busbw_bytes_per_second",
        "fabricscope_probe_success",
        "fabricscope_probe_latency_seconds",
    }
    # 4 a round (sendrecv busbw at 64 MiB and success, latency and success) + the rest
    assert len(large) <= 4 * ROUNDS + 60
    assert len(small) <= len(large)
    busbw = {labels for n, labels in large if n == "fabricscope_probe_busbw_bytes_per_second"}
    assert {labels[-1] for labels in busbw if labels[1]} == {str(64 << 20)}
    assert {labels[-1] for labels in busbw if not labels[1]} == {str(s) for s in SIZES}


def test_full_detail_keeps_every_series() -> None:
    full = distinct_series_over_a_day("full", members=1000)
    assert len(full) >= 13 * ROUNDS
    assert distinct_series_over_a_day("default", members=1000) < full
