"""The throughput sampler, one file per job: ``tail`` reads logs incrementally, ``formats``
parses lines (pure), ``pods`` knows the kubelet's log layout and the pod selection,
``sampler`` joins them into a frozen :class:`~agent.throughput.sampler.ThroughputSnapshot`.

May import: :mod:`agent.core`, :mod:`agent.config` and, as a declared join,
:mod:`agent.kubernetes` (the pod watch that says whose logs to read)."""
