"""Running probes on this node: for the resident service and for ``fabricscope probe``.

- ``service``    the resident service: probes on a schedule (node-pair rounds, intra-node
                 intervals) with hard timeouts, and the answers to peers' offers.
- ``devices``    which devices a probe may use, busy checks (NVML through a supervised child)
                 and per-device locks; the GPUs pods hold come from the composition
                 (:mod:`agent.kubernetes.allocation`, failing closed).
- ``budget``     the GPU-time budget and what a probe cost last time.
- ``specs``      the worker specs of a probe's ranks.
- ``guest``      the guest side of one node-pair probe: propose, then run rank 1.
- ``addresses``  peer addresses and probe ids.
- ``results``    the latest result per (kind, peer, GPU pair, size), aged out, and the
                 counters the sampler reports.

May import: :mod:`agent.core`, :mod:`agent.config`, the probe's
:mod:`~agent.probe.measure`, :mod:`~agent.probe.rendezvous` and
:mod:`~agent.probe.schedule`, and, as declared joins, :mod:`agent.nvml` (busy-GPU checks)
and :mod:`agent.kubernetes.allocation` (the GPUs pods hold, or why that is unknown).
"""
