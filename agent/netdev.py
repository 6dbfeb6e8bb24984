"""PLACEHOLDER: replaced by the netdev sampler implementation."""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import NoData
from agent.sysfs import ReadIssue, SysfsReader


@dataclass(frozen=True, slots=True)
class NetdevSnapshot:
    issues: tuple[ReadIssue, ...] = ()


class NetdevSampler:
    name = "netdev"

    def __init__(self, sys: SysfsReader) -> None:
        self.sys = sys

    def sample(self) -> NetdevSnapshot:
        raise NoData("not implemented yet")
