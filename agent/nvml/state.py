"""What the NVML sampler keeps from one pass to the next: which read path each value
answered on (a batched field value, a call, a legacy per-link field), the per-GPU caches of
facts that do not change (identity, a link's far end and speed) and the builder that turns
one GPU's answers into its :class:`~agent.nvml.snapshot.NvmlGpu`. No NVML call is made
here; :mod:`agent.nvml.sampler` makes them."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.nvml.api import (
    FI_ECC_DBE_VOL_TOTAL,
    FI_ECC_SBE_VOL_TOTAL,
    FI_NVLINK_THROUGHPUT_DATA_RX,
    FI_NVLINK_THROUGHPUT_DATA_TX,
    FI_PCIE_REPLAY_COUNTER,
    FI_REMAPPED_ROWS,
    NVLINK_ERROR_COUNTERS,
    SCOPE_ALL_LINKS,
    UNSUPPORTED,
)
from agent.nvml.fabric import GpuFabric
from agent.nvml.snapshot import (
    ComputeProcess,
    NvLink,
    NvmlGpu,
    PcieLink,
    RemappedRows,
)

#: answers to "is there a link n" meaning "no such link" (links 18-35 of an 18-link GPU
#: answer INVALID_ARGUMENT)
NO_LINK = UNSUPPORTED | {"INVALID_ARGUMENT"}


class Via(enum.Enum):
    """The NVML path that answers a value on one GPU, learned on the first read after each
    static refresh: a path that answered NOT_SUPPORTED is not asked again until the next."""

    FIELD = "field"  # an entry of the GPU's one batched nvmlDeviceGetFieldValues per pass
    CALL = "call"  # the value's own NVML call
    LEGACY = "legacy"  # an older per-link field id (links 0-11), one call each
    NOTHING = "nothing"  # no path answers: absent, not asked again


COUNTER_PATHS = (Via.FIELD, Via.CALL, Via.LEGACY)
GPU_PATHS = (Via.FIELD, Via.CALL)
#: the counters ``nvidia-smi nvlink -e`` shows (findings), read every ``link_error_rotation``
#: passes through fields 161-163; the others, every ``slow_error_rotation`` passes, per call
FAST_ERRORS = ("replay", "recovery", "crc_flit")
SLOW_ERRORS = ("crc_data", "ecc_data")
ERROR_COUNTER_IDS = dict(NVLINK_ERROR_COUNTERS)
#: GPU-level counters read each pass, by the fields that carry them in the batch
GPU_FIELDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("pcie_replays", (FI_PCIE_REPLAY_COUNTER,)),
    ("remapped_rows", FI_REMAPPED_ROWS),
    ("ecc_corrected", (FI_ECC_SBE_VOL_TOTAL,)),
    ("ecc_uncorrected", (FI_ECC_DBE_VOL_TOTAL,)),
    # NVLink payload KiB transmitted and received, summed over the GPU's links by NVML
    ("nvlink_data", (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX)),
)
GPU_FIELD_IDS = dict(GPU_FIELDS)
#: the scopeId a GPU-level value's fields are asked with (0 unless named here)
GPU_FIELD_SCOPES: Mapping[str, int] = {"nvlink_data": SCOPE_ALL_LINKS}
GPU_LEVEL = -1  # the "link" of a GPU-level value in the per-GPU caches


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What identifies a GPU and cannot change while the driver is loaded."""

    pci_bus_id: str | None = None
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    max_generation: int | None = None
    max_width: int | None = None


@dataclass(frozen=True, slots=True)
class LinkStatic:
    """What a link says that changes only with its state. ``complete``: read without an
    issue (otherwise read again on the next pass)."""

    state: int
    version: int | None
    speed_bytes_per_second: int | None
    remote_pci_bus_id: str | None
    remote_device_type: str | None
    complete: bool


@dataclass(slots=True)
class GpuCache:
    """What one GPU's passes carry to the next: static facts, the path that answers each
    value (:class:`Via`), and the last value of each NVLink error counter by
    ``(link, counter)`` (a key absent: not read yet, or its last read failed). A pass works
    on a copy and the sampler keeps the newest pass's copies."""

    identity: GpuIdentity
    #: identity read without an issue; else read again next pass
    static_complete: bool
    #: the pass on which the static facts are read again
    refresh_at: int
    #: link indices that exist (a probe that did not answer "no such link")
    links: tuple[int, ...]
    link_static: dict[int, LinkStatic] = field(default_factory=dict)
    via: dict[tuple[int, str], Via] = field(default_factory=dict)
    counts: dict[tuple[int, str], int | None] = field(default_factory=dict)
    #: NVML answered GPU_IS_LOST: read everything again
    stale: bool = False
    #: the NVLink traffic over all links, KiB transmitted and received, as last read (None:
    #: not read yet, or its last read failed or answered nothing)
    traffic_kib: tuple[int, int] | None = None
    #: the fabric registration as last read (None: not read yet, or its last read failed)
    fabric: GpuFabric | None = None

    def copy(self) -> GpuCache:
        return GpuCache(
            self.identity,
            self.static_complete,
            self.refresh_at,
            self.links,
            dict(self.link_static),
            dict(self.via),
            dict(self.counts),
            self.stale,
            self.traffic_kib,
            self.fabric,
        )


@dataclass(frozen=True, slots=True)
class NodeStatic:
    driver_version: str | None
    nvml_version: str | None
    max_links: int
    complete: bool


@dataclass(frozen=True, slots=True)
class State:
    """What the newest finished pass leaves for the next."""

    node: NodeStatic | None = None
    gpus: Mapping[int, GpuCache] = field(default_factory=dict)
    #: the pass that left it (-1: none yet)
    pass_index: int = -1


@dataclass(slots=True)
class GpuBuilder:
    index: int
    pci_bus_id: str | None = None
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    pcie: PcieLink = field(default_factory=PcieLink)
    remapped_rows: RemappedRows | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    clocks_event_reasons: int | None = None
    compute_processes: tuple[ComputeProcess, ...] | None = None
    nvlinks: list[NvLink] = field(default_factory=list)
    nvlink_transmitted_bytes: int | None = None
    nvlink_received_bytes: int | None = None

    def identify(self, ident: GpuIdentity) -> None:
        self.pci_bus_id = ident.pci_bus_id
        self.uuid = ident.uuid
        self.name = ident.name
        self.serial = ident.serial
        self.vbios_version = ident.vbios_version

    def freeze(self, lost: bool) -> NvmlGpu:
        return NvmlGpu(
            index=self.index,
            lost=lost,
            pci_bus_id=self.pci_bus_id,
            uuid=self.uuid,
            name=self.name,
            serial=self.serial,
            vbios_version=self.vbios_version,
            pcie=self.pcie,
            remapped_rows=self.remapped_rows,
            ecc_corrected_volatile=self.ecc_corrected_volatile,
            ecc_uncorrected_volatile=self.ecc_uncorrected_volatile,
            clocks_event_reasons=self.clocks_event_reasons,
            compute_processes=self.compute_processes,
            nvlinks=tuple(self.nvlinks),
            nvlink_transmitted_bytes=self.nvlink_transmitted_bytes,
            nvlink_received_bytes=self.nvlink_received_bytes,
        )
