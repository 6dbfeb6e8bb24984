"""The label controller: every interval, read the map from Prometheus, compare each node's
labels under our keys with the map's, and patch what the hold-down lets through.

It touches only the keys of :class:`~exporter.topology.render.LabelKeys` (``tier-0``,
``tier-1`` under the prefix): a node's other labels are neither read into a decision nor
written. A pass that cannot read the map or the nodes changes nothing (the labels stay as
they are, the failure is logged and counted). A pass that would remove the labels of more
than ``max_removals`` of the labelled nodes removes none of them (a Prometheus that lost the
agents' series must not unlabel the fleet), logs and counts the refusal; the other changes
go ahead.

Its own counters (:class:`Counters`), served on ``/metrics`` by the CLI as the catalog's
``fabricscope_topology_*`` families (:mod:`exporter.metrics.topology`, docs/metrics.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from exporter.explain.client import PrometheusError
from exporter.topology.hold import Change, HoldDown
from exporter.topology.kubeapi import KubeError, NodesApi
from exporter.topology.parse import MapError
from exporter.topology.render import LabelKeys, node_labels

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Counters:
    changes: dict[str, int] = field(default_factory=lambda: {"set": 0, "removed": 0})
    passes: dict[str, int] = field(
        default_factory=lambda: {"ok": 0, "map_error": 0, "nodes_error": 0}
    )
    patch_errors: int = 0
    removals_refused: int = 0
    placed: int = 0
    pending: int = 0
    last_success: float = 0.0


#: reads the map's labels: node -> {key: value}; raises on failure
MapReader = Callable[[], Mapping[str, Mapping[str, str]]]


@dataclass(slots=True)
class Controller:
    read_map: MapReader
    nodes: NodesApi
    keys: LabelKeys
    hold: HoldDown
    max_removals: float = 0.1
    dry_run: bool = False
    counters: Counters = field(default_factory=Counters)
    _warned_names: bool = False

    def run_pass(self, now: float | None = None) -> list[Change]:
        """One pass; the changes applied (or, dry, that would have been)."""
        now = time.time() if now is None else now
        try:
            desired = self.read_map()
        except (PrometheusError, MapError) as exc:
            self.counters.passes["map_error"] += 1
            log.warning("fabric map not read, no label changes this pass: %s", exc)
            return []
        try:
            every = self.nodes.list_labels()
        except KubeError as exc:
            self.counters.passes["nodes_error"] += 1
            log.warning("nodes not listed, no label changes this pass: %s", exc)
            return []
        ours = set(self.keys.keys)
        current = {n: {k: v for k, v in lb.items() if k in ours} for n, lb in every.items()}
        self.counters.placed = sum(1 for n in desired if n in current)
        if desired and not self.counters.placed and not self._warned_names:
            self._warned_names = True
            log.warning(
                "none of the %d nodes the map places (e.g. %s) is a node of the cluster: is "
                "--prometheus.node-label the node's name (the chart relabels instance to it)?",
                len(desired),
                min(desired),
            )
        due = self.hold.step(now, desired, current)
        removals = [c for c in due if c.removal]
        labelled = sum(1 for lb in current.values() if lb)
        allowed = max(1, int(self.max_removals * labelled))
        if len(removals) > allowed:
            self.counters.removals_refused += 1
            log.warning(
                "%d nodes would lose their fabric labels (at most %d allowed: "
                "--max-removals %g of %d labelled): none removed this pass",
                len(removals),
                allowed,
                self.max_removals,
                labelled,
            )
            due = [c for c in due if not c.removal]
        applied = []
        for change in due:
            if self._apply(change):
                applied.append(change)
        self.counters.pending = len(self.hold.pending)
        self.counters.passes["ok"] += 1
        self.counters.last_success = now
        return applied

    def _apply(self, change: Change) -> bool:
        patch: dict[str, str | None] = dict(change.labels)
        patch.update((k, None) for k in change.remove)
        kind = "removed" if change.removal else "set"
        if not self.dry_run:
            try:
                self.nodes.patch_labels(change.node, patch)
            except KubeError as exc:
                self.counters.patch_errors += 1
                log.warning("node %s: labels not patched: %s", change.node, exc)
                return False
        self.hold.applied(change.node)
        self.counters.changes[kind] += 1
        log.info(
            "node %s: fabric labels %s%s: %s -> %s",
            change.node,
            kind,
            " (dry run)" if self.dry_run else "",
            _fmt(change.before),
            _fmt(change.labels),
        )
        return True


def _fmt(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(none)"


def labels_reader(read: Callable[[], object], keys: LabelKeys) -> MapReader:
    """A :data:`MapReader` from a function returning a :class:`~exporter.topology.model.
    FabricMap`."""
    from exporter.topology.model import FabricMap

    def reader() -> Mapping[str, Mapping[str, str]]:
        fmap = read()
        assert isinstance(fmap, FabricMap)
        return node_labels(fmap, keys)

    return reader
