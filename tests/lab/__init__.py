"""The scenario lab: a cluster of DGX-class nodes played over time from real fixture trees,
rendered by the real agent, stored in and served by a real Prometheus.

- :mod:`tests.lab.scenarios`: the scenarios and their planted causes (data).
- :mod:`tests.lab.node`: one node's trees and counters, advanced step by step.
- :mod:`tests.lab.agent`: the agent's ``--once`` in process for a node.
- :mod:`tests.lab.backfill`: :func:`build_tsdb` and :func:`start_prometheus`.
- :mod:`tests.lab.live`: agents on 127.0.0.x scraped by Prometheus with the rules loaded.

``python -m tests.lab --help`` runs them from the command line.
"""
