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

Imports the standard library only.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import cast

#: ``mallopt``'s parameter for the most arenas (glibc ``malloc.h``: ``M_ARENA_MAX``)
M_ARENA_MAX = -8
#: arenas the main process keeps
ARENAS = 2


def limit_arenas(count: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count`` for this process (call it before starting
    threads); False when not applied (not glibc, or ``MALLOC_ARENA_MAX`` already set)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    return set_arenas(count)


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
