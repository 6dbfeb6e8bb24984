"""The ``pci`` source: GPUs, RDMA NICs and the bridges between them in
``/sys/bus/pci/devices`` (link speed and width, ACS, NUMA node), and the topology joins
over them (``topology``: the ``nvidia-smi topo -m`` path type of every GPU-NIC pair, each
GPU's nearest NIC).

May import: :mod:`agent.core`. Nothing else of the agent.
"""
