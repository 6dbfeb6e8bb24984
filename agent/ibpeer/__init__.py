"""The other end of every cable and the fabric one hop beyond: for each local InfiniBand
port, the neighbour's identity, PortInfo (link width and speed supported, enabled, active)
and PMA counters, the leaf switches' port tables and this node's share of their uplinks,
read with infiniband-diags' own tools (``smpquery``, ``perfquery``) under a hard timeout.

Owns: ``parse`` (pure parsers of the tools' text; perfquery's come from
:mod:`agent.infiniband.perfquery`), ``records`` (the frozen records), ``fabric`` (who reads
which uplink, pure), ``query`` (one bounded tool call per query, a pass's deadline, the
reap after each call), ``sampler`` (the schedule: topology, tables, counters; never a fabric
sweep) and ``child`` (the sampler in its supervised child); the tools run through
:mod:`agent.core.tools`.
May import the shared machinery (``agent.core``) and ``agent.infiniband`` (a declared join:
its parsers, counter widths and ``PortCounter``); nothing else of the agent.
"""
