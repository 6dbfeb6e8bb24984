"""What the NVML sampler returns: frozen records of one pass (GPUs, their PCIe link and
NVLinks with error counters, row remapping, compute processes, XID counts). Pure data: no
NVML call is made here; :mod:`agent.nvml.sampler` fills them, analysis and the exporter read them.
``None`` means "absent" (the GPU does not offer it, or it could not be read), never 0.

Every pass's snapshot is pickled by the NVML child and unpickled by the agent; the records
there are many of (a GPU, an NVLink and its counters: 8 GPUs x 18 links) pickle as their
class and the tuple of their fields (:func:`_by_fields`), not through the generic state
protocol of a frozen slotted dataclass: half the CPU, both ends, the same records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.core.sysfs import ReadIssue
from agent.nvml.api import CLOCKS_EVENT_REASONS, NVLINK_STATE_INACTIVE
from agent.nvml.fabric import GpuFabric
from agent.nvml.mig import MigDevice, MigMode


def _by_fields(record: Any) -> tuple[type, tuple[object, ...]]:
    """``__reduce__`` of a frozen slotted dataclass whose fields are all ``__init__``
    arguments: its class and its field values in order (``__slots__`` lists them)."""
    cls = type(record)
    return cls, tuple([getattr(record, name) for name in cls.__slots__])


#: the NVLink error counters that make a finding (what ``nvidia-smi nvlink -e`` shows)
FINDING_NVLINK_ERRORS = frozenset({"replay", "recovery", "crc_flit"})


@dataclass(frozen=True, slots=True)
class NvLinkErrorCounts:
    """Per-link NVLink error counters since the driver loaded (or the last reset);
    ``None`` = the GPU does not offer it."""

    __reduce__ = _by_fields

    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None
    ecc_data: int | None = None

    def items(self) -> tuple[tuple[str, int | None], ...]:
        return (
            ("replay", self.replay),
            ("recovery", self.recovery),
            ("crc_flit", self.crc_flit),
            ("crc_data", self.crc_data),
            ("ecc_data", self.ecc_data),
        )

    @property
    def link_errors(self) -> int:
        """Sum of the replay, recovery and CRC-flit counters (0 when none): the three that
        ``nvidia-smi nvlink -e`` reports. ``crc_data`` and ``ecc_data`` are exported but left
        out here: on a healthy 2x H200 node (driver 580.159.04, the committed recording) every
        link read crc_data 1-25 and ecc_data 2-39 while nvidia-smi reported no errors, so a
        non-zero value there is no finding; alert on their rate instead."""
        return sum(v or 0 for k, v in self.items() if k in FINDING_NVLINK_ERRORS)


@dataclass(frozen=True, slots=True)
class NvLink:
    """One NVLink of a GPU. ``state`` is NVML's answer: 0 inactive, 1 active (2 sleep on
    drivers that report link power states)."""

    __reduce__ = _by_fields

    link: int
    state: int
    version: int | None = None
    speed_bytes_per_second: int | None = None
    #: far end's PCI address in sysfs form; ``None`` when down or not offered
    remote_pci_bus_id: str | None = None
    #: ``GPU``, ``NVSwitch``, ``IBMNPU`` or ``unknown``; ``None`` when down or not offered
    remote_device_type: str | None = None
    errors: NvLinkErrorCounts = NvLinkErrorCounts()

    @property
    def up(self) -> bool:
        """Trained (active, or idling in a low-power state)."""
        return self.state != NVLINK_STATE_INACTIVE


@dataclass(frozen=True, slots=True)
class PcieLink:
    current_generation: int | None = None
    max_generation: int | None = None
    current_width: int | None = None
    max_width: int | None = None
    #: PCIe replay counter (link-level retransmissions)
    replays: int | None = None


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Rows remapped because of correctable / uncorrectable memory errors, whether a remap
    waits for a GPU reset, and whether a remap failed (the GPU needs service)."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class ComputeProcess:
    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True, slots=True)
class NvmlGpu:
    """One GPU as NVML numbers it. A lost GPU keeps its identity (PCI address, UUID, name,
    serial, VBIOS) as last read, and otherwise only what its pass read before NVML said so."""

    __reduce__ = _by_fields

    index: int
    lost: bool = False
    #: sysfs form, ``0000:19:00.0``
    pci_bus_id: str | None = None
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    pcie: PcieLink = PcieLink()
    remapped_rows: RemappedRows | None = None
    #: volatile (since driver load) ECC error totals
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    #: nvmlClocksEventReason* bitmask (see :data:`CLOCKS_EVENT_REASONS`)
    clocks_event_reasons: int | None = None
    #: ``None`` when NVML did not answer; kept for pod attribution, exported only as a count
    compute_processes: tuple[ComputeProcess, ...] | None = None
    nvlinks: tuple[NvLink, ...] = ()
    #: payload bytes sent and received through all of the GPU's NVLinks since the driver
    #: loaded (NVML's throughput data fields over every link, KiB converted to bytes)
    nvlink_transmitted_bytes: int | None = None
    nvlink_received_bytes: int | None = None

    def active_clocks_event_reasons(self) -> tuple[tuple[str, bool], ...] | None:
        if self.clocks_event_reasons is None:
            return None
        mask = self.clocks_event_reasons
        return tuple((name, bool(mask & bit)) for name, bit in CLOCKS_EVENT_REASONS)


@dataclass(frozen=True, slots=True, order=True)
class XidCount:
    gpu: int
    xid: int
    count: int


@dataclass(frozen=True, slots=True, order=True)
class XidRegistration:
    """Whether XID events of ``gpu`` are watched; ``error`` names NVML's refusal."""

    gpu: int
    watched: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class NvmlSnapshot:
    driver_version: str | None = None
    nvml_version: str | None = None
    gpus: tuple[NvmlGpu, ...] = ()
    xid_registrations: tuple[XidRegistration, ...] = ()
    #: XID events counted since the watcher started, per (GPU, code); only grow
    xid_errors: tuple[XidCount, ...] = ()
    issues: tuple[ReadIssue, ...] = ()
    #: each GPU's NVLink fabric registration (:mod:`agent.nvml.fabric`), GPUs not lost
    fabric: tuple[GpuFabric, ...] = ()
    #: the MIG mode of every GPU that has one, and the MIG devices of those in MIG mode
    #: (:mod:`agent.nvml.mig`)
    mig_modes: tuple[MigMode, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()
