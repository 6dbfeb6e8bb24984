"""Each supervised child's memory ceiling: its share of the pod's memory limit, enforced by the
kernel in the child (:mod:`agent.core.isolation` calls :func:`apply_ceiling` before the child
builds its sampler).

What the kernel counts
    ``RLIMIT_DATA`` (Linux 4.7 and later): the process's writable private mappings that are
    not its main stack: the heap (``brk``), anonymous ``mmap`` (Python's arenas, glibc's
    malloc arenas once made writable, large ``malloc`` blocks), thread stacks and the writable
    data of the libraries it loads. An allocation past it fails (``ENOMEM``: a ``MemoryError``
    in Python, ``NULL`` from ``malloc`` in a C library); nothing is killed at random. Mappings
    of devices and files shared with others (``/dev/nvidia*``, NVML's and the driver's shared
    mappings) and address space reserved without write access (``PROT_NONE``: what glibc
    reserves per arena, what CUDA reserves) are not counted. ``RLIMIT_AS`` would count all of
    those, and a driver library that reserves address space would fail under it at any useful
    value: it is not used. glibc gives each thread that allocates an arena of its own, and
    what an arena once made writable stays counted: the child keeps :data:`MALLOC_ARENAS`.

    The count is of memory the process could touch, so it is at least its resident memory:
    children held under their ceilings cannot together take more than the sum of the ceilings.

The shares
    With ``--agent.memory-limit`` (the chart passes the container's limit from the downward
    API) a child's ceiling is its share of that limit (:data:`SHARES`), never below its floor:
    what it needs on a busy node plus room (a ceiling below what a healthy pass needs would
    only restart it). Without a limit, each child gets its ceiling for an unknown limit. The
    NVML child's floor is the most generous: what the driver library allocates was measured
    only on the NVML stand-in and recorded nodes here, and a ceiling must never be what breaks
    a healthy driver; its ceiling bounds a leak, it does not squeeze the library.
    ``extra`` raises a child's floor by what its configuration admits (the RAS child decodes
    answers up to ``--ras.max-answer-bytes``).

Reaching it
    A pass that raises ``MemoryError``, or after which the child's counted memory is above
    :data:`NEAR` of its ceiling (a library that got ``NULL`` and answered an error, leaving
    what it leaked), ends the child: it answers ``memory_ceiling`` and exits, and the parent
    counts the failure by that reason and starts a fresh child after its backoff.

Imports only the standard library (it runs first in every child).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from agent.core.allocator import set_arenas

MIB = 1 << 20
#: glibc malloc arenas a child keeps: each thread that allocates would otherwise get an
#: arena of its own, whose pages made writable stay counted after they are freed (the RAS
#: child, which reads in threads, counted 255 MiB decoding an answer that needs 186 MiB)
MALLOC_ARENAS = 1
#: the fraction of its ceiling a child's counted memory may stay at after a pass
NEAR = 0.9


@dataclass(frozen=True, slots=True)
class Share:
    """``fraction`` of the pod's memory limit; never below ``floor`` bytes; ``unknown``
    bytes when no limit is known."""

    fraction: float
    floor: int
    unknown: int


#: each child's share (the probe's GPU view runs only with the probe, whose pods get a larger
#: limit); the fractions of the four that run by default add up to 0.80, leaving the agent's
#: main process a fifth of the limit. Keyed by the supervised sampler's name.
SHARES: dict[str, Share] = {
    # generous: a ceiling must never break a healthy driver library (see the docstring); the
    # NVML child was 44 MiB resident on an H200 node
    "nvml": Share(0.20, 192 * MIB, 1024 * MIB),
    "probe-gpus": Share(0.10, 192 * MIB, 1024 * MIB),
    "throughput": Share(0.15, 96 * MIB, 256 * MIB),
    "ibpeer": Share(0.10, 96 * MIB, 256 * MIB),
    # its floor is its own needs; each byte of the answers it decodes adds to it (its answer
    # cap is brought down to what its share can decode: agent.ras.sampler.answer_cap)
    "ras": Share(0.35, 48 * MIB, 256 * MIB),
}
#: a child not named above
DEFAULT_SHARE = Share(0.10, 128 * MIB, 256 * MIB)


def child_ceiling(name: str, pod_limit: int | None, *, extra: int = 0) -> int:
    """The memory ceiling in bytes of child ``name`` under a pod limit of ``pod_limit``
    bytes (None: no limit known); ``extra``: bytes its configuration adds to its floor."""
    share = SHARES.get(name, DEFAULT_SHARE)
    floor = share.floor + extra
    if not pod_limit:
        return max(share.unknown, floor)
    return max(int(pod_limit * share.fraction), floor)


def apply_ceiling(limit: int) -> None:
    """Set this process's ``RLIMIT_DATA`` soft limit to ``limit`` bytes (never above a hard
    limit already set), and keep glibc's malloc to :data:`MALLOC_ARENAS` arenas. Raises
    ``OSError`` where the kernel refuses."""
    set_arenas(MALLOC_ARENAS)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def data_bytes() -> int | None:
    """This process's memory as ``RLIMIT_DATA`` counts it (``VmData``); None where /proc
    does not say."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return None


def near_ceiling(limit: int | None) -> int | None:
    """This process's counted memory when it is above :data:`NEAR` of ``limit``, else None."""
    if not limit:
        return None
    used = data_bytes()
    return used if used is not None and used > NEAR * limit else None
