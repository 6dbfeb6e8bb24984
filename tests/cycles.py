"""What a piece of work leaves to Python's cycle collector (issue 46: nothing a pass allocates
outlives it)."""

from __future__ import annotations

import gc
from collections.abc import Callable


def cyclic_garbage(work: Callable[[], object]) -> list[object]:
    """What ``work`` leaves that only the cycle collector would free: collected first, then
    every unreachable object ``work`` made kept (``gc.DEBUG_SAVEALL``), returned, and the
    collector put back as it was."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        work()
        gc.collect()
        return list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
