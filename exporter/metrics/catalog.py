"""The single catalog: every metric fabricscope exports, gathered from the area modules,
and the dispatch from a sampler's snapshot to the function that renders it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.procstat import ProcessStats
from agent.core.runner import SamplerStatus
from exporter.metrics import (
    attribution,
    findings,
    httpstats,
    ibpeer,
    infiniband,
    netdev,
    nvml,
    pci,
    probe,
    ras,
    selfmetrics,
    throughput,
    workload,
)
from exporter.metrics.spec import Detail, Families, MetricSpec


@dataclass(frozen=True, slots=True)
class Area:
    """One sampler's rendering: its specs and the function from its snapshot to samples."""

    sampler: str
    specs: tuple[MetricSpec, ...]
    render: Callable[[Any, Families], None]  # Any: each area takes its own snapshot type


AREAS: dict[str, Area] = {
    a.sampler: a
    for a in (
        Area("attribution", attribution.SPECS, attribution.render),
        Area("ibpeer", ibpeer.SPECS, ibpeer.render),
        Area("infiniband", infiniband.SPECS, infiniband.render),
        Area("netdev", netdev.SPECS, netdev.render),
        Area("nvml", nvml.SPECS, nvml.render),
        Area("pci", pci.SPECS, pci.render),
        Area("probe", probe.SPECS, probe.render),
        Area("ras", ras.SPECS, ras.render),
        Area("throughput", throughput.SPECS, throughput.render),
        Area("workload", workload.SPECS, workload.render),
    )
}

SELF_OWNER = "_self"


def all_specs() -> list[MetricSpec]:
    """Every spec, sorted by name; raises if two areas claim one name."""
    seen: dict[str, MetricSpec] = {}
    for spec in [
        *selfmetrics.SPECS,
        *httpstats.SPECS,
        *findings.SPECS,
        *(s for a in AREAS.values() for s in a.specs),
    ]:
        if spec.name in seen:
            raise ValueError(f"metric {spec.name} defined twice")
        seen[spec.name] = spec
    return [seen[k] for k in sorted(seen)]


def render_sampler(status: SamplerStatus, detail: Detail) -> Families:
    """Families for one sampler's latest state at ``detail`` (empty when it has none)."""
    out = Families(detail)
    area = AREAS.get(status.name)
    if area is not None and status.snapshot is not None:
        area.render(status.snapshot, out)
    return out


def render_self(
    statuses: Mapping[str, SamplerStatus],
    render_errors: Mapping[str, int] | None = None,
    detail: Detail = "full",
    *,
    main: ProcessStats | None = None,
    memory_limit_bytes: int | None = None,
) -> Families:
    out = Families(detail)
    selfmetrics.render(
        statuses, render_errors or {}, out, main=main, memory_limit_bytes=memory_limit_bytes
    )
    return out
