"""The ``infiniband`` source: every port of every RDMA device under ``/sys/class/infiniband``
(state, rate, link layer, counters in base units, PMA saturation) and its findings.

May import: :mod:`agent.core`. Nothing else of the agent.
"""
