"""Pod identity for the samplers: the kubelet's pod-resources gRPC client
(``podresources``, with the generated ``podresources_pb2*`` from ``podresources.proto``),
GPU/RDMA-device-to-pod attribution: the sampler (``attribution``), its records (``records``), the
pure join of allocations to hardware (``join``) and ResourceClaims' devices (``claims``), which
GPUs pods hold for the probe,
failing closed (``allocation``), pod names from ``/proc`` cgroups (``cgroup``), the pod model and
index (``pods``) and the API server's pod list+watch (``podwatch``).

May import: :mod:`agent.core`, and as declared joins :mod:`agent.infiniband` (RDMA devices),
:mod:`agent.nvml.snapshot` (GPU UUIDs) and :mod:`agent.cdi` (CDI specs, GPU minors).
"""
