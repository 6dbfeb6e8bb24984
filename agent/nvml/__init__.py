"""The ``nvml`` source: the GPUs through NVML (``nvidia-ml-py``), never creating a CUDA
context.

Parts: ``api`` (the adapter from pynvml calls to plain records), ``sweep`` (one pass over
the GPUs), ``snapshot`` (the frozen records), ``xid`` (XID events as counters), ``sampler``
(the sampler and its supervised child), ``record`` (recording and replaying NVML answers),
``findings`` (NVLink down/errors, GPU lost, PCIe, row remap, XID), ``mig`` (MIG modes and
MIG devices, each with its parent GPU) and ``topology`` (the
``NV#`` entries of the topology matrix).

May import: :mod:`agent.core`. Nothing else of the agent.
"""
