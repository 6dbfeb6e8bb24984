"""MIG devices through NVML: which GPUs are in MIG mode, and which MIG devices (slices) each
one holds, so that a slice handed out by its UUID is attributed to its parent GPU.

What MIG is, as far as fabricscope cares
    A GPU in MIG mode is split into GPU instances (``gi``), each split into compute
    instances (``ci``); one (GPU instance, compute instance) pair is a MIG device, with a
    UUID of its own (``MIG-<uuid>`` since driver R470; ``MIG-GPU-<parent uuid>/<gi>/<ci>``
    before). The device plugin hands slices to pods by that UUID, and the UUID does not name
    the parent: only NVML knows which GPU a ``MIG-<uuid>`` lives on. A slice has no links of
    its own: a job on it rides on its parent's NVLinks and PCIe link, so attribution joins
    it to the parent (:mod:`agent.kubernetes.join`).

How a pass reads it (every pass, on every GPU NVML did not call lost)
    ``nvmlDeviceGetMigMode``: current and pending mode. ``NOT_SUPPORTED`` (a GPU without MIG,
    a driver before R450) is quiet: that GPU has no MIG record. A GPU whose current mode is
    enabled is then enumerated: ``nvmlDeviceGetMaxMigDeviceCount`` gives how many MIG device
    *slots* it has (7 on A100 and H100, whatever exists), and every slot is asked with
    ``nvmlDeviceGetMigDeviceHandleByIndex``; an empty slot answers ``NOT_FOUND`` (a GPU in MIG
    mode with no instance answers it for every slot), quietly. The slots are not dense: a
    recorded A100 with three MIG devices answered slots 0-2 and ``NOT_FOUND`` for slot 3
    (go-nvml issue 60), and after an instance is destroyed a later slot may still answer.
    Of each MIG device: ``nvmlDeviceGetUUID``, ``nvmlDeviceGetGpuInstanceId``,
    ``nvmlDeviceGetComputeInstanceId`` and ``nvmlDeviceGetName``, whose ``<model> MIG
    <profile>`` answer gives the profile (``1g.10gb``). MIG devices are read every pass, not
    cached: the MIG manager re-partitions GPUs while the agent runs, and a stale slice would
    attribute a pod to the wrong GPU.

Bad answers
    A slot count above :data:`MAX_MIG_DEVICES` is a ``parse`` issue and only that many slots
    are read. A UUID that is neither MIG form (or a parent UUID, or garbage) is a ``parse``
    issue and that slot is skipped: a malformed id must not become a label. A GI or CI id or
    a name that fails is absent (``None``), the slice still counts.

May import: :mod:`agent.core`, :mod:`agent.nvml.api`, :mod:`agent.nvml.sweep`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.core.sysfs import ReadIssue
from agent.nvml.api import UNSUPPORTED, NvmlApi
from agent.nvml.sweep import GpuLost, Miss, Pass

#: at most this many MIG device slots are read per GPU (A100, H100, H200 and GB200 have 7)
MAX_MIG_DEVICES = 64
#: answers of nvmlDeviceGetMigDeviceHandleByIndex that mean "no MIG device in this slot"
EMPTY_SLOT = UNSUPPORTED | {"NOT_FOUND", "INVALID_ARGUMENT"}
#: NVML_DEVICE_MIG_ENABLE
MIG_ENABLED = 1

_HEX = "[0-9a-fA-F]"
_UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
#: ``MIG-<uuid>`` (R470 on) or ``MIG-GPU-<uuid>/<gi>/<ci>`` (before)
MIG_UUID = re.compile(rf"^MIG-(?:{_UUID}|GPU-{_UUID}/\d{{1,4}}/\d{{1,4}})$")
#: the profile at the end of a MIG device's name: ``NVIDIA A100-SXM4-40GB MIG 1g.5gb``
_PROFILE = re.compile(r"\bMIG (\d{1,2}g\.\d{1,4}gb(?:\+[a-z]{1,8})?)$")


@dataclass(frozen=True, slots=True, order=True)
class MigMode:
    """A MIG-capable GPU's mode: ``enabled`` now, and ``pending`` (what it will be after the
    next GPU reset)."""

    gpu: int
    enabled: bool
    pending: bool | None = None


@dataclass(frozen=True, slots=True, order=True)
class MigDevice:
    """One MIG device: its parent GPU (NVML index and UUID), its slot under the parent, its
    own UUID, GPU and compute instance ids and profile (``None``: not answered)."""

    gpu: int
    slot: int
    uuid: str
    parent_uuid: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    profile: str | None = None

    @property
    def instance(self) -> str:
        """``gi<n>/ci<n>`` as the ``mig`` label spells a slice (``gi<n>`` when NVML gave no
        compute instance id); ``unknown`` without a GPU instance id."""
        if self.gpu_instance is None:
            return "unknown"
        if self.compute_instance is None:
            return f"gi{self.gpu_instance}"
        return f"gi{self.gpu_instance}/ci{self.compute_instance}"


def parse_profile(name: str) -> str | None:
    """``1g.10gb`` from a MIG device's name (``NVIDIA A100-SXM4-80GB MIG 1g.10gb``); None
    when the name carries none."""
    m = _PROFILE.search(name.strip())
    return m.group(1) if m else None


def check_mig_uuid(uuid: str) -> str:
    """``uuid`` when it is a MIG device UUID in either form, else ValueError."""
    if MIG_UUID.match(uuid) is None:
        raise ValueError(f"not a MIG device UUID: {uuid[:64]!r}")
    return uuid


def read_mig(
    api: NvmlApi, p: Pass, gpus: Iterable[tuple[int, str | None]]
) -> tuple[tuple[MigMode, ...], tuple[MigDevice, ...]]:
    """The MIG modes and devices of ``gpus`` ((NVML index, UUID) of each GPU not lost), under
    the pass's error policy (the module docstring)."""
    modes: list[MigMode] = []
    devices: list[MigDevice] = []
    for gpu, parent in gpus:
        try:
            mode = p.get(str(gpu), functools.partial(api.mig_mode, gpu))
            if mode is None:
                continue
            modes.append(MigMode(gpu, mode[0] == MIG_ENABLED, mode[1] == MIG_ENABLED))
            if mode[0] == MIG_ENABLED:
                devices.extend(_read_devices(api, p, gpu, parent))
        except GpuLost:
            continue  # the GPU loop calls it lost on its next pass
    return tuple(modes), tuple(devices)


def _read_devices(api: NvmlApi, p: Pass, gpu: int, parent: str | None) -> list[MigDevice]:
    g = str(gpu)
    slots = p.get(g, functools.partial(api.max_mig_device_count, gpu))
    if slots is None:
        return []
    if slots > MAX_MIG_DEVICES:
        p.issues.append(
            ReadIssue(
                f"nvml/{g}/nvmlDeviceGetMaxMigDeviceCount",
                "parse",
                f"{slots} MIG device slots, beyond {MAX_MIG_DEVICES}: the first read",
            )
        )
        slots = MAX_MIG_DEVICES
    out: list[MigDevice] = []
    for slot in range(max(slots, 0)):
        where = f"{g}/mig{slot}"
        uuid = p.attempt(where, functools.partial(api.mig_uuid, gpu, slot), quiet=EMPTY_SLOT)
        if isinstance(uuid, Miss):
            continue
        checked = p.get(f"{where}/uuid", functools.partial(check_mig_uuid, uuid))
        if checked is None:
            continue
        name = p.get(where, functools.partial(api.mig_name, gpu, slot))
        out.append(
            MigDevice(
                gpu,
                slot,
                checked,
                parent,
                p.get(where, functools.partial(api.mig_gpu_instance_id, gpu, slot)),
                p.get(where, functools.partial(api.mig_compute_instance_id, gpu, slot)),
                None if name is None else parse_profile(name),
            )
        )
    return out
