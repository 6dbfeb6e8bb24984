"""The ``workload`` source: where training processes run against their GPUs' and NICs' NUMA
nodes and how NCCL is configured for them (``sampler``, the pass), what is read of each
process below /proc (``process``), where it may run against its GPUs and NICs
(``placement``), the node's GPUDirect RDMA path (``gpudirect``), the snapshot's records
(``records``) and the findings over them (``findings``).

May import: :mod:`agent.core`, and as declared joins :mod:`agent.pci` (NUMA of devices),
:mod:`agent.nvml.snapshot` (GPU processes) and :mod:`agent.kubernetes` (pod identity).
"""
