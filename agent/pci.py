"""PLACEHOLDER: replaced by the pci sampler implementation."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import NoData
from agent.sysfs import ReadIssue, SysfsReader


@dataclass(frozen=True, slots=True)
class PciSnapshot:
    issues: tuple[ReadIssue, ...] = ()


class PciSampler:
    name = "pci"

    def __init__(self, sys: SysfsReader) -> None:
        self.sys = sys

    def sample(self) -> PciSnapshot:
        raise NoData("not implemented yet")
