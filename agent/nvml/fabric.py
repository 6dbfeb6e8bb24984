"""Each GPU's NVLink fabric registration (``nvmlDeviceGetGpuFabricInfoV``, the ``Fabric``
section of ``nvidia-smi -q``): whether the GPU has joined a multi-node NVLink domain (a
GB200 NVL72 rack, an NVSwitch tray system under Fabric Manager) and which one.

NVML answers a state (``NVML_GPU_FABRIC_STATE_*``: not supported, not started, in progress,
completed), a status that counts only once the state is completed (an nvmlReturn_t: success,
or why the registration failed, e.g. ``Insufficient Resources``), the cluster's UUID (16
bytes) and the clique's ID. The GPU's NVLink domain is ``<cluster UUID>.<clique ID>`` (the
value NVIDIA's GPU feature discovery puts in ``nvidia.com/gpu.clique`` and topograph in
``accelerator.topograph.run/domain``), and only when the state is completed, the status
success and the UUID not all zeros (an H100 without multi-node NVLink can say completed with
a zero UUID: every such GPU would seem to share one domain).

:func:`parse_fabric` turns one answer into a :class:`GpuFabric` (pure: an answer of the
wrong shape raises ``ValueError``); :func:`read_fabric` asks NVML for every GPU the pass did
not find lost: a GPU or driver that does not offer the call is the state ``not_supported``
(quiet: a PCIe GPU, a single H200), any other error one issue and no record for that GPU.

May import ``agent.core`` and ``agent.nvml.api`` / ``agent.nvml.sweep``; nothing else.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.nvml.api import NVML_ERROR_NAMES, NvmlApi
from agent.nvml.sweep import GpuLost, Miss, Pass

#: nvmlGpuFabricState_t, in fabricscope's names
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
#: a completed registration whose status is an error (the ``status`` says which)
FAILED = "failed"
#: completed and successful, but the cluster UUID is all zeros (no multi-node NVLink)
NO_DOMAIN = "no_domain"
#: every state the series may carry
STATES = (*FABRIC_STATES.values(), FAILED, NO_DOMAIN)

_HEX32 = re.compile(r"[0-9a-f]{32}")
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's fabric registration. ``cluster_uuid`` and ``clique_id`` are set only when
    the GPU is in a domain (state ``completed``); ``status`` is NVML's error name for a
    failed registration (``INSUFFICIENT_RESOURCES``), else ``None``."""

    gpu: int
    state: str
    cluster_uuid: str | None = None
    clique_id: int | None = None
    status: str | None = None

    @property
    def domain(self) -> str | None:
        """``<cluster UUID>.<clique ID>``, or ``None`` outside a domain."""
        if self.cluster_uuid is None or self.clique_id is None:
            return None
        return f"{self.cluster_uuid}.{self.clique_id}"


def format_uuid(hex32: str) -> str:
    """32 hex digits -> the 8-4-4-4-12 form nvidia-smi prints."""
    h = hex32.lower()
    if not _HEX32.fullmatch(h):
        raise ValueError(f"cluster UUID {hex32[:40]!r} is not 16 bytes in hex")
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_fabric(gpu: int, answer: tuple[str, int, int, int]) -> GpuFabric:
    """``(cluster UUID as 32 hex digits, status code, clique ID, state code)``, as
    :meth:`~agent.nvml.api.NvmlApi.gpu_fabric_info` answers, -> the GPU's record.
    ``ValueError`` for a state NVML does not define, a clique ID out of 32 bits or a UUID
    that is not 16 bytes (only looked at once the state is completed)."""
    hex32, status, clique, state_code = answer
    state = FABRIC_STATES.get(state_code)
    if state is None:
        raise ValueError(f"fabric state {state_code!r} is none of NVML's")
    if state != "completed":
        return GpuFabric(gpu, state)
    if status != 0:
        return GpuFabric(gpu, FAILED, status=NVML_ERROR_NAMES.get(status, f"ERROR_{status}"))
    if not 0 <= clique < 1 << 32:
        raise ValueError(f"clique ID {clique!r} is not a 32-bit unsigned integer")
    uuid = format_uuid(hex32)
    if uuid == _ZERO_UUID:
        return GpuFabric(gpu, NO_DOMAIN)
    return GpuFabric(gpu, state, uuid, clique)


def _one(api: NvmlApi, gpu: int) -> GpuFabric:
    return parse_fabric(gpu, api.gpu_fabric_info(gpu))


def read_fabric(api: NvmlApi, p: Pass, gpus: Iterable[int]) -> tuple[GpuFabric, ...]:
    """Each GPU's record (``not_supported`` where NVML does not offer the call); a GPU whose
    call failed otherwise, or whose answer does not parse, has none (one issue in ``p``)."""
    out: list[GpuFabric] = []
    for gpu in gpus:
        try:
            got = p.attempt(f"{gpu}/fabric", functools.partial(_one, api, gpu))
        except GpuLost:  # lost since its own pass: the GPU's series say so
            continue
        if got is Miss.UNSUPPORTED:
            out.append(GpuFabric(gpu, "not_supported"))
        elif isinstance(got, GpuFabric):
            out.append(got)
    return tuple(out)
