"""Dynamic Resource Allocation: the devices of each container's ResourceClaims, resolved to
GPUs (whole, or a MIG slice with its parent) and RDMA devices (with the physical function a
virtual function rides on), pure apart from the two lookups the caller passes in.

A claim device (:class:`~agent.kubernetes.podresources.ClaimDevice`) is resolved from, in
order: the CDI devices it was prepared as, looked up in the node's CDI specs
(:mod:`agent.cdi`), whose device nodes and environment name the hardware; and, for the
NVIDIA GPU DRA driver (``gpu.nvidia.com``), the device name itself (``gpu-<minor>``,
``gpu-<minor>-mig-...``). GPU minors become UUIDs and PCI addresses through the driver's
procfs files, then NVML indices through the NVML snapshot.

A device that resolves to nothing is a GPU still when its driver is ``gpu.nvidia.com``: it is
attributed with ``gpu`` None, which makes the probe's allocation unknown (fail closed). An
IMEX channel (a ComputeDomain claim of ``compute-domain.nvidia.com``: its CDI device node
``/dev/nvidia-caps-imex-channels/channel<N>``, else its device name ``channel-<N>``) is the
pod's membership of a multi-node NVLink domain: it is attributed as a channel, names no GPU,
and leaves the GPUs of the pod's other claims as they are. A device of another driver that
names no GPU, RDMA device or channel (an FPGA) is not attributed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agent.cdi.nvidia import GpuMinor, MigCapability
from agent.cdi.registry import CdiIndex
from agent.cdi.resolve import DeviceRefs, device_refs, imex_channel_of, nvidia_dra_minor
from agent.infiniband.records import InfinibandSnapshot
from agent.kubernetes.podresources import ClaimAllocation, ClaimDevice, PodAllocation
from agent.nvml.snapshot import NvmlSnapshot

#: the NVIDIA GPU DRA driver's name (ResourceSlice ``spec.driver``)
NVIDIA_GPU_DRIVER = "gpu.nvidia.com"
#: the NVIDIA DRA driver's ComputeDomain (IMEX channel) half
NVIDIA_COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"


@dataclass(frozen=True, slots=True)
class ClaimedGpu:
    """A GPU or MIG slice one claim device stands for. ``uuid``: the GPU's (a MIG slice's
    parent's when its own is not known) or a MIG device's own; ``mig``: which slice
    (``gi11/ci0``, or the driver's name for it), empty for a whole GPU."""

    uuid: str
    gpu: int | None
    pci_bus_id: str | None
    mig: str = ""


@dataclass(frozen=True, slots=True)
class ClaimedRdma:
    """An RDMA device (``device``) or PCI function (``pci_bus_id``) one claim device stands
    for, and the physical function a VF rides on."""

    device: str | None
    pci_bus_id: str | None


@dataclass(frozen=True, slots=True)
class HostView:
    """What resolution needs from the host besides the snapshots: the CDI devices, GPUs and
    MIG capabilities by driver minor, and the RDMA device behind a ``uverbs<N>`` node."""

    cdi: CdiIndex = field(default_factory=CdiIndex)
    gpu_minors: dict[int, GpuMinor] = field(default_factory=dict)
    mig_caps: dict[int, MigCapability] = field(default_factory=dict)
    uverbs: Callable[[int], str | None] = lambda _n: None


@dataclass(frozen=True, slots=True)
class ResolvedClaimDevice:
    claim: ClaimAllocation
    device: ClaimDevice
    #: the id shown for it: the driver's device name, else its first CDI device
    device_id: str
    gpus: tuple[ClaimedGpu, ...]
    rdma: tuple[ClaimedRdma, ...]
    #: IMEX channels (a ComputeDomain's), by number
    imex_channels: tuple[int, ...] = ()


def claim_devices(pods: Iterable[PodAllocation]) -> bool:
    """Whether any container holds a ResourceClaim device (then the host is looked at)."""
    return any(r.devices for p in pods for c in p.containers for r in c.claims)


def resolve_claim_device(
    claim: ClaimAllocation,
    device: ClaimDevice,
    host: HostView,
    nvml: NvmlSnapshot | None,
    ib: InfinibandSnapshot | None,
) -> ResolvedClaimDevice:
    refs: list[DeviceRefs] = []
    for name in device.cdi_devices:
        cdi = host.cdi.get(name)
        if cdi is not None:
            refs.append(device_refs(cdi))
    gpus = _gpus(refs, host, nvml)
    if not gpus and device.driver == NVIDIA_GPU_DRIVER:
        gpus = _gpus_by_name(device, host, nvml)
    rdma = _rdma(refs, host, ib)
    if not gpus and not rdma and device.driver == NVIDIA_GPU_DRIVER:
        shown = device.device or (device.cdi_devices[0] if device.cdi_devices else "")
        gpus = (ClaimedGpu(shown, None, None),)  # a GPU no lookup resolved: fail closed
    device_id = device.device or (device.cdi_devices[0] if device.cdi_devices else "")
    return ResolvedClaimDevice(claim, device, device_id, gpus, rdma, _channels(refs, device))


def claimed_imex_channels(device: ClaimDevice, host: HostView) -> tuple[int, ...]:
    """The IMEX channels one claim device stands for (no GPU or RDMA lookup is made)."""
    refs = [device_refs(cdi) for n in device.cdi_devices if (cdi := host.cdi.get(n)) is not None]
    return _channels(refs, device)


def _channels(refs: list[DeviceRefs], device: ClaimDevice) -> tuple[int, ...]:
    """The channels of the CDI specs' device nodes, else (the ComputeDomain driver's
    devices only) of the device's name."""
    channels = tuple(dict.fromkeys(c for r in refs for c in r.imex_channels))
    if not channels and device.driver == NVIDIA_COMPUTE_DOMAIN_DRIVER:
        named = (imex_channel_of(n) for n in (device.device, *device.cdi_devices) if n)
        channels = tuple(c for c in named if c is not None)[:1]
    return channels


def _by_uuid(nvml: NvmlSnapshot | None) -> dict[str, int]:
    return {g.uuid.lower(): g.index for g in (nvml.gpus if nvml else ()) if g.uuid}


def _gpu(minor: int, host: HostView, nvml: NvmlSnapshot | None, mig: str) -> ClaimedGpu:
    g = host.gpu_minors.get(minor)
    uuid = g.uuid if g is not None and g.uuid else ""
    index = _by_uuid(nvml).get(uuid.lower()) if uuid else None
    if index is None and nvml is not None and g is not None and g.pci_bus_id:
        index = next((x.index for x in nvml.gpus if x.pci_bus_id == g.pci_bus_id), None)
    return ClaimedGpu(uuid or f"minor-{minor}", index, g.pci_bus_id if g else None, mig)


def _gpus(
    refs: list[DeviceRefs], host: HostView, nvml: NvmlSnapshot | None
) -> tuple[ClaimedGpu, ...]:
    out: list[ClaimedGpu] = []
    for r in refs:
        # MIG: the compute instances among the capabilities name the slice and its parent
        slices = [
            host.mig_caps[c]
            for c in r.mig_caps
            if c in host.mig_caps and host.mig_caps[c].ci is not None
        ]
        for s in slices:
            out.append(_gpu(s.gpu_minor, host, nvml, f"gi{s.gi}/ci{s.ci}"))
        if r.mig_caps and not slices:
            # a MIG slice whose capabilities mig-minors did not name: its parent node still
            # says which GPU it is on
            out.extend(_gpu(m, host, nvml, "unknown") for m in r.gpu_minors)
        elif not r.mig_caps:
            out.extend(_gpu(m, host, nvml, "") for m in r.gpu_minors)
        by_uuid = _by_uuid(nvml)
        for u in r.uuids:
            if not any(g.uuid == u for g in out):
                idx = by_uuid.get(u.lower())
                pci = next(
                    (g.pci_bus_id for g in (nvml.gpus if nvml else ()) if g.index == idx), None
                )
                out.append(ClaimedGpu(u, idx, pci, "" if u.startswith("GPU-") else "unknown"))
    return tuple(dict.fromkeys(out))


def _gpus_by_name(
    device: ClaimDevice, host: HostView, nvml: NvmlSnapshot | None
) -> tuple[ClaimedGpu, ...]:
    for name in (device.device, *device.cdi_devices):
        parsed = nvidia_dra_minor(name) if name else None
        if parsed is not None:
            minor, is_mig = parsed
            mig = name[name.index("-mig-") + 1 :] if is_mig else ""
            if minor in host.gpu_minors:
                return (_gpu(minor, host, nvml, mig),)
    return ()


def _rdma(
    refs: list[DeviceRefs], host: HostView, ib: InfinibandSnapshot | None
) -> tuple[ClaimedRdma, ...]:
    devices = ib.devices if ib is not None else ()
    out: list[ClaimedRdma] = []
    for r in refs:
        for n in r.uverbs:
            name = host.uverbs(n)
            dev = next((d for d in devices if d.name == name), None) if name else None
            out.append(ClaimedRdma(name, dev.pci_bus_id if dev is not None else None))
        for pci in r.pci_addresses:
            if any(x.pci_bus_id == pci for x in out):
                continue
            dev = next((d for d in devices if d.pci_bus_id == pci), None)
            out.append(ClaimedRdma(dev.name if dev is not None else None, pci))
    named = [x for x in out if x.device is not None or x.pci_bus_id is not None]
    # a verbs node whose device could not be read says nothing the others do not
    return tuple(dict.fromkeys(named or out))
