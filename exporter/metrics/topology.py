"""Metric specs and rendering for the topology controller (``fabricscope topology-controller``,
served on its own ``/metrics``, not the agents'): the label changes it applied, its passes,
what it held back.

The controller's :class:`~exporter.topology.controller.Counters` are rendered here by
:func:`render`, from plain values, so this module imports nothing of the controller.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.metrics.spec import Families, MetricSpec

#: fixed vocabulary of ``change``
CHANGES = ("set", "removed")
#: fixed vocabulary of ``result``
RESULTS = ("ok", "map_error", "nodes_error")

LABEL_CHANGES = MetricSpec(
    "fabricscope_topology_label_changes_total",
    "counter",
    "Node label changes the topology controller applied, by change: set (tiers written or "
    "changed), removed (the node left the map).",
    ("change",),
)
PASSES = MetricSpec(
    "fabricscope_topology_passes_total",
    "counter",
    "Topology controller passes, by result: ok, map_error (Prometheus unreachable or its "
    "answer refused: no change that pass), nodes_error (the nodes not listed: no change).",
    ("result",),
)
PATCH_ERRORS = MetricSpec(
    "fabricscope_topology_patch_errors_total",
    "counter",
    "Node label patches the Kubernetes API refused or lost.",
)
REMOVALS_REFUSED = MetricSpec(
    "fabricscope_topology_removals_refused_total",
    "counter",
    "Passes whose removals were held back: more nodes would have lost their labels than "
    "--max-removals allows.",
)
NODES_PLACED = MetricSpec(
    "fabricscope_topology_nodes_placed",
    "gauge",
    "Nodes of the cluster the latest fabric map places.",
)
NODES_PENDING = MetricSpec(
    "fabricscope_topology_nodes_pending",
    "gauge",
    "Nodes whose label change waits out the hold-down.",
)
LAST_SUCCESS = MetricSpec(
    "fabricscope_topology_last_success_timestamp_seconds",
    "gauge",
    "When a topology controller pass last read the map and the nodes (Unix time).",
    unit="seconds",
)

SPECS: tuple[MetricSpec, ...] = (
    LABEL_CHANGES,
    PASSES,
    PATCH_ERRORS,
    REMOVALS_REFUSED,
    NODES_PLACED,
    NODES_PENDING,
    LAST_SUCCESS,
)


def render(
    out: Families,
    *,
    changes: Mapping[str, int],
    passes: Mapping[str, int],
    patch_errors: int,
    removals_refused: int,
    placed: int,
    pending: int,
    last_success: float,
) -> None:
    for change in CHANGES:
        out.add(LABEL_CHANGES, changes.get(change, 0), change)
    for result in RESULTS:
        out.add(PASSES, passes.get(result, 0), result)
    out.add(PATCH_ERRORS, patch_errors)
    out.add(REMOVALS_REFUSED, removals_refused)
    out.add(NODES_PLACED, placed)
    out.add(NODES_PENDING, pending)
    out.add(LAST_SUCCESS, last_success)
