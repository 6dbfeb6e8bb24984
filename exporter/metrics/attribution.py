"""Metric specs and rendering for the attribution sampler: which pod holds which GPU and RDMA
device, as join-able ``*_info`` series. Pod labels are never stamped on hardware series; a
query joins them on, e.g.::

    fabricscope_nvlink_errors_total * on(gpu) group_left(namespace, pod) fabricscope_pod_gpu_info
"""

from __future__ import annotations

from agent.kubernetes.attribution import ERROR_REASONS, AttributionSnapshot
from exporter.metrics.spec import Families, MetricSpec

POD_GPU_INFO = MetricSpec(
    "fabricscope_pod_gpu_info",
    "gauge",
    "A GPU allocated to (method podresources) or used by (method cgroup) a container; always 1. "
    "Join it onto GPU series by gpu, uuid or pci_bus_id, e.g. "
    "fabricscope_nvlink_errors_total * on(gpu) group_left(namespace, pod) "
    "fabricscope_pod_gpu_info (one series per GPU and container: a GPU shared by several "
    "containers needs a many-to-many aware query: time-slicing and MPS give one GPU to "
    "several pods, and each gets a series). A MIG slice carries its parent GPU's gpu and "
    "pci_bus_id (the slice rides on that GPU's NVLinks and PCIe link) and mig names the "
    "slice; uuid is the slice's own UUID when the kubelet names it, else the parent's. claim "
    "is the ResourceClaim for devices allocated through Dynamic Resource Allocation. gpu "
    "and pci_bus_id are empty when the device could not be resolved.",
    ("namespace", "pod", "container", "gpu", "uuid", "pci_bus_id", "method", "claim", "mig"),
)
POD_RDMA_INFO = MetricSpec(
    "fabricscope_pod_rdma_info",
    "gauge",
    "An RDMA or SR-IOV device allocated to a container (kubelet pod-resources: a device "
    "plugin's, or a ResourceClaim's, then claim names it and resource is the DRA driver); "
    "always 1. device_id is the device plugin's id (or the DRA driver's device name) as it "
    "is; device is the RDMA device it resolves to (empty when it is not visible on the host, "
    "e.g. a VF moved into the pod) and pci_bus_id its PCI address. For an SR-IOV virtual "
    "function, pf_device and pf_pci_bus_id are the physical function it rides on, whose "
    "port is the cable to the switch. Join onto port series with "
    "* on(device) group_left(namespace, pod) fabricscope_pod_rdma_info (or on pf_device, "
    "relabelled to device, for the VF's physical port).",
    (
        "namespace",
        "pod",
        "container",
        "resource",
        "device_id",
        "device",
        "pci_bus_id",
        "claim",
        "pf_device",
        "pf_pci_bus_id",
    ),
)
PODS = MetricSpec(
    "fabricscope_attribution_pods",
    "gauge",
    "Pods on this node holding at least one attributed GPU or RDMA device.",
)
METHOD_UP = MetricSpec(
    "fabricscope_attribution_method_up",
    "gauge",
    "1 when an attribution method worked in the latest pass, else 0: podresources when the "
    "kubelet's pod-resources List answered, cgroup when the pod index from the API server is "
    "current.",
    ("method",),
)
ERRORS = MetricSpec(
    "fabricscope_attribution_errors_total",
    "counter",
    "Attribution failures by reason: kubelet_unavailable (pod-resources List failed or missed "
    "its deadline), api_forbidden (the API server answered 403: RBAC), api_error (any other "
    "API server failure), cgroup_parse (an unparsable /proc/<pid>/cgroup). Devices stay "
    "unattributed meanwhile; hardware series are unaffected.",
    ("reason",),
)

POD_IMEX_CHANNEL_INFO = MetricSpec(
    "fabricscope_pod_imex_channel_info",
    "gauge",
    "An IMEX channel a container holds through a ComputeDomain ResourceClaim (NVIDIA's DRA "
    "driver, compute-domain.nvidia.com): the pod is in a multi-node NVLink domain; always "
    "1. Its GPUs are on fabricscope_pod_gpu_info, from its other claims.",
    ("namespace", "pod", "container", "claim", "channel"),
)

SPECS: tuple[MetricSpec, ...] = (
    POD_GPU_INFO,
    POD_RDMA_INFO,
    POD_IMEX_CHANNEL_INFO,
    PODS,
    METHOD_UP,
    ERRORS,
)


def _label(value: object) -> str:
    return "" if value is None else str(value)


def render(snap: AttributionSnapshot, out: Families) -> None:
    # before NVML's first answer the rows lack gpu and pci_bus_id: exported a pass later,
    # whole, so each series has one identity
    for g in () if snap.gpus_pending else snap.gpus:
        out.add(
            POD_GPU_INFO,
            1,
            g.namespace,
            g.pod,
            g.container,
            _label(g.gpu),
            g.uuid,
            _label(g.pci_bus_id),
            g.method,
            g.claim,
            g.mig,
        )
    for r in snap.rdma:
        out.add(
            POD_RDMA_INFO,
            1,
            r.namespace,
            r.pod,
            r.container,
            r.resource,
            r.device_id,
            _label(r.device),
            _label(r.pci_bus_id),
            r.claim,
            _label(r.pf_device),
            _label(r.pf_pci_bus_id),
        )
    for ch in snap.imex_channels:
        out.add(
            POD_IMEX_CHANNEL_INFO, 1, ch.namespace, ch.pod, ch.container, ch.claim, str(ch.channel)
        )
    out.add(PODS, snap.pods)
    for method, up in snap.methods_up:
        out.add(METHOD_UP, up, method)
    errors = dict(snap.errors_total)
    for reason in ERROR_REASONS:
        out.add(ERRORS, errors.get(reason, 0), reason)
