"""The one small interface every sampler implements."""

from __future__ import annotations

from typing import Protocol

from agent.core.sysfs import ReadIssue


class Snapshot(Protocol):
    """What a sampler returns: a frozen dataclass holding one pass's parsed state.

    Every snapshot carries the per-file issues met during its pass.
    """

    @property
    def issues(self) -> tuple[ReadIssue, ...]: ...


class Sampler(Protocol):
    """Reads one source. ``sample`` returns a Snapshot or raises ``NoData``.

    ``name`` is the sampler's stable identifier (``infiniband``, ``pci``, ``netdev`` ...),
    used in flags (``--sampler.NAME``), logs and the ``sampler`` metric label.
    """

    @property
    def name(self) -> str: ...

    def sample(self) -> Snapshot: ...
