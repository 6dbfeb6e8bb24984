"""nccl-tests' bandwidth formulas (pure).

From NVIDIA nccl-tests ``src/*.cu`` (``*GetBw``): the algorithm bandwidth is the message
size over the time of one operation, and the bus bandwidth scales it by a factor that makes
figures comparable across rank counts, so that they can be set against the hardware's link
speed:

- ``all_reduce``: ``2 (n - 1) / n``
- ``all_gather``, ``reduce_scatter``, ``alltoall``: ``(n - 1) / n``
- ``sendrecv``, ``broadcast``, ``reduce``: ``1``

``size_bytes`` is what nccl-tests prints in its ``size`` column: the buffer one rank
reduces (all_reduce), sends (sendrecv), or the whole gathered / scattered buffer
(all_gather, reduce_scatter, alltoall). Everything here is in bytes and seconds; nccl-tests
prints GB/s (10^9 bytes per second) and microseconds.
"""

from __future__ import annotations

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "sendrecv",
    "broadcast",
    "reduce",
)


def bus_factor(collective: str, world_size: int) -> float:
    """The factor busbw = algbw x factor, for ``collective`` over ``world_size`` ranks."""
    if world_size < 1:
        raise ValueError(f"world_size {world_size} < 1")
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if collective in ("sendrecv", "broadcast", "reduce"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")


def algbw(size_bytes: int, time_seconds: float) -> float:
    """Algorithm bandwidth in bytes per second: ``size / time``."""
    if size_bytes < 0:
        raise ValueError(f"size_bytes {size_bytes} < 0")
    if not time_seconds > 0:
        raise ValueError(f"time_seconds {time_seconds} is not > 0")
    return size_bytes / time_seconds


def busbw(collective: str, size_bytes: int, time_seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes per second: ``algbw x bus_factor``."""
    return algbw(size_bytes, time_seconds) * bus_factor(collective, world_size)
