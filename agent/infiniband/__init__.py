"""The ``infiniband`` source: every port of every RDMA device under ``/sys/class/infiniband``
(state, rate, link layer, counters in base units, PMA saturation) and its findings.

Modules: ``records`` (the snapshot's frozen records: ports, devices, counters, rates),
``parse`` (the pure parsers of sysfs text and the kernel's tables), ``sampler`` (reads sysfs
into the records, with the memories kept between passes), ``findings`` (``port_down``,
``port_disabled`` and ``counter_saturated``), ``capacity`` (ports that stay up but run
slower; of this package it imports ``records`` only), ``pma`` and ``perfquery`` (the PMA
counters read with perfquery).

May import: :mod:`agent.core` and the settings (:mod:`agent.config`). Nothing else of the
agent.
"""
