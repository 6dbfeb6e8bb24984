"""PLACEHOLDER: replaced by the infiniband sampler implementation."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import NoData
from agent.sysfs import ReadIssue, SysfsReader


@dataclass(frozen=True, slots=True)
class InfinibandSnapshot:
    issues: tuple[ReadIssue, ...] = ()


class InfinibandSampler:
    name = "infiniband"

    def __init__(self, sys: SysfsReader) -> None:
        self.sys = sys

    def sample(self) -> InfinibandSnapshot:
        raise NoData("not implemented yet")
