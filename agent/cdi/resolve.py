"""What hardware one CDI device names (pure): from its device nodes and environment, and,
for the NVIDIA GPU DRA driver, from its device name.

- ``/dev/nvidia<N>``: the GPU with driver minor N (the whole GPU, or a MIG slice's parent);
- ``/dev/nvidia-caps/nvidia-cap<N>``: a MIG GPU- or compute-instance capability (its parent
  and instance come from ``mig-minors``, :mod:`agent.cdi.nvidia`);
- ``/dev/nvidia-caps-imex-channels/channel<N>``: IMEX channel N, what a ComputeDomain
  (multi-node NVLink) claim of the NVIDIA driver's ``compute-domain.nvidia.com`` gives a
  pod: no GPU, the pod's membership of the NVLink domain;
- ``/dev/infiniband/uverbs<N>``: an RDMA device's verbs node (its name comes from sysfs
  ``class/infiniband_verbs/uverbs<N>/ibdev``); ``rdma_cm`` is shared by all and skipped;
- ``NVIDIA_VISIBLE_DEVICES`` values that are GPU or MIG UUIDs (``void``, ``all``, ``none``
  and indices say nothing about which device);
- any variable's comma-separated values that are PCI addresses (the SR-IOV device plugin's
  ``PCIDEVICE_<RESOURCE>=0000:3b:00.2`` convention);
- the NVIDIA GPU DRA driver's device names, ``<claim uid>-gpu-<minor>`` and
  ``<claim uid>-gpu-<minor>-mig-<profile>-...`` (its ``CanonicalName``; the pod-resources
  API's ``device_name`` is the same without the claim uid), whose number is the device
  minor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.cdi.spec import CdiDevice

_GPU_NODE = re.compile(r"^/dev/nvidia(\d{1,4})$")
_CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(\d{1,6})$")
_UVERBS = re.compile(r"^/dev/infiniband/uverbs(\d{1,4})$")
_IMEX_NODE = re.compile(r"^/dev/nvidia-caps-imex-channels/channel(\d{1,5})$")
#: the ComputeDomain driver's channel device name (``channel-0``; the claim's CDI device is
#: ``<claim uid>-channel-0``)
_CHANNEL_NAME = re.compile(r"(?:^|-)channel-(\d{1,5})$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]{8,64}$")
_PCI = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_DRA_NAME = re.compile(r"(?:^|-)gpu-(\d{1,4})(-mig-[A-Za-z0-9.+-]*)?$")
#: the longest device name the name patterns are tried on: the driver's names are a claim uid
#: and a short suffix (about 80 characters), a qualified CDI name at most two 256-character
#: parts; a longer name (only a hostile or broken kubelet sends one) names nothing, and the
#: patterns' cost stays bounded (searched unbounded, the MIG suffix made a 44 KB name take
#: 11 s: every ``-gpu-<n>-mig-`` in it started a scan to the end)
MAX_DEVICE_NAME = 600


@dataclass(frozen=True, slots=True)
class DeviceRefs:
    """The hardware references found in one CDI device, each in the order found."""

    gpu_minors: tuple[int, ...] = ()
    mig_caps: tuple[int, ...] = ()
    uverbs: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()
    pci_addresses: tuple[str, ...] = ()
    imex_channels: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not (
            self.gpu_minors
            or self.mig_caps
            or self.uverbs
            or self.uuids
            or self.pci_addresses
            or self.imex_channels
        )


def device_refs(device: CdiDevice) -> DeviceRefs:
    gpus: list[int] = []
    caps: list[int] = []
    verbs: list[int] = []
    channels: list[int] = []
    for path in device.device_nodes:
        for pattern, into in (
            (_GPU_NODE, gpus),
            (_CAP_NODE, caps),
            (_UVERBS, verbs),
            (_IMEX_NODE, channels),
        ):
            m = pattern.match(path)
            if m and int(m.group(1)) not in into:
                into.append(int(m.group(1)))
    uuids: list[str] = []
    pcis: list[str] = []
    for var in device.env:
        key, sep, value = var.partition("=")
        if not sep:
            continue
        for raw in value.split(",")[:64]:
            item = raw.strip()
            if key == "NVIDIA_VISIBLE_DEVICES" and _UUID.match(item) and item not in uuids:
                uuids.append(item)
            elif (pci := _pci(item)) is not None and pci not in pcis:
                pcis.append(pci)
    return DeviceRefs(
        tuple(gpus), tuple(caps), tuple(verbs), tuple(uuids), tuple(pcis), tuple(channels)
    )


def _pci(text: str) -> str | None:
    """``0000:3b:00.2`` (sysfs form) for a PCI address with or without its domain."""
    m = _PCI.match(text)
    if m is None:
        return None
    domain = (m.group(1) or "0000").lower().zfill(4)
    return f"{domain}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def nvidia_dra_minor(name: str) -> tuple[int, bool] | None:
    """(device minor, is a MIG slice) for the NVIDIA GPU DRA driver's device names
    (``gpu-3``, ``<claim uid>-gpu-3-mig-1g18gb-19-0``), else None (also for a name longer
    than :data:`MAX_DEVICE_NAME`)."""
    if len(name) > MAX_DEVICE_NAME:
        return None
    m = _DRA_NAME.search(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2) is not None


def imex_channel_of(name: str) -> int | None:
    """The channel of the ComputeDomain driver's device names (``channel-0``,
    ``<claim uid>-channel-0``), else None (also for a name longer than
    :data:`MAX_DEVICE_NAME`)."""
    if len(name) > MAX_DEVICE_NAME:
        return None
    m = _CHANNEL_NAME.search(name)
    return int(m.group(1)) if m else None
