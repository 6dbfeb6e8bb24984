"""The worker specs of a probe's ranks, built the same way by the probe service and by
``fabricscope probe``: the sizes an offer carries, a worker's own timeout, the ranks of an
intra-node probe, and the guest's rank 1 of a node pair (the host builds its rank 0 from the
offer it accepts, in :mod:`agent.probe.run.service`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from agent.probe.measure.launch import free_port
from agent.probe.measure.records import (
    CPU_DEFAULT_SIZES,
    DEFAULT_MAX_MEMORY_BYTES,
    GPU_DEFAULT_SIZES,
    LATENCY_SIZE_BYTES,
    WorkerSpec,
)
from agent.probe.run.devices import GpuSlot


def worker_timeout(timeout_seconds: float) -> float:
    """A worker's own rendezvous / collective timeout: half the probe's hard deadline."""
    return max(1.0, timeout_seconds / 2)


def default_sizes(kind: str, backend: str, sizes: Sequence[int]) -> tuple[int, ...]:
    """The sizes an offer carries: latency is always 8 bytes; else ``sizes`` or the
    backend's defaults."""
    if kind == "latency":
        return (LATENCY_SIZE_BYTES,)
    if sizes:
        return tuple(sizes)
    return GPU_DEFAULT_SIZES if backend == "nccl" else CPU_DEFAULT_SIZES


def intra_specs(
    kind: str,
    backend: str,
    slots: Sequence[GpuSlot],
    *,
    sizes: Sequence[int],
    warmup: int,
    iterations: int,
    deadline_seconds: float,
    host: str,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
) -> list[WorkerSpec]:
    """One spec per rank of an intra-node probe over ``slots``, rank 0's store on a free
    loopback port; ``deadline_seconds``: the probe's hard deadline."""
    base = WorkerSpec(
        kind=kind,
        rank=0,
        world_size=len(slots),
        master_addr="127.0.0.1",
        master_port=free_port("127.0.0.1"),
        backend=backend,
        devices=tuple(s.device for s in slots if s.device is not None),
        sizes=tuple(sizes),
        warmup=warmup,
        iterations=iterations,
        timeout_seconds=worker_timeout(deadline_seconds),
        max_memory_bytes=max_memory_bytes,
        host=host,
    )
    return [replace(base, rank=r, local_rank=r) for r in range(len(slots))]


def guest_spec(
    kind: str,
    backend: str,
    slot: GpuSlot,
    *,
    sizes: Sequence[int],
    warmup: int,
    iterations: int,
    deadline_seconds: float,
    me: str,
    peer: str,
    dst: str,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
) -> WorkerSpec:
    """The guest's rank 1 of a node-pair probe on ``slot``, before the host answered: its
    store address is a placeholder that :func:`at_master` fills in."""
    return WorkerSpec(
        kind=kind,
        rank=1,
        world_size=2,
        master_addr="127.0.0.1",
        master_port=1,
        backend=backend,
        local_rank=0,
        devices=(slot.device,) if slot.device is not None else (),
        sizes=tuple(sizes),
        warmup=warmup,
        iterations=iterations,
        timeout_seconds=worker_timeout(deadline_seconds),
        max_memory_bytes=max_memory_bytes,
        peer=peer,
        src=f"{me}:{slot.label}",
        dst=dst,
        host=me,
    )


def at_master(template: WorkerSpec) -> Callable[[str, int], WorkerSpec]:
    """The spec of rank 1 once the host has answered with its store's address."""

    def make(addr: str, port: int) -> WorkerSpec:
        return replace(template, master_addr=addr, master_port=port)

    return make
