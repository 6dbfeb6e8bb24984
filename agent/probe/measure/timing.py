"""How long the probe times one message size (pure, no torch): nccl-tests' method made
adaptive.

nccl-tests (``-w 5 -n 20``) runs warm-up iterations, then times ``n`` back-to-back
iterations of the collective between two timestamps and divides by ``n``: one loop on the
stream, not single operations. At 64 MiB that loop lasts ~10 ms and the figure is stable; at
8 KiB it lasts ~0.2 ms, close to launch and clock noise. The probe keeps the method and
adapts the amounts:

1. ``warmup`` untimed iterations (the spec's; at least nccl-tests' 5 by default);
2. one timed *estimate* block of ``iterations`` iterations, which gives the block size
   ``k``: enough iterations for a block of :attr:`TimingPolicy.target_block_seconds`,
   at least ``iterations`` and at most :attr:`TimingPolicy.max_block_ops`;
3. timed blocks of ``k`` back-to-back iterations, each between two timestamps (CUDA events
   on GPUs), until the last :attr:`TimingPolicy.stable_blocks` blocks agree within
   :attr:`TimingPolicy.tolerance` or :attr:`TimingPolicy.max_seconds` have passed.

The result is the median of the last ``stable_blocks`` blocks' mean iteration time (an
average over ``k x stable_blocks`` iterations, as nccl-tests averages over ``n``); every
earlier block counts as warm-up. ``max_seconds == 0`` is the fixed method: one block of
``iterations`` after ``warmup``, nothing adaptive (what a CPU probe under gloo does by
default, so CI stays fast).

Every rank must take the same decisions, or one rank waits in a collective the others
skipped: the worker feeds this module block times already agreed across ranks (one small
all_reduce per block), so the decisions below depend on agreed numbers only.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

#: adaptive timing's time cap per message size when the spec names none: NCCL on GPUs
GPU_MAX_SECONDS_PER_SIZE = 1.0
#: gloo on CPU: the fixed method unless the spec asks for more (CI runs many CPU probes)
CPU_MAX_SECONDS_PER_SIZE = 0.0
#: most iterations in one timed block (one CUDA graph holds that many collectives)
MAX_BLOCK_OPS = 1000


@dataclass(frozen=True, slots=True)
class TimingPolicy:
    """The amounts of one size's timing; see the module doc.

    ``warmup``/``iterations``: the spec's minimum untimed and timed-per-block iterations.
    ``max_seconds``: the cap on the adaptive blocks of one size (0: fixed method).
    ``target_block_seconds``: how long a timed block should last. ``max_block_ops``: the
    most iterations in one block (a CUDA graph holds that many collectives).
    ``stable_blocks``/``tolerance``: stop when that many consecutive blocks' means are
    within ``tolerance`` (relative, (max - min) / min) of each other.
    """

    warmup: int
    iterations: int
    max_seconds: float
    target_block_seconds: float = 0.005
    max_block_ops: int = MAX_BLOCK_OPS
    stable_blocks: int = 3
    tolerance: float = 0.02

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.iterations < 1:
            raise ValueError("warmup must be >= 0 and iterations >= 1")
        if not (math.isfinite(self.max_seconds) and self.max_seconds >= 0):
            raise ValueError(f"max_seconds {self.max_seconds} is not a number >= 0")
        if self.max_block_ops < self.iterations:
            raise ValueError("max_block_ops must be >= iterations")
        if self.stable_blocks < 1 or not self.tolerance >= 0:
            raise ValueError("stable_blocks must be >= 1 and tolerance >= 0")

    @property
    def adaptive(self) -> bool:
        return self.max_seconds > 0

    def block_ops(self, estimate_seconds_per_op: float) -> int:
        """Iterations per timed block, from the estimate block's mean iteration time."""
        if not self.adaptive:
            return self.iterations
        if not (math.isfinite(estimate_seconds_per_op) and estimate_seconds_per_op > 0):
            return self.max_block_ops
        k = math.ceil(self.target_block_seconds / estimate_seconds_per_op)
        return max(self.iterations, min(self.max_block_ops, k))


def spread(values: list[float]) -> float:
    """(max - min) / min of ``values`` (infinite when min is not > 0)."""
    low = min(values)
    return (max(values) - low) / low if low > 0 else math.inf


@dataclass(slots=True)
class Blocks:
    """The timed blocks of one size: feed each block's agreed mean iteration time and the
    agreed seconds spent so far; ask :meth:`done`; read :meth:`result`."""

    policy: TimingPolicy
    ops_per_block: int
    means: list[float] = field(default_factory=list)

    def add(self, mean_seconds_per_op: float) -> None:
        self.means.append(mean_seconds_per_op)

    @property
    def stable(self) -> bool:
        n = self.policy.stable_blocks
        return len(self.means) >= n and spread(self.means[-n:]) <= self.policy.tolerance

    def done(self, elapsed_seconds: float) -> bool:
        """True when no further block is needed: the fixed method's one block, a stable
        tail, or the time cap reached."""
        if not self.means:
            return False
        if not self.policy.adaptive:
            return True
        return self.stable or elapsed_seconds >= self.policy.max_seconds

    def _used(self) -> list[float]:
        return self.means[-min(len(self.means), self.policy.stable_blocks) :]

    def result(self) -> float:
        """Mean seconds of one iteration: the median of the last blocks' means."""
        if not self.means:
            raise ValueError("no block was timed")
        return statistics.median(self._used())

    def timed_iterations(self) -> int:
        """Iterations behind :meth:`result`."""
        return len(self._used()) * self.ops_per_block

    def run_iterations(self) -> int:
        """Every iteration of every timed block."""
        return len(self.means) * self.ops_per_block


def fastest(phases: dict[str, Blocks]) -> str:
    """The method whose blocks give the shortest iteration time (the first on a tie).

    Each way of timing only adds its own overhead to the collective: the eager loop the
    CPU's launch cost per call (on one H200 37-82 us per torch sendrecv, more than an 8 KiB
    copy takes), a CUDA graph torch's stream joins between captured calls (~5-20 us
    more per call than eager once the GPU is the bottleneck). The collective's own time
    is at most the shorter of the two, which ``auto`` timing reports over torch's calls
    (over NCCL called directly it times the eager loop alone: see
    agent.probe.measure.collectives)."""
    if not phases:
        raise ValueError("no method was timed")
    return min(phases, key=lambda name: phases[name].result())
