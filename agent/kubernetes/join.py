"""The kubelet's allocations joined to the hardware snapshots (pure): device plugins' ids and
ResourceClaims' devices become GPU (whole, MIG slice, shared) and RDMA (with the physical
function a virtual function rides on) attributions.

Device plugins' ids: a GPU id is a GPU or MIG UUID, an index (``3``, MIG ``3:1``), or a
time-slicing or MPS replica ``<id>::<replica>``, joined to the NVML snapshot for the GPU's
index and PCI address (a MIG slice to its parent GPU); an RDMA / SR-IOV id is a PCI address or
an RDMA device name, joined to the InfiniBand snapshot. An id in another format is kept as it
is, never dropped. A claim's devices are resolved by :mod:`agent.kubernetes.claims`. Nothing
here reads the host: the caller passes the CDI view and the ``physfn`` lookup in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from agent.infiniband.records import InfinibandSnapshot
from agent.kubernetes.claims import HostView, claimed_imex_channels, resolve_claim_device
from agent.kubernetes.podresources import PodAllocation
from agent.kubernetes.records import (
    ContainerCpus,
    GpuAttribution,
    ImexChannelAttribution,
    RdmaAttribution,
)
from agent.nvml.mig import MigDevice
from agent.nvml.snapshot import NvmlGpu, NvmlSnapshot

_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_INDEX = re.compile(r"^(\d+)(?::\d+)?$")  # device-id-strategy=index: "3", MIG "3:1"
_MIG_INDEX = re.compile(r"^(\d{1,4}):(\d{1,4})$")
#: resource-name prefixes of the SR-IOV / RDMA device plugins' usual resource pools
RDMA_RESOURCE_PREFIXES = ("rdma/", "openshift.io/", "intel.com/", "mellanox.com/")


def normalize_pci_address(text: str) -> str | None:
    """``0000:1a:00.2`` for ``0000:1A:00.2`` or ``1a:00.2``; None when not a PCI address."""
    m = _PCI.match(text.strip())
    if not m:
        return None
    domain = (m.group(1) or "0000").lower()
    return f"{domain.zfill(4)}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def is_gpu_resource(resource: str, device_ids: Iterable[str]) -> bool:
    """NVIDIA GPU resources: ``nvidia.com/gpu`` (and renamed shared pools such as
    ``nvidia.com/gpu.shared``), ``nvidia.com/mig-*``, or any ``nvidia.com/`` resource whose
    ids are GPU or MIG UUIDs."""
    if not resource.startswith("nvidia.com/"):
        return False
    kind = resource[len("nvidia.com/") :]
    if kind.startswith(("gpu", "mig-")):
        return True
    return any(i.startswith(("GPU-", "MIG-")) for i in device_ids)


def is_rdma_resource(resource: str) -> bool:
    """SR-IOV and RDMA device-plugin pools by their usual names: ``rdma/*``,
    ``openshift.io/*``, ``intel.com/*``, ``mellanox.com/*``, and any name mentioning rdma,
    sriov or hostdev (``nvidia.com/rdma_shared_device_a``, ``nvidia.com/hostdev``)."""
    low = resource.lower()
    return low.startswith(RDMA_RESOURCE_PREFIXES) or any(
        word in low for word in ("rdma", "sriov", "hostdev")
    )


def resolve_gpu(device_id: str, nvml: NvmlSnapshot | None) -> tuple[str, NvmlGpu | None]:
    """(uuid, NVML GPU) for one ``nvidia.com`` device id.

    ``GPU-<uuid>`` is looked up by UUID; ``MIG-GPU-<uuid>/<gi>/<ci>`` (drivers before R470)
    names its parent; ``MIG-<uuid>`` (R470 on) does not, and is looked up among the MIG
    devices NVML enumerated (:mod:`agent.nvml.mig`) for its parent (None when NVML knows no
    such MIG device); ``3`` or ``3:1`` (device-id-strategy=index) is looked up by index and
    reports the GPU's UUID; time-slicing's ``<id>::<replica>`` is the device ``<id>``.
    """
    raw = device_id.split("::", 1)[0]
    gpus = nvml.gpus if nvml is not None else ()
    by_uuid = {g.uuid.lower(): g for g in gpus if g.uuid}
    if raw.startswith("GPU-"):
        return raw, by_uuid.get(raw.lower())
    if raw.startswith("MIG-GPU-"):
        return raw, by_uuid.get(raw[len("MIG-") :].split("/", 1)[0].lower())
    if raw.startswith("MIG-"):
        mig = _mig_device(raw, nvml)
        return raw, next((g for g in gpus if mig is not None and g.index == mig.gpu), None)
    m = _INDEX.match(raw)
    if m:
        index = int(m.group(1))
        gpu = next((g for g in gpus if g.index == index), None)
        whole = ":" not in raw
        return (gpu.uuid if whole and gpu is not None and gpu.uuid else raw), gpu
    return raw, None


def resolve_rdma(device_id: str, ib: InfinibandSnapshot | None) -> tuple[str | None, str | None]:
    """(RDMA device, PCI address) for one RDMA / SR-IOV device id: a PCI address is matched
    against the RDMA devices' PCI addresses (and kept as the address when none matches), a
    name against their names; anything else resolves to (None, None)."""
    devices = ib.devices if ib is not None else ()
    pci = normalize_pci_address(device_id)
    if pci is not None:
        dev = next((d for d in devices if d.pci_bus_id == pci), None)
        return (dev.name if dev is not None else None), pci
    dev = next((d for d in devices if d.name == device_id), None)
    if dev is not None:
        return dev.name, dev.pci_bus_id
    return None, None


#: (resource, device id, RDMA device, PCI address) of one RDMA allocation
RdmaFound = tuple[str, str, str | None, str | None]


def _no_physfn(_pci: str) -> str | None:
    return None


def attribute_allocations(
    pods: Iterable[PodAllocation],
    nvml: NvmlSnapshot | None,
    ib: InfinibandSnapshot | None,
    host: HostView | None = None,
    physfn: Callable[[str], str | None] = _no_physfn,
) -> tuple[list[GpuAttribution], list[RdmaAttribution], list[ContainerCpus]]:
    """Join the kubelet's allocations (device plugins' and ResourceClaims') to the hardware
    snapshots; ``host`` resolves claims' devices, ``physfn`` gives a VF's physical function
    (pure but for those two). A device given twice to one container (two time-slicing
    replicas of one GPU) is one attribution."""
    gpus: dict[GpuAttribution, None] = {}
    rdma: dict[RdmaAttribution, None] = {}
    cpus: list[ContainerCpus] = []
    host = host or HostView()
    ib_devices = ib.devices if ib is not None else ()

    def rdma_row(where: tuple[PodAllocation, str, str], found: RdmaFound) -> RdmaAttribution:
        p, container, claim = where
        resource, device_id, dev, pci = found
        pf = physfn(pci) if pci is not None else None
        pf_dev = next((d.name for d in ib_devices if pf is not None and d.pci_bus_id == pf), None)
        return RdmaAttribution(
            p.namespace, p.name, container, resource, device_id, dev, pci, claim, pf, pf_dev
        )

    for p in pods:
        for c in p.containers:
            if c.cpu_ids:
                cpus.append(ContainerCpus(p.namespace, p.name, c.name, c.cpu_ids))
            for claim in c.claims:
                for cd in claim.devices:
                    r = resolve_claim_device(claim, cd, host, nvml, ib)
                    for cg in r.gpus:
                        gpus[
                            GpuAttribution(
                                p.namespace,
                                p.name,
                                c.name,
                                cg.uuid,
                                cg.gpu,
                                cg.pci_bus_id,
                                "podresources",
                                claim.name,
                                cg.mig,
                            )
                        ] = None
                    for x in r.rdma:
                        found = (cd.driver, r.device_id, x.device, x.pci_bus_id)
                        rdma[rdma_row((p, c.name, claim.name), found)] = None
            for d in c.devices:
                if is_gpu_resource(d.resource_name, d.device_ids):
                    for device_id in d.device_ids:
                        uuid, g = resolve_gpu(device_id, nvml)
                        mig = uuid.startswith("MIG-") or ":" in uuid
                        gpus[
                            GpuAttribution(
                                p.namespace,
                                p.name,
                                c.name,
                                uuid,
                                g.index if g is not None else None,
                                g.pci_bus_id if g is not None else None,
                                "podresources",
                                mig=_mig_label(uuid, nvml) if mig else "",
                            )
                        ] = None
                    continue
                resolved = {i: resolve_rdma(i, ib) for i in d.device_ids}
                if not is_rdma_resource(d.resource_name) and not any(
                    dev is not None for dev, _ in resolved.values()
                ):
                    continue  # another kind of device (FPGA, a non-NVIDIA GPU ...)
                for device_id, (dev, pci) in resolved.items():
                    found = (d.resource_name, device_id, dev, pci)
                    rdma[rdma_row((p, c.name, ""), found)] = None
    return list(gpus), list(rdma), cpus


def attribute_imex_channels(
    pods: Iterable[PodAllocation], host: HostView | None = None
) -> list[ImexChannelAttribution]:
    """The IMEX channels containers hold through ComputeDomain claims (pure but for
    ``host``'s CDI specs); one per (container, claim, channel)."""
    host = host or HostView()
    out: dict[ImexChannelAttribution, None] = {}
    for p in pods:
        for c in p.containers:
            for claim in c.claims:
                for cd in claim.devices:
                    for ch in claimed_imex_channels(cd, host):
                        out[ImexChannelAttribution(p.namespace, p.name, c.name, claim.name, ch)] = (
                            None
                        )
    return sorted(out)


def _mig_device(uuid: str, nvml: NvmlSnapshot | None) -> MigDevice | None:
    """The MIG device NVML enumerated under ``uuid`` (case-insensitive), or None."""
    want = uuid.lower()
    devices = nvml.mig_devices if nvml is not None else ()
    return next((d for d in devices if d.uuid.lower() == want), None)


def _mig_label(device_id: str, nvml: NvmlSnapshot | None) -> str:
    """The ``mig`` of a device plugin's MIG id: ``gi/ci`` from ``MIG-GPU-<uuid>/<gi>/<ci>``,
    from NVML's MIG device for ``MIG-<uuid>``, or index ``3:1``; else ``unknown``."""
    if device_id.startswith("MIG-GPU-"):
        parts = device_id.split("/")
        if len(parts) == 3:
            return f"gi{parts[1]}/ci{parts[2]}"
    mig = _mig_device(device_id, nvml) if device_id.startswith("MIG-") else None
    slot = _MIG_INDEX.match(device_id)
    if slot is not None and nvml is not None:
        # device-id-strategy=index: "<GPU index>:<MIG device slot>", the slot NVML's
        # nvmlDeviceGetMigDeviceHandleByIndex is asked with
        gpu, n = int(slot.group(1)), int(slot.group(2))
        mig = next((d for d in nvml.mig_devices if d.gpu == gpu and d.slot == n), None)
    return mig.instance if mig is not None else "unknown"
