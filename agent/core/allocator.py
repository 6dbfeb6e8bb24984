"""The C allocator's arenas in the agent's main process.

glibc's ``malloc`` gives each thread that allocates while another does an arena of its own,
up to eight per core. Memory freed in one arena serves only that arena's next allocations, so
a process whose threads take turns allocating and freeing (the agent's main process: one
thread per sampler, the pod watch, the HTTP server, each rendering and parsing in turn) keeps
pages resident in each arena, and its RSS creeps while the Python heap stays flat: under the
soak (``bench/soak.py``) tracemalloc saw the main process's Python memory flat (25.7 MiB)
while its RSS grew. Two arenas bound it; the contended allocations are few (the GIL
serialises most of them). ``MALLOC_ARENA_MAX`` in the environment, when set, is left to
glibc. Not glibc (musl has no ``mallopt``): nothing is changed.

:func:`trim` hands the free memory at the top of the heap and in free chunks of every arena
back to the kernel (glibc's ``malloc_trim``): a supervised child calls it after each pass, so
what a pass allocated and freed (a parsed answer, a pickled snapshot) does not stay resident
until the next one. It walks the arenas once (well under a millisecond for a child's heap).

glibc also hands the top of a heap back to the kernel by itself whenever a free leaves more
than its trim threshold there (a threshold it moves with the sizes it has seen), and the next
allocations fault those pages in again. In the main process that is a sawtooth, not a
saving: under the soak (``bench/soak.py``, 2-core development machine, 2026-11-29) its
second arena's heap shrank by 828 KiB at once (``mallinfo2``'s arena bytes, the ``[anon]``
mappings of ``/proc/PID/smaps``) while pymalloc's arenas and Python's live blocks stayed
put, and its RSS climbed back within minutes. Calling ``malloc_trim`` on a schedule instead
made the spread worse (the trimmed pages came back within a minute), and protobuf's upb
allocator, loaded here by the kubelet's gRPC client, calls ``malloc_trim(0)`` itself after
every 10,000 frees (every 345 s or so under the soak's load), which this does not stop.
:func:`hold_heap` fixes the trim threshold at :data:`TRIM_THRESHOLD` (which also fixes the
size above which an allocation gets its own mapping, given back when freed, at glibc's
128 KiB): the main process's RSS then stays at
the level its heaps reach, which is what its memory limit has to hold anyway, and steps up
only when they really grow. ``MALLOC_TRIM_THRESHOLD_`` in the environment, when set, is
left to glibc.

:func:`freeze_startup` collects once and freezes what is left (``gc.freeze``): the
modules, the samplers, the first pod index are the process's for good, and the collector's
own full collections walk only what came after (the runner starts none: see
:mod:`agent.core.runner`). The supervised children do the same for themselves
(:mod:`agent.core.childproc`).

Imports the standard library only.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from collections.abc import Callable
from typing import cast

#: ``mallopt``'s parameter for the most arenas (glibc ``malloc.h``: ``M_ARENA_MAX``)
M_ARENA_MAX = -8
#: arenas the main process keeps
ARENAS = 2
#: ``mallopt``'s parameters (glibc ``malloc.h``)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: free bytes at the top of a heap the main process keeps rather than give back
TRIM_THRESHOLD = 64 << 20
#: glibc's default: an allocation this large or larger gets a mapping of its own
MMAP_THRESHOLD = 128 << 10


def limit_arenas(count: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count`` for this process (call it before starting
    threads); False when not applied (not glibc, or ``MALLOC_ARENA_MAX`` already set)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    return set_arenas(count)


def hold_heap() -> bool:
    """Keep freed memory at the top of glibc's heaps in this process instead of trimming it
    (see the module); allocations of :data:`MMAP_THRESHOLD` or more still get a mapping of
    their own, given back when freed. False when not applied (not glibc, or
    ``MALLOC_TRIM_THRESHOLD_`` already set)."""
    if "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    # the mmap threshold first: setting either one stops glibc moving both
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int)
    fn.restype = ctypes.c_int
    return cast("Callable[[int, int], int]", fn)


def freeze_startup() -> None:
    """Collect, then move every object left into the collector's permanent generation: call
    it once start-up is over (a frozen object that later ends in a reference cycle is never
    collected, so what is frozen should be what the process keeps)."""
    gc.collect()
    gc.freeze()


def set_arenas(count: int) -> bool:
    """glibc's ``mallopt(M_ARENA_MAX, count)``, whatever the environment says; False on
    another C library (musl has no ``mallopt``: its own allocator)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_ARENA_MAX, count))


def trim() -> bool:
    """glibc's ``malloc_trim(0)``: free memory back to the kernel; False on another C library
    (or when nothing was released)."""
    fn = _malloc_trim()
    return fn is not None and bool(fn(0))


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_size_t,)
    fn.restype = ctypes.c_int
    return cast("Callable[[int], int]", fn)
