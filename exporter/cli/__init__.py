"""The ``fabricscope`` command line: ``main`` parses flags and dispatches; one module per
subcommand body (``agent_run``, ``topo``, ``snapshot``, ``probe`` with ``probe_flags`` shared
with the agent's ``--probe.*``), ``agent_flags`` (the path, log, sampler and Kubernetes
flags, and the :class:`~agent.config.AgentConfig` they make), ``ras_flags`` and
``throughput_flags`` (those samplers' flags), ``explain_flags`` (``explain``'s flags; its
body is the :mod:`exporter.explain` package), ``source`` (where samplers read from: the host
or a snapshot) and ``argtypes`` (flag value types).

May import: everything below it (:mod:`agent`, :mod:`exporter.metrics`,
:mod:`exporter.http`, :mod:`exporter.app`, :mod:`exporter.explain`).
"""
