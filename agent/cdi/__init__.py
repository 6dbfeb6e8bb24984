"""The Container Device Interface (CDI) specs on this node, and the NVIDIA driver's procfs
files that name its GPUs and MIG slices by device minor: what a CDI device name a container
was given (``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0``) stands for in hardware.

Kubernetes' Dynamic Resource Allocation reports, per container, the CDI devices each
ResourceClaim was prepared as; the driver that prepared them wrote their specs (YAML or JSON)
into the CDI directory (``/var/run/cdi`` by default). A spec's device carries the edits a
runtime applies to the container: device nodes (``/dev/nvidia3``,
``/dev/nvidia-caps/nvidia-cap102``, ``/dev/infiniband/uverbs2``), environment variables. This
package reads those specs within the CDI root, bounded (``spec``: pure parsing;
``registry``: reading, caching by file identity), turns a device's edits into hardware
references (``resolve``), and reads ``/proc/driver/nvidia/gpus/*/information`` and
``/proc/driver/nvidia-caps/mig-minors`` to turn GPU and MIG capability minors into GPU UUIDs
and PCI addresses (``nvidia``).

May import: :mod:`agent.core` only.
"""
