"""A sampler that asks for memory, for the memory-ceiling tests: each pass allocates (and
keeps) ``take_mib`` MiB more, unless the file ``quiet`` names exists; built in a child process
by ``ChildSpec("tests.memory_hog:sampler", {...})`` with the checkout on PYTHONPATH."""

from __future__ import annotations

import os


class MemoryHog:
    name = "memory_hog"

    def __init__(self, take_mib: int, quiet: str) -> None:
        self._take = take_mib << 20
        self._quiet = quiet
        self._kept: list[bytearray] = []

    def sample(self) -> int:
        if not os.path.exists(self._quiet):
            self._kept.append(bytearray(self._take))
        return sum(len(b) for b in self._kept)


def sampler(take_mib: int, quiet: str) -> MemoryHog:
    return MemoryHog(take_mib, quiet)
