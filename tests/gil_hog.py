"""A sampler whose pass never returns and holds the GIL all along (Python's backtracking
``re`` on a catastrophic pattern: C code that never releases it), for the isolation tests:
built in a child process by ``ChildSpec("tests.gil_hog:sampler")`` with the checkout on
PYTHONPATH."""

from __future__ import annotations

import re


class GilHog:
    name = "gil_hog"

    def sample(self) -> object:
        re.match(r"^(a+)+$", "a" * 64 + "!")  # 2**64 steps
        raise AssertionError("unreachable")


def sampler() -> GilHog:
    return GilHog()
