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

The partition
    With ``--agent.memory-limit`` (the chart passes the container's limit from the downward
    API) the limit is divided: the main process keeps :data:`MAIN` (not enforced: it holds the
    HTTP server and the pod watch), and each child that runs in every agent
    (:data:`PARTITIONED`) gets its floor, what it was measured to need plus a stated margin,
    and a share (``weight``) of what the limit leaves above all the floors, never above its
    ``most``. The ceilings of those children (counted once per process that runs under it at
    once: the ibpeer child and the one tool it runs) and the main process's floor then add up
    to at most the limit: one child at its ceiling cannot take the container to its limit.
    A limit below :func:`minimum_limit` cannot hold every floor: the floors are kept (a
    ceiling below what a healthy pass needs would only restart the child), and the agent says
    so in one line at start and exports by how much (:func:`plan`). The probe's GPU view and a
    child without a share of its own are outside the partition: their floor, from what the
    probe's larger limit adds. Without a limit, each child gets its ``most``.
    ``extra`` raises a child's floor by what its configuration admits (the RAS child decodes
    answers up to ``--ras.max-answer-bytes``; the partition holds ``admits`` of it, and its
    answer cap is brought down to what its ceiling decodes).

Reaching it
    A pass that raises ``MemoryError``, or after which the child's counted memory is above
    :data:`NEAR` of its ceiling (a library that got ``NULL`` and answered an error, leaving
    what it leaked), ends the child: it answers ``memory_ceiling`` and exits, and the parent
    counts the failure by that reason and starts a fresh child after its backoff.

Imports only the standard library (it runs first in every child).
"""

from __future__ import annotations

import resource
from collections.abc import Iterable
from dataclasses import dataclass

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
    """A process's part of the pod's memory limit: never below ``floor`` bytes (what it was
    measured to need, with a margin), plus ``weight`` of what the limit leaves above every
    floor, never above ``most`` bytes (its ceiling when no limit is known). ``processes``:
    how many processes run under this ceiling at once; ``admits``: bytes of ``extra`` the
    partition holds for it at the least (see the module docstring)."""

    floor: int
    weight: float
    most: int
    processes: int = 1
    admits: int = 0

    @property
    def need(self) -> int:
        """What the partition must hold for it: its floor and ``admits``, per process."""
        return (self.floor + self.admits) * self.processes


#: The main process (HTTP server, runner, pod watch, attribution, rendering, the PMA reads'
#: perfquery): not held to a ceiling; its floor is its peak resident memory as measured
#: (68.4 MiB over a 1,000-pod node's watch, bench/results/sizing-cpu-1000-pods.json; 64.9 MiB
#: on an H200 node, sizing-h200.json; 72.4 MiB at the end of an hour's soak) and a third
#: more for what the container is charged besides the ceilings: bursts of scrapes, the
#: children's own library text, the kernel's socket buffers. What the limit leaves above
#: every floor goes to it for its weight.
MAIN = Share(floor=96 * MIB, weight=0.30, most=0)

#: Each child's share, keyed by the supervised sampler's name. Floors from the worst cases
#: measured against them (bench/bench_ceilings.py, bench/results/ceilings.json) and the
#: sizing runs on a GPU node (VmData, what the ceiling counts).
SHARES: dict[str, Share] = {
    # NVIDIA's library counted 56.8 MiB with one GPU (an H200 node, sizing-h200-limit.json).
    # Not measured with 8: the floor assumes at most 4 MiB more per further GPU (85 MiB for
    # 8) and keeps 27 MiB (about a third) above that; a ceiling below what the library needs
    # would show as memory_ceiling restarts, never a silent loss.
    "nvml": Share(floor=112 * MIB, weight=0.20, most=1024 * MIB),
    # 32.6 MiB reading 8 busy logs on the H200 node, 31 MiB under the worst log built
    "throughput": Share(floor=48 * MIB, weight=0.05, most=256 * MIB),
    # 28.8 MiB under a tool printing 200 MB; the tool it runs (one at a time) inherits the
    # same ceiling, so the partition holds it twice (infiniband-diags' smpquery, perfquery and
    # ibnetdiscover on a simulated fabric ran under 16 MiB, 13 MiB resident; not under 8)
    "ibpeer": Share(floor=40 * MIB, weight=0.05, most=256 * MIB, processes=2),
    # its own 48 MiB; each byte of the answers it decodes adds CEILING_PER_ANSWER_BYTE (14)
    # bytes (agent.ras.sampler): the partition holds the smallest cap (1 MiB), the rest of
    # its ceiling raises the cap (agent.ras.sampler.answer_cap); most: the default 16 MiB cap
    "ras": Share(floor=48 * MIB, weight=0.35, most=272 * MIB, admits=14 * MIB),
    # the probe's GPU view: an NVML child of its own, in the probe's larger limit
    "probe-gpus": Share(floor=112 * MIB, weight=0.0, most=1024 * MIB),
}
#: a child not named above (outside the partition: its floor under a limit)
DEFAULT_SHARE = Share(floor=128 * MIB, weight=0.0, most=256 * MIB)
#: the children every agent runs by default, together: the partition divides the limit
#: between them and the main process (their weights and MAIN's add up to 1)
PARTITIONED = ("nvml", "throughput", "ibpeer", "ras")


def minimum_limit() -> int:
    """The smallest pod limit that holds the main process's floor and every partitioned
    child's (per process)."""
    return MAIN.need + sum(SHARES[n].need for n in PARTITIONED)


def _room(pod_limit: int) -> int:
    return max(pod_limit - minimum_limit(), 0)


def child_ceiling(name: str, pod_limit: int | None, *, extra: int = 0) -> int:
    """The memory ceiling in bytes of child ``name`` under a pod limit of ``pod_limit``
    bytes (None: no limit known); ``extra``: bytes its configuration adds to its floor."""
    share = SHARES.get(name, DEFAULT_SHARE)
    floor = share.floor + extra
    if not pod_limit:
        return max(share.most, floor)
    if name not in PARTITIONED:
        return floor
    part = share.floor + share.admits + int(share.weight * _room(pod_limit))
    return max(min(part, share.most), floor)


@dataclass(frozen=True, slots=True)
class Plan:
    """How a pod limit of ``limit`` bytes is divided between ``ceilings`` (each running
    child's, in bytes) and the main process (``main``: what is left to it, at least its
    floor); ``over``: bytes by which the ceilings (per process) and the main process's floor
    exceed the limit, 0 when they fit."""

    limit: int
    ceilings: dict[str, int]
    main: int
    over: int

    def summary(self) -> str:
        """One line for the log: the division, and whether it fits."""
        parts = ", ".join(f"{n} {_mib(c)}{_times(n)}" for n, c in self.ceilings.items())
        if not self.over:
            return (
                f"--agent.memory-limit of {_mib(self.limit)}: memory ceilings {parts}; "
                f"the main process {_mib(self.main)}"
            )
        return (
            f"--agent.memory-limit of {_mib(self.limit)} is {_mib(self.over)} short of what "
            f"the agent's processes need (memory ceilings {parts}; the main process "
            f"{_mib(MAIN.floor)}): one child at its ceiling can take the container to its "
            f"limit; give it at least {_mib(self.limit + self.over)}"
        )


def _mib(n: int) -> str:
    return f"{n / MIB:.0f} MiB"


def _times(name: str) -> str:
    n = SHARES.get(name, DEFAULT_SHARE).processes
    return f" x{n}" if n > 1 else ""


def running_children(samplers: Iterable[str]) -> set[str]:
    """The children that run for the samplers named in ``samplers`` (the probe runs its GPU
    view's); a sampler with no child of its own is left out."""
    names = set(samplers)
    return (names & SHARES.keys()) | ({"probe-gpus"} if "probe" in names else set())


def plan(pod_limit: int, running: Iterable[str]) -> Plan:
    """The division of ``pod_limit`` between the children in ``running`` (supervised
    samplers' names) and the main process."""
    ceilings = {n: child_ceiling(n, pod_limit) for n in sorted(set(running))}
    held = sum(c * SHARES.get(n, DEFAULT_SHARE).processes for n, c in ceilings.items())
    return Plan(
        limit=pod_limit,
        ceilings=ceilings,
        main=max(pod_limit - held, MAIN.floor),
        over=max(held + MAIN.floor - pod_limit, 0),
    )


def apply_ceiling(limit: int) -> None:
    """Set this process's ``RLIMIT_DATA`` soft limit to ``limit`` bytes (never above a hard
    limit already set), and keep glibc's malloc to :data:`MALLOC_ARENAS` arenas. Raises
    ``OSError`` where the kernel refuses."""
    set_arenas(MALLOC_ARENAS)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def data_bytes(pid: int | None = None) -> int | None:
    """The memory of process ``pid`` (None: this one) as ``RLIMIT_DATA`` counts it
    (``VmData``); None where /proc does not say (a process gone, or a zombie)."""
    try:  # a string, not a Path: pathlib interns the pid's text (agent.core.procstat)
        with open(f"/proc/{'self' if pid is None else pid}/status") as f:
            text = f.read()
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
