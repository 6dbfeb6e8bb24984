"""What one check is: a PromQL template, how its baseline and slow figures compare, the
device it names, and the query printed for each figure (:meth:`Check.shown`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Mode = Literal["rate", "events", "drop", "rise", "level"]
Scope = Literal["instance", "pod"]
Key = Literal["port", "netdev", "pci", "gpu", "probe", "pod"]


@dataclass(frozen=True, slots=True)
class Check:
    """One piece of evidence for a cause.

    ``mode``: ``rate`` compares per-second rates (slow minus baseline); ``events`` compares
    counts, the baseline's scaled to the slow period's length; ``drop`` is a gauge's
    relative fall ((baseline - slow) / baseline); ``rise`` a gauge's absolute rise;
    ``level`` is the slow period's value itself (a standing defect of the job's own
    placement or settings, reported even when it did not change). Every mode but ``level``
    compares with the baseline: a device with no baseline value scores 0 and is reported as
    "no baseline", never as a change from nothing. ``scale`` and ``unit``
    only format numbers (x60 for "per minute"), and the printed PromQL carries the scale, so
    it returns the printed figure. ``identity`` names the labels that make a device, besides
    ``instance``. ``counts``: the template is a rate or an increase of events, whose
    counting noise is Poisson (default: the ``rate`` and ``events`` modes). ``axis``: what
    a plot's y axis says (default: the unit). ``whole_job``: the series come from another
    node than the device's (NCCL's RAS answers from the node of rank 0, and the template
    moves each rank to its own node): asked for the whole job at once, never in groups of
    nodes, and printed over the whole job, the device being one row of the answer.
    """

    name: str
    cause: str
    what: str
    template: str
    mode: Mode
    significant: float
    key: Key
    identity: tuple[str, ...]
    scope: Scope = "instance"
    unit: str = ""
    scale: float = 1.0
    counts: bool | None = None
    axis: str = ""
    whole_job: bool = False
    #: ``{peers}`` selects the far end of the device's cable: the identity's labels as the
    #: far end's series name them (an uplink: ``peer_guid``, ``peer_port``)
    far_labels: tuple[str, ...] = ()

    @property
    def job_named(self) -> bool:
        """A pod-scoped check whose series all come from the job's own logs and carry its
        ``job_name`` label (NCCL's): on bare metal, with no pods, it selects the job's
        nodes and that label instead."""
        names = set(METRIC.findall(self.template))
        return (
            self.scope == "pod"
            and bool(names)
            and all(n.startswith("fabricscope_nccl_") for n in names)
        )

    @property
    def counting(self) -> bool:
        """Event counts, with Poisson counting noise."""
        return self.mode in ("rate", "events") if self.counts is None else self.counts

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric names the template reads, in order of appearance."""
        return tuple(dict.fromkeys(METRIC.findall(self.template)))

    @property
    def axis_label(self) -> str:
        return self.axis or self.unit.strip() or "ratio"

    def expr(self, sel: str, d: str, peers: str | None = None) -> str:
        """The template for selector ``sel`` over range ``d``, in the series' own units."""
        return self.template.format(sel=sel, d=d, peers=sel if peers is None else peers)

    def shown(self, sel: str, d: str, peers: str | None = None) -> str:
        """:meth:`expr` as printed: in the unit of the figures (events as whole numbers)."""
        raw = self.expr(sel, d, peers)
        if self.mode == "events":
            return f"round({raw})"
        if self.scale != 1.0:
            return f"{self.scale:g} * ({raw})"
        return raw

    def display(self, value: float) -> float:
        """A figure in the series' units as printed (events: whole numbers)."""
        if self.mode == "events":
            return float(math.floor(value + 0.5))
        return value * self.scale

    def device_selector(self, labels: Mapping[str, str]) -> str:
        """The matchers of one device: its instance and identity (a pod: namespace, pod
        and GPU when it has one)."""
        names: tuple[str, ...] = ("instance", *self.identity)
        if self.scope == "pod":
            names = ("namespace", "pod", "gpu") if labels.get("pod") else ("instance", "job_name")
        return ",".join(f'{n}="{escape(labels.get(n, ""))}"' for n in names if n in labels)

    def peer_selector(self, labels: Mapping[str, str]) -> str:
        """The matchers of the device's peers for ``{peers}``: its node (its pod's namespace
        for a pod-scoped check; the far end of the cable for ``far_labels``)."""
        if self.far_labels:
            return ",".join(
                f'{far}="{escape(labels.get(own, ""))}"'
                for far, own in zip(self.far_labels, self.identity, strict=True)
            )
        if self.scope == "pod" and labels.get("pod"):
            return f'namespace="{escape(labels.get("namespace", ""))}"'
        return f'instance="{escape(labels.get("instance", ""))}"'


METRIC = re.compile(r"\bfabricscope_[a-z0-9_]+")


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
