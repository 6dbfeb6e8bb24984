"""PLACEHOLDER: metric specs and rendering for the pci sampler."""

from __future__ import annotations

from agent.pci import PciSnapshot
from exporter.spec import Families, MetricSpec

SPECS: tuple[MetricSpec, ...] = ()


def render(snap: PciSnapshot, out: Families) -> None:
    del snap, out
