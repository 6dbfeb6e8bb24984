"""The ``infiniband`` source: every port of every RDMA device under ``/sys/class/infiniband``
(state, rate, link layer, counters in base units, PMA saturation) and its findings.

Modules: ``records`` (the snapshot's frozen records: ports, devices, counters, rates),
``sampler`` (reads and parses sysfs into them; ``port_down`` and ``counter_saturated``
findings) and ``capacity`` (ports that stay up but run slower; of this package it imports
``records`` only).

May import: :mod:`agent.core` and the settings (:mod:`agent.config`). Nothing else of the
agent.
"""
