"""Metric specifications and the accumulator that renders snapshots into families.

A ``MetricSpec`` is written once, in the area module that owns it
(``exporter/metrics/infiniband.py``
and so on); ``exporter/metrics/catalog.py`` gathers every spec into the one catalog that rendering,
the docs generator and the dashboards' query check all read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter"]

#: How much a node exports (``--collector.detail``), from least to most. ``minimal``: what
#: the shipped alerts, dashboards and ``explain`` read, plus identity; ``default``: that and
#: the diagnostic counters, with booleans that are almost always 0 and facts every link
#: shares folded (see ``MetricSpec.fold``); ``full``: every series unfolded.
Detail = Literal["minimal", "default", "full"]
DETAILS: tuple[Detail, ...] = ("minimal", "default", "full")

#: The one label vocabulary. Every label of every metric is one of these, spelled this way.
LABELS: dict[str, str] = {
    "sampler": "fabricscope sampler name (infiniband, pci, netdev, ...)",
    "reason": "why something failed, from a fixed per-metric vocabulary",
    "device": "RDMA device name, as in /sys/class/infiniband (mlx5_0)",
    "port": "RDMA port number (1-based)",
    "counter": "counter file name as the kernel spells it (for generically exported counters)",
    "source": "which sysfs directory a counter came from (counters, hw_counters, counters_ext)",
    "netdev": "network interface name (eth0, ib0)",
    "queue": "queue or traffic-class index, or priority number",
    "direction": "rx or tx",
    "statistic": "ethtool statistic name as the driver spells it",
    "pci_bus_id": "PCI address domain:bus:device.function (0000:19:00.0)",
    "numa_node": "NUMA node number, -1 when the platform reports none",
    "link_layer": "InfiniBand or Ethernet (RoCE)",
    "comparison": "what a port's rate was held to: history, peers or expected",
    "state": "port or link state name, or a GPU's NVLink fabric registration state",
    "change": "a node label change the topology controller applied: set or removed",
    "result": "how a topology controller pass ended: ok, map_error, nodes_error",
    "fabric_status": "NVML's error name a GPU's NVLink fabric registration failed with "
    "(INSUFFICIENT_RESOURCES); empty unless its state is failed",
    "cluster_uuid": "the UUID of the multi-node NVLink cluster a GPU joined (8-4-4-4-12 hex)",
    "clique_id": "the ID of the NVLink clique a GPU joined in its cluster (decimal)",
    "role": "what a PCI device is to fabricscope: gpu, nic, bridge",
    "vendor": "PCI vendor id (0x10de)",
    "model": "PCI device id or model name",
    "parent_pci_bus_id": "PCI address of the upstream bridge",
    "peer_pci_bus_id": "PCI address of the other GPU of a pair (0000:07:00.0)",
    "path_type": "nvidia-smi topo -m path type: PIX, PXB, PHB, NODE, SYS",
    "port_type": "PCIe port type from config space: root_port, upstream_port, downstream_port",
    "kind": "a finding's (or an NCCL warning's) kind, from a fixed vocabulary",
    "fw_ver": "firmware version",
    "board_id": "board identifier (PSID)",
    "hca_type": "HCA type reported by the driver (MT4129)",
    "node_guid": "node GUID",
    "node_type": "RDMA node type (CA, switch, router, RNIC)",
    "lid": "InfiniBand local identifier",
    "end": "which end of a cable a value was read at: local (this node's port) or peer (the "
    "port at the other end)",
    "peer_guid": "node GUID of the device at the other end of a local port's cable (0x and 16 "
    "hex digits)",
    "peer_port": "port number, on the device at the other end of the cable, the cable lands on",
    "peer_description": "node description of the device at the other end of the cable "
    "(printable ASCII, at most 64 characters)",
    "switch_guid": "node GUID of a switch one of the node's cables lands on (a leaf), or of the "
    "switch at the far end of that leaf's uplink (0x and 16 hex digits)",
    "switch_port": "port number on that switch",
    "switch_description": "node description of that switch (printable ASCII, at most 64 "
    "characters)",
    "driver": "kernel driver bound to the device",
    "operstate": "netdev operational state (up, down, ...)",
    "version": "software version",
    "python_version": "interpreter version",
    "gpu": "GPU index as NVML numbers it",
    "uuid": "GPU UUID",
    "mig_uuid": "a MIG device's own UUID (MIG-<uuid>, or MIG-GPU-<uuid>/<gi>/<ci> before "
    "driver R470)",
    "gpu_instance": "a MIG device's GPU instance id as NVML numbers it",
    "compute_instance": "a MIG device's compute instance id within its GPU instance",
    "profile": "a MIG device's profile as NVIDIA names it (1g.10gb, 3g.40gb)",
    "link": "NVLink index",
    "remote_type": "what is at the far end of an NVLink: GPU, NVSwitch, IBMNPU, unknown",
    "peer": "probe peer host",
    "peer_gpu": "the probe peer's GPU index as NVML numbers it on that node",
    "collective": "probe collective: all_reduce, sendrecv, latency",
    "size_bytes": "probe message size in bytes",
    "namespace": "Kubernetes namespace",
    "pod": "Kubernetes pod name",
    "container": "Kubernetes container name",
    "resource": "Kubernetes extended resource name as the kubelet reports it (nvidia.com/gpu)",
    "device_id": "device id a device plugin gave the kubelet (GPU UUID, VF PCI address, ...)",
    "method": "how a pod attribution was made: podresources (kubelet API) or cgroup",
    "claim": "the ResourceClaim (Dynamic Resource Allocation) a device came with; empty for "
    "a device plugin's",
    "mig": "which MIG slice of the GPU (gi<n>/ci<n>, gi<n> where NVML gave no compute instance, "
    "the DRA driver's mig-<profile>-... name, or unknown); empty for a whole GPU",
    "channel": "an IMEX channel's number (/dev/nvidia-caps-imex-channels/channel<n>)",
    "pf_device": "the RDMA device of the SR-IOV physical function a virtual function rides on",
    "pf_pci_bus_id": "PCI address of the SR-IOV physical function a virtual function rides on",
    "cpus": "CPU list in kernel list format (0-31,64-95)",
    "variable": "environment variable name, from a fixed allowlist (NCCL_IB_HCA)",
    "value": "a setting's value as the process was started with it, or <redacted>",
    "job_name": "a training job's name: --throughput.file PATH=JOB, --throughput.job or the "
    "file's stem; in Kubernetes the pod annotation fabricscope.io/job, else the pod's owner",
    "transport": "how an NCCL channel connection moves data, as NCCL names it: NET/IB, "
    "NET/Socket, NET/other, P2P/CUMEM, P2P/IPC, P2P/direct, SHM, other",
    "gdr": "1 when an NCCL network channel uses GPUDirect RDMA (NCCL printed /GDRDMA), else 0",
    "status": "an IB work completion's status, rdma-core's ibv_wc_status name (retry_exc_err)",
    "vendor_error": "an IB work completion's vendor error (0-255), or other (not a number "
    "0-255, or past the per-container or per-node cap on distinct pairs)",
    "ras_endpoint": "the address:port of an NCCL job's RAS service the agent asks "
    "(127.0.0.1:28028), empty where there is none to reach",
    "host": "the IP address of an NCCL process's bootstrap interface, as NCCL's RAS reports "
    "it, or an IP address of a node",
    "pid": "a process id as the process sees itself (its own PID namespace)",
    "rank": "an NCCL rank: its number in the largest communicator it belongs to",
    "format": "the log format whose parser read a throughput line (composer, hf_trainer, "
    "megatron, deepspeed, torchtitan, lightning, nanogpt, custom)",
    "mtu": "a network interface's MTU in bytes, on its info series",
    "speed": "a link's negotiated speed in bytes per second, on its info series (empty while "
    "unknown)",
    "child": "the sampler whose supervised child process a process_* series is about "
    "(nvml, throughput, ibpeer); empty (absent) for the agent's main process",
}

#: the agent's own names, and the standard process_* names every exporter publishes itself
_NAME = re.compile(r"^(fabricscope_[a-z0-9_]+|process_[a-z_]+)$")
_UNITS = ("bytes", "seconds", "bytes_per_second", "transfers_per_second", "ratio", "celsius")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family.

    ``name`` is the exposition name (counters end in ``_total``). ``unit`` is a base unit
    (``bytes``, ``seconds``, ``bytes_per_second`` ...) and must be the name's suffix (before
    ``_total``), or empty for dimensionless values, states and info series. ``detail`` is
    the lowest ``--collector.detail`` level that exports the family at all; ``fold`` says,
    in a sentence, which of its series levels below ``full`` leave out or fold (empty: none).
    """

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""
    detail: Detail = "minimal"
    fold: str = ""

    def __post_init__(self) -> None:
        problems = list(spec_problems(self))
        if problems:
            raise ValueError(f"bad metric spec {self.name}: {'; '.join(problems)}")

    @property
    def family_name(self) -> str:
        """Name without the counter suffix, as the text format's TYPE line wants it."""
        if self.type == "counter":
            return self.name[: -len("_total")]
        return self.name


def spec_problems(spec: MetricSpec) -> list[str]:
    """Convention violations of one spec (empty when it follows Prometheus conventions)."""
    out = []
    if not _NAME.match(spec.name):
        out.append("name must be fabricscope_ (or the standard process_) followed by [a-z0-9_]")
    if spec.type == "counter" and not spec.name.endswith("_total"):
        out.append("counters end in _total")
    if spec.type != "counter" and spec.name.endswith("_total"):
        out.append("only counters end in _total")
    base = spec.name.removesuffix("_total")
    if spec.unit:
        if spec.unit not in _UNITS:
            out.append(f"unit {spec.unit} is not a base unit")
        elif not base.endswith("_" + spec.unit):
            out.append(f"name must end in _{spec.unit}")
    if base.endswith("_info") and (spec.type != "gauge" or spec.unit):
        out.append("_info series are unitless gauges of value 1")
    for label in spec.labels:
        if label not in LABELS:
            out.append(f"label {label} is not in the vocabulary (exporter/metrics/spec.py LABELS)")
    if len(set(spec.labels)) != len(spec.labels):
        out.append("duplicate label")
    if len(spec.labels) > 12:
        out.append("more than 12 labels")
    if not spec.help or spec.help[0].islower() or not spec.help.endswith("."):
        out.append("help must be a sentence: capitalised, ending in a full stop")
    if spec.detail not in DETAILS:
        out.append(f"detail must be one of {', '.join(DETAILS)}")
    if spec.fold and (spec.fold[0].islower() or not spec.fold.endswith(".")):
        out.append("fold must be a sentence: capitalised, ending in a full stop")
    if spec.fold and spec.detail == "full":
        out.append("a family exported only at full detail folds nothing")
    return out


def detail_rank(level: Detail) -> int:
    """0 for minimal, 1 for default, 2 for full."""
    return DETAILS.index(level)


class Families:
    """Accumulates samples per spec during one render.

    ``add(spec, value, *label_values)`` takes label values positionally, in the order of
    ``spec.labels``. A sample with a ``None`` value is skipped: absent stays absent, and so
    is a sample of a family whose ``detail`` is above this render's ``detail`` level.
    Renderers read ``detail`` (or ``folds``) for the folds that depend on values. The
    default is ``full``: everything, as unit tests of parsing want it; the agent renders at
    its ``--collector.detail``.
    """

    __slots__ = ("_data", "_rank", "detail")

    def __init__(self, detail: Detail = "full") -> None:
        if detail not in DETAILS:
            raise ValueError(f"detail must be one of {', '.join(DETAILS)}, got {detail!r}")
        self._data: dict[str, tuple[MetricSpec, dict[tuple[str, ...], float]]] = {}
        self.detail: Detail = detail
        self._rank = DETAILS.index(detail)

    @property
    def folds(self) -> bool:
        """True below ``full``: fold almost-always-0 booleans and facts every link shares."""
        return self._rank < 2

    def wants(self, spec: MetricSpec) -> bool:
        """Whether this render exports ``spec``'s family at all."""
        return DETAILS.index(spec.detail) <= self._rank

    def add(self, spec: MetricSpec, value: float | int | bool | None, *label_values: str) -> None:
        if value is None or DETAILS.index(spec.detail) > self._rank:
            return
        if len(label_values) != len(spec.labels):
            raise ValueError(
                f"{spec.name} takes labels {spec.labels}, got {len(label_values)} values"
            )
        entry = self._data.get(spec.name)
        if entry is None:
            entry = (spec, {})
            self._data[spec.name] = entry
        elif entry[0] is not spec:
            raise ValueError(f"two specs named {spec.name}")
        entry[1][label_values] = float(value)

    def declare(self, spec: MetricSpec) -> None:
        """Make sure the family exists (HELP/TYPE emitted) even with no samples."""
        if spec.name not in self._data and self.wants(spec):
            self._data[spec.name] = (spec, {})

    def items(self) -> list[tuple[MetricSpec, list[tuple[tuple[str, ...], float]]]]:
        """Families sorted by name, samples sorted by label values."""
        return [
            (spec, sorted(samples.items())) for _, (spec, samples) in sorted(self._data.items())
        ]

    def __len__(self) -> int:
        return sum(len(s) for _, s in self._data.values())
