"""PLACEHOLDER: metric specs and rendering for the infiniband sampler."""

from __future__ import annotations

from agent.infiniband import InfinibandSnapshot
from exporter.spec import Families, MetricSpec

SPECS: tuple[MetricSpec, ...] = ()


def render(snap: InfinibandSnapshot, out: Families) -> None:
    del snap, out
