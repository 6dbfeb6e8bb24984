"""Rendering the agent's state as Prometheus metrics.

Owns: the catalog of every family (``catalog``, ``spec``: names, help, types, units,
labels), the text exposition (``exposition``), one renderer per source (``infiniband``,
``pci``, ``netdev``, ``nvml``, ``throughput``, ``workload``, ``attribution``, ``probe``,
``findings``; ``infiniband_counters`` holds the InfiniBand port counters' metrics), the
agent's own metrics (``selfmetrics``; ``httpstats`` for the HTTP server's limits) and the
generated docs (``docs``).

May import: :mod:`agent` (its snapshots) and ``prometheus_client``; never
:mod:`exporter.http` or :mod:`exporter.cli`.
"""
