"""The ``workload`` source: where training processes run against their GPUs' and NICs' NUMA
nodes (``sampler``) and the findings over that (``findings``).

May import: :mod:`agent.core`, and as declared joins :mod:`agent.pci` (NUMA of devices),
:mod:`agent.nvml.snapshot` (GPU processes) and :mod:`agent.kubernetes` (pod identity).
"""
