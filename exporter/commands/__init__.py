"""The bodies of ``fabricscope`` subcommands: ``probe`` (one probe now) and its flags, shared
with the agent's ``--probe.*``; ``topo`` and ``snapshot``; and where samplers read from (the
host or a snapshot), shared with ``agent``. :mod:`exporter.cli` wires their flags into one
parser and dispatches; ``explain`` lives in its own package (:mod:`exporter.explain`).
"""
