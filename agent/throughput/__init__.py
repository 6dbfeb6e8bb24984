"""The throughput sampler, one file per job: ``tail`` reads logs incrementally, ``formats``
parses lines (pure), ``pods`` knows the kubelet's log layout and the pod selection,
``sampler`` joins them into a frozen :class:`~agent.throughput.sampler.ThroughputSnapshot`."""
