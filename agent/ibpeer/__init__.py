"""The other end of every cable: for each local InfiniBand port, the neighbour's identity,
PortInfo (link width and speed supported, enabled, active) and PMA counters, read with
infiniband-diags' own tools (``smpquery``, ``perfquery``) under a hard timeout.

Owns: ``parse`` (pure parsers of the tools' text), ``tools`` (running one tool, bounded in
time and output), ``sampler`` (one query set per local port per pass, never a fabric sweep).
May import the shared machinery (``agent.core``) and ``agent.infiniband`` (a declared join:
its parsers, counter widths and ``PortCounter``); nothing else of the agent.
"""
