"""The fabric map for schedulers: the InfiniBand fabric's tiers as a scheduler can use them
(a node's leaf, its spine block), derived from what the agents already export about the far
ends of their cables (``fabricscope_infiniband_peer_info``) and their leaves' uplinks
(``fabricscope_infiniband_switch_link_info``), read back from Prometheus; rendered as node
labels (topograph's keys by default), a Kueue ``Topology``, Volcano ``HyperNode`` resources,
a Slurm ``topology.conf`` and a graph JSON; and kept true on the nodes by a small controller
that patches only its own label keys, after a hold-down.

Owns: ``parse`` (Prometheus samples -> attachments and switch links, pure, bounded),
``model`` (the tiers, pure), ``render`` (the outputs, pure), ``hold`` (the hold-down, pure),
``kubeapi`` (the node reads and label patches, one bounded HTTP call each) and ``controller``
(the loop).
May import ``exporter.explain.client`` (the Prometheus client) and ``exporter.metrics`` (the
controller's metric specs, :mod:`exporter.metrics.topology`) and nothing else of the
exporter; nothing of the agent.
"""
