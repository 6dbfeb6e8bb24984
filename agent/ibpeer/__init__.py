"""The other end of every cable: for each local InfiniBand port, the neighbour's identity,
PortInfo (link width and speed supported, enabled, active) and PMA counters, read with
infiniband-diags' own tools (``smpquery``, ``perfquery``) under a hard timeout.

Owns: ``parse`` (pure parsers of the tools' text; perfquery's come from
:mod:`agent.infiniband.perfquery`) and ``sampler`` (one query set per local port per pass,
never a fabric sweep); the tools run through :mod:`agent.core.tools`.
May import the shared machinery (``agent.core``) and ``agent.infiniband`` (a declared join:
its parsers, counter widths and ``PortCounter``); nothing else of the agent.
"""
