"""PLACEHOLDER: metric specs and rendering for the netdev sampler."""

from __future__ import annotations

from agent.netdev import NetdevSnapshot
from exporter.spec import Families, MetricSpec

SPECS: tuple[MetricSpec, ...] = ()


def render(snap: NetdevSnapshot, out: Families) -> None:
    del snap, out
