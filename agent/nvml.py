"""The NVML sampler: per-GPU identity, PCIe link, NVLink (state, speed, far end, error
counters), row remapping, volatile ECC, clock-event reasons, compute processes and XID errors.

The adapter
    Every NVML call the sampler makes goes through :class:`NvmlApi`: one method per call,
    each returning plain Python values (``int``, ``str``, tuples) or raising
    :class:`NvmlCallError` with NVML's return code and its name (``NOT_SUPPORTED``,
    ``GPU_IS_LOST`` ...). :class:`LiveNvml` is the one implementation that imports
    ``pynvml``; :class:`agent.nvml_record.ReplayNvml` answers from a JSON recording of what
    a real node said, and :class:`agent.nvml_record.RecordingNvml` records a live node, so
    tests replay recorded answers instead of mocking calls. NVML needs no CUDA context: the
    agent never creates one and never holds GPU memory.

What is exported and what is not
    Only what the hardware answers. ``NOT_SUPPORTED`` and ``FUNCTION_NOT_FOUND`` (an older
    driver or pynvml lacking the call) leave that value ``None`` *quietly*: no
    :class:`~agent.sysfs.ReadIssue`, because the runner counts every issue as a read error
    and "this GPU has no such counter" is not one. ``GPU_IS_LOST`` marks the GPU lost (a
    ``gpu_lost`` finding and metric); its remaining calls are skipped and the other GPUs are
    still sampled. Any other error costs that one value and records an issue with path
    ``nvml/<gpu>/<call>[/<qualifier>]`` (``nvml/0/nvmlDeviceGetNvLinkErrorCounter/link3/replay``);
    an answer of the wrong shape (:class:`NvmlAnswerError`, a PCI address that does not parse)
    is a ``parse`` issue. PCI addresses are exported in sysfs form (``0000:19:00.0``).

NVLink
    Links are discovered by asking ``nvmlDeviceGetNvLinkState`` for every index below
    ``NVML_NVLINK_MAX_LINKS``; an index answered ``NOT_SUPPORTED`` or ``INVALID_ARGUMENT`` is
    no link. Speed, far end (PCI address and device type) are read for links that are up;
    error counters for every link. Error counters come from ``nvmlDeviceGetNvLinkErrorCounter``
    and, where that is unsupported, from the field values NVML offers for the same counter
    (the per-link ``NVML_FI_DEV_NVLINK_ERROR_DL_*`` fields, then the older per-link
    ``*_ERROR_COUNT_L<n>`` fields for links 0-11).

XID errors
    A background thread, started by the first :meth:`NvmlSampler.sample`, waits on an NVML
    event set registered for ``nvmlEventTypeXidCriticalError`` on every GPU and counts events
    per (GPU, XID code). The counts only grow (unlike dcgm-exporter's last-value gauge,
    dcgm-exporter #500/#190). A GPU that refuses registration is noted in the snapshot, not
    fatal. :meth:`NvmlSampler.close` stops the thread.

Hung calls
    The runner abandons a sampling call that exceeds its timeout. ``sample`` takes no lock,
    and the XID thread holds its lock only to update or copy its counts, never across an
    NVML call, so a hung NVML call can block nothing but the thread it hangs in.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Protocol, TypeVar, cast

from agent.errors import NoData
from agent.findings import Finding
from agent.sysfs import ReadIssue

log = logging.getLogger(__name__)

T = TypeVar("T")

# -- NVML constants (nvml.h), copied so that only LiveNvml imports pynvml ------------------

#: nvmlReturn_t codes and the names fabricscope uses for them (``NVML_ERROR_<name>``).
NVML_ERROR_NAMES: dict[int, str] = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    30: "RESET_TYPE_NOT_SUPPORTED",
    999: "UNKNOWN",
}
ERROR_CODES: dict[str, int] = {name: code for code, name in NVML_ERROR_NAMES.items()}

#: errors meaning "this GPU / driver does not offer that value": absent, quietly
UNSUPPORTED = frozenset({"NOT_SUPPORTED", "FUNCTION_NOT_FOUND"})
#: errors with which nvmlInit says "no NVIDIA driver here": the sampler raises NoData
NO_DRIVER = frozenset({"LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED"})

#: the NVLink error counters that make a finding (what ``nvidia-smi nvlink -e`` shows)
FINDING_NVLINK_ERRORS = frozenset({"replay", "recovery", "crc_flit"})

#: nvmlNvLinkErrorCounter_t, in fabricscope's names (``reason`` label values)
NVLINK_ERROR_COUNTERS: tuple[tuple[str, int], ...] = (
    ("replay", 0),  # NVML_NVLINK_ERROR_DL_REPLAY
    ("recovery", 1),  # NVML_NVLINK_ERROR_DL_RECOVERY
    ("crc_flit", 2),  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    ("crc_data", 3),  # NVML_NVLINK_ERROR_DL_CRC_DATA
    ("ecc_data", 4),  # NVML_NVLINK_ERROR_DL_ECC_DATA
)
#: per-link field values carrying the same counters (scopeId = link)
_FI_SCOPED_ERRORS = {"replay": 161, "recovery": 162, "crc_flit": 163}
#: older per-link fields, ``*_ERROR_COUNT_L0..L11``: the field id for link n (scopeId 0)
_FI_LEGACY_ERRORS: dict[str, tuple[int, ...]] = {
    "crc_flit": (*range(32, 38), *range(96, 102)),
    "crc_data": (*range(39, 45), *range(102, 108)),
    "replay": (*range(46, 52), *range(108, 114)),
    "recovery": (*range(53, 59), *range(114, 120)),
    "ecc_data": tuple(range(148, 160)),
}
FI_NVLINK_GET_SPEED = 164  # NVML_FI_DEV_NVLINK_GET_SPEED, MBps, scopeId = link
_FI_LEGACY_SPEED = (*range(84, 90), *range(132, 138))  # NVML_FI_DEV_NVLINK_SPEED_MBPS_L0..L11
FI_NVLINK_SPEED_COMMON = 90  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
_MEGABYTE = 1_000_000

NVLINK_STATE_INACTIVE = 0  # NVML_FEATURE_DISABLED / NVML_NVLINK_STATE_INACTIVE
#: nvmlIntNvLinkDeviceType_t
NVLINK_DEVICE_TYPES = {0: "GPU", 1: "IBMNPU", 2: "NVSwitch", 0xFF: "unknown"}

#: nvmlClocksEventReason* bits (the older nvmlClocksThrottleReason* share them), by the
#: ``reason`` label value fabricscope gives each
CLOCKS_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

MEMORY_ERROR_CORRECTED = 0  # NVML_MEMORY_ERROR_TYPE_CORRECTED
MEMORY_ERROR_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC = 0  # NVML_VOLATILE_ECC
EVENT_TYPE_XID = 0x8  # nvmlEventTypeXidCriticalError

_PCI_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def error_name(code: int) -> str:
    """NVML's name for a return code (``GPU_IS_LOST``), ``CODE_<n>`` for one it lacks."""
    return NVML_ERROR_NAMES.get(code, f"CODE_{code}")


class NvmlAnswerError(ValueError):
    """An NVML call answered something of the wrong shape (a binding or recording fault)."""

    def __init__(self, call: str, detail: str) -> None:
        super().__init__(f"{call}: {detail}")
        self.call = call


class NvmlCallError(Exception):
    """One NVML call answered an error. ``call`` is the NVML function (``nvmlDeviceGetUUID``),
    ``code`` the nvmlReturn_t value and ``name`` its name (``NOT_SUPPORTED``)."""

    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call}: NVML_ERROR_{name} ({code})")
        self.call = call
        self.code = code
        self.name = name

    @classmethod
    def of(cls, call: str, code: int) -> NvmlCallError:
        return cls(call, code, error_name(code))


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One ``nvmlEventTypeXidCriticalError`` event: the GPU's index (-1 when the event's
    device handle matches no GPU the agent knows) and the XID code."""

    gpu: int
    xid: int


class NvmlApi(Protocol):
    """The NVML calls the sampler makes. ``gpu`` is NVML's device index. Each method returns
    plain values or raises :class:`NvmlCallError`."""

    def init(self) -> None:
        """nvmlInit."""

    def shutdown(self) -> None:
        """nvmlShutdown."""

    def nvlink_max_links(self) -> int:
        """NVML_NVLINK_MAX_LINKS of the NVML binding in use."""

    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion."""

    def nvml_version(self) -> str:
        """nvmlSystemGetNVMLVersion."""

    def device_count(self) -> int:
        """nvmlDeviceGetCount."""

    def pci_bus_id(self, gpu: int) -> str:
        """nvmlDeviceGetPciInfo's busId, as NVML spells it (``00000000:19:00.0``)."""

    def uuid(self, gpu: int) -> str:
        """nvmlDeviceGetUUID."""

    def name(self, gpu: int) -> str:
        """nvmlDeviceGetName."""

    def serial(self, gpu: int) -> str:
        """nvmlDeviceGetSerial."""

    def vbios_version(self, gpu: int) -> str:
        """nvmlDeviceGetVbiosVersion."""

    def pcie_current_link_generation(self, gpu: int) -> int:
        """nvmlDeviceGetCurrPcieLinkGeneration."""

    def pcie_max_link_generation(self, gpu: int) -> int:
        """nvmlDeviceGetMaxPcieLinkGeneration."""

    def pcie_current_link_width(self, gpu: int) -> int:
        """nvmlDeviceGetCurrPcieLinkWidth."""

    def pcie_max_link_width(self, gpu: int) -> int:
        """nvmlDeviceGetMaxPcieLinkWidth."""

    def pcie_replay_counter(self, gpu: int) -> int:
        """nvmlDeviceGetPcieReplayCounter."""

    def remapped_rows(self, gpu: int) -> tuple[int, int, int, int]:
        """nvmlDeviceGetRemappedRows: (correctable, uncorrectable, pending, failure)."""

    def total_ecc_errors(self, gpu: int, error_type: int, counter_type: int) -> int:
        """nvmlDeviceGetTotalEccErrors."""

    def clocks_event_reasons(self, gpu: int) -> int:
        """nvmlDeviceGetCurrentClocksEventReasons (ThrottleReasons on older drivers)."""

    def compute_processes(self, gpu: int) -> tuple[tuple[int, int | None], ...]:
        """nvmlDeviceGetComputeRunningProcesses: (pid, used GPU memory in bytes or None)."""

    def nvlink_state(self, gpu: int, link: int) -> int:
        """nvmlDeviceGetNvLinkState."""

    def nvlink_version(self, gpu: int, link: int) -> int:
        """nvmlDeviceGetNvLinkVersion."""

    def nvlink_remote_pci_bus_id(self, gpu: int, link: int) -> str:
        """nvmlDeviceGetNvLinkRemotePciInfo(_v2)'s busId."""

    def nvlink_remote_device_type(self, gpu: int, link: int) -> int:
        """nvmlDeviceGetNvLinkRemoteDeviceType."""

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> int:
        """nvmlDeviceGetNvLinkErrorCounter."""

    def field_value(self, gpu: int, field_id: int, scope_id: int) -> int:
        """nvmlDeviceGetFieldValues for one field; the field's own return code raises."""

    def xid_open(self) -> None:
        """nvmlEventSetCreate (one event set per API object)."""

    def xid_register(self, gpu: int) -> None:
        """nvmlDeviceRegisterEvents(handle, nvmlEventTypeXidCriticalError, set)."""

    def xid_wait(self, timeout_ms: int) -> XidEvent:
        """nvmlEventSetWait_v2; raises ``TIMEOUT`` when nothing came."""

    def xid_close(self) -> None:
        """nvmlEventSetFree."""


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _int(value: object, call: str) -> int:
    if isinstance(value, int):
        return int(value)
    raise NvmlAnswerError(call, f"answered {type(value).__name__}, expected an integer")


class _PciInfo(Protocol):  # pynvml's nvmlPciInfo_t, the fields used
    busId: bytes  # noqa: N815 - NVML's names
    busIdLegacy: bytes  # noqa: N815


class _Process(Protocol):  # pynvml's friendly object for nvmlProcessInfo_t
    pid: int
    usedGpuMemory: int | None  # noqa: N815


class _FieldValue(Protocol):  # pynvml's c_nvmlFieldValue_t
    valueType: int  # noqa: N815
    nvmlReturn: int  # noqa: N815
    value: object


class _EventData(Protocol):  # pynvml's c_nvmlEventData_t
    device: object
    eventData: int  # noqa: N815


#: c_nvmlValue_t member holding each nvmlValueType_t
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


class LiveNvml:
    """:class:`NvmlApi` over pynvml (nvidia-ml-py), the only code that imports it. Device
    handles are fetched by index once and kept. ``nvml`` replaces the pynvml module (tests).
    Every error, a missing handle's included, is named after the call it stands for."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlCallError("import pynvml", 12, "LIBRARY_NOT_FOUND") from exc
            nvml = pynvml
        self._nv = nvml
        # pynvml raises this for an unversioned function the driver lacks
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._mismatch: tuple[type[Exception], ...] = (mismatch,) if mismatch else ()
        self._handles: dict[int, object] = {}
        self._event_set: object | None = None

    def _call(self, call: str, *args: object, name: str | None = None) -> object:
        """``pynvml.<name or call>(*args)``; pynvml's errors become NvmlCallError(call)."""
        fn = getattr(self._nv, name or call, None)
        if fn is None:
            raise NvmlCallError(call, 13, "FUNCTION_NOT_FOUND")
        try:
            result: object = fn(*args)
        except self._nv.NVMLError as exc:
            raise NvmlCallError.of(call, int(exc.value)) from exc
        except self._mismatch as exc:
            raise NvmlCallError(call, 13, "FUNCTION_NOT_FOUND") from exc
        return result

    def _dev(self, call: str, gpu: int, *args: object, name: str | None = None) -> object:
        """``call(handle(gpu), *args)``."""
        handle = self._handles.get(gpu)
        if handle is None:
            handle = self._call(call, gpu, name="nvmlDeviceGetHandleByIndex")
            self._handles[gpu] = handle
        return self._call(call, handle, *args, name=name)

    def _dint(self, call: str, gpu: int, *args: object, name: str | None = None) -> int:
        return _int(self._dev(call, gpu, *args, name=name), call)

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._handles.clear()
        self._call("nvmlShutdown")

    def nvlink_max_links(self) -> int:
        return _int(getattr(self._nv, "NVML_NVLINK_MAX_LINKS", 18), "NVML_NVLINK_MAX_LINKS")

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def nvml_version(self) -> str:
        return _text(self._call("nvmlSystemGetNVMLVersion"))

    def device_count(self) -> int:
        return _int(self._call("nvmlDeviceGetCount"), "nvmlDeviceGetCount")

    def pci_bus_id(self, gpu: int) -> str:
        info = cast(_PciInfo, self._dev("nvmlDeviceGetPciInfo", gpu))
        return _text(info.busId) or _text(info.busIdLegacy)

    def uuid(self, gpu: int) -> str:
        return _text(self._dev("nvmlDeviceGetUUID", gpu))

    def name(self, gpu: int) -> str:
        return _text(self._dev("nvmlDeviceGetName", gpu))

    def serial(self, gpu: int) -> str:
        return _text(self._dev("nvmlDeviceGetSerial", gpu))

    def vbios_version(self, gpu: int) -> str:
        return _text(self._dev("nvmlDeviceGetVbiosVersion", gpu))

    def pcie_current_link_generation(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetCurrPcieLinkGeneration", gpu)

    def pcie_max_link_generation(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetMaxPcieLinkGeneration", gpu)

    def pcie_current_link_width(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetCurrPcieLinkWidth", gpu)

    def pcie_max_link_width(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetMaxPcieLinkWidth", gpu)

    def pcie_replay_counter(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetPcieReplayCounter", gpu)

    def remapped_rows(self, gpu: int) -> tuple[int, int, int, int]:
        raw = cast(Sequence[object], self._dev("nvmlDeviceGetRemappedRows", gpu))
        corr, unc, pending, failure = (_int(v, "nvmlDeviceGetRemappedRows") for v in raw)
        return corr, unc, pending, failure

    def total_ecc_errors(self, gpu: int, error_type: int, counter_type: int) -> int:
        return self._dint("nvmlDeviceGetTotalEccErrors", gpu, error_type, counter_type)

    def clocks_event_reasons(self, gpu: int) -> int:
        call = "nvmlDeviceGetCurrentClocksEventReasons"
        try:
            return self._dint(call, gpu)
        except NvmlCallError as exc:
            if exc.name != "FUNCTION_NOT_FOUND":
                raise
        # drivers and pynvml before r535 know only the older name of the same bitmask
        return self._dint(call, gpu, name="nvmlDeviceGetCurrentClocksThrottleReasons")

    def compute_processes(self, gpu: int) -> tuple[tuple[int, int | None], ...]:
        call = "nvmlDeviceGetComputeRunningProcesses"
        try:
            raw = self._dev(call, gpu)
        except NvmlCallError as exc:
            if exc.name != "FUNCTION_NOT_FOUND":
                raise
            raw = self._dev(call, gpu, name=call + "_v2")  # drivers before the _v3 struct
        procs = cast(Sequence[_Process], raw)
        return tuple(
            (_int(p.pid, call), None if p.usedGpuMemory is None else _int(p.usedGpuMemory, call))
            for p in procs
        )

    def nvlink_state(self, gpu: int, link: int) -> int:
        return self._dint("nvmlDeviceGetNvLinkState", gpu, link)

    def nvlink_version(self, gpu: int, link: int) -> int:
        return self._dint("nvmlDeviceGetNvLinkVersion", gpu, link)

    def nvlink_remote_pci_bus_id(self, gpu: int, link: int) -> str:
        call = "nvmlDeviceGetNvLinkRemotePciInfo"
        # the _v2 binding where pynvml has one; recent pynvml calls the _v2 C function under
        # the plain name
        name = call + "_v2" if hasattr(self._nv, call + "_v2") else call
        info = cast(_PciInfo, self._dev(call, gpu, link, name=name))
        return _text(info.busId) or _text(info.busIdLegacy)

    def nvlink_remote_device_type(self, gpu: int, link: int) -> int:
        return self._dint("nvmlDeviceGetNvLinkRemoteDeviceType", gpu, link)

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> int:
        return self._dint("nvmlDeviceGetNvLinkErrorCounter", gpu, link, counter)

    def field_value(self, gpu: int, field_id: int, scope_id: int) -> int:
        call = "nvmlDeviceGetFieldValues"
        values = cast(Sequence[_FieldValue], self._dev(call, gpu, [(field_id, scope_id)]))
        v = values[0]
        if int(v.nvmlReturn) != 0:
            raise NvmlCallError.of(call, int(v.nvmlReturn))
        raw: object = getattr(v.value, _VALUE_MEMBERS.get(int(v.valueType), "ullVal"))
        return round(raw) if isinstance(raw, float) else _int(raw, call)

    def xid_open(self) -> None:
        self._event_set = self._call("nvmlEventSetCreate")

    def xid_register(self, gpu: int) -> None:
        self._dev("nvmlDeviceRegisterEvents", gpu, EVENT_TYPE_XID, self._event_set)

    def xid_wait(self, timeout_ms: int) -> XidEvent:
        data = cast(_EventData, self._call("nvmlEventSetWait_v2", self._event_set, timeout_ms))
        return XidEvent(self._index_of(data.device), _int(data.eventData, "nvmlEventSetWait_v2"))

    def _index_of(self, handle: object) -> int:
        try:
            return _int(self._call("nvmlDeviceGetIndex", handle), "nvmlDeviceGetIndex")
        except (NvmlCallError, NvmlAnswerError):
            pass  # match the handle against the ones fetched by index
        want = _address(handle)
        for index, known in list(self._handles.items()):
            if _address(known) == want:
                return index
        return -1

    def xid_close(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._call("nvmlEventSetFree", event_set)


def _address(handle: object) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


# -- samples -----------------------------------------------------------------------------


def normalize_pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:19:00.0`` -> sysfs's ``0000:19:00.0`` (lower case, the domain in at
    least four hex digits, as Linux names PCI devices)."""
    m = _PCI_BUS_ID.match(nvml_bus_id.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {nvml_bus_id.strip()[:40]!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


@dataclass(frozen=True, slots=True)
class NvLinkErrorCounts:
    """Per-link NVLink error counters since the driver loaded (or the last reset);
    ``None`` = the GPU does not offer it."""

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
        link read crc_data 2-3 and ecc_data 4 while nvidia-smi reported no errors, so a
        non-zero value there is no finding; alert on their rate instead."""
        return sum(v or 0 for k, v in self.items() if k in FINDING_NVLINK_ERRORS)


@dataclass(frozen=True, slots=True)
class NvLink:
    """One NVLink of a GPU. ``state`` is NVML's answer: 0 inactive, 1 active (2 sleep on
    drivers that report link power states)."""

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
    """One GPU as NVML numbers it. A lost GPU keeps only what was read before NVML said so."""

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


# -- the sampler --------------------------------------------------------------------------


class _GpuLost(Exception):  # noqa: N818 - control flow, never escapes the sampler
    pass


def _issue_reason(name: str) -> str:
    if name == "NO_PERMISSION":
        return "permission"
    if name in ("NOT_FOUND", "GPU_NOT_FOUND"):
        return "vanished"
    return "io"


class _Pass:
    """Error policy of one sampling pass (see the module docstring)."""

    def __init__(self) -> None:
        self.issues: list[ReadIssue] = []

    def get(
        self, where: str, thunk: Callable[[], T], *, quiet: frozenset[str] = UNSUPPORTED
    ) -> T | None:
        """``thunk()``, or ``None``; ``where`` is ``<gpu>`` or ``<gpu>/<qualifier>`` or ``""``."""
        try:
            return thunk()
        except NvmlCallError as exc:
            if exc.name in quiet:
                return None
            gpu, _, qualifier = where.partition("/")
            if exc.name == "GPU_IS_LOST" and gpu:
                raise _GpuLost(str(exc)) from exc
            path = "/".join(p for p in ("nvml", gpu, exc.call, qualifier) if p)
            self.issues.append(ReadIssue(path, _issue_reason(exc.name), str(exc)))
            return None
        except NvmlAnswerError as exc:  # an answer of the wrong shape
            gpu, _, qualifier = where.partition("/")
            path = "/".join(p for p in ("nvml", gpu, exc.call, qualifier) if p)
            self.issues.append(ReadIssue(path, "parse", str(exc)))
            return None
        except ValueError as exc:  # an answer fabricscope cannot parse (a mangled PCI address)
            self.issues.append(ReadIssue(f"nvml/{where}", "parse", str(exc)))
            return None


@dataclass(slots=True)
class _GpuBuilder:
    index: int
    pci_bus_id: str | None = None
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    pcie: PcieLink = PcieLink()
    remapped_rows: RemappedRows | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    clocks_event_reasons: int | None = None
    compute_processes: tuple[ComputeProcess, ...] | None = None
    nvlinks: list[NvLink] = field(default_factory=list)

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
        )


class _XidWatcher:
    """Counts XID events in a background thread. Its lock guards the counts only."""

    def __init__(self, api: NvmlApi, wait_ms: int) -> None:
        self._api = api
        self._wait_ms = wait_ms
        self._cond = threading.Condition()
        self._counts: dict[tuple[int, int], int] = {}
        self._seen = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = False
        self.registrations: tuple[XidRegistration, ...] = ()

    def start(self, gpus: Sequence[int]) -> None:
        """Create the event set and register every GPU; start waiting if any accepted."""
        try:
            self._api.xid_open()
        except NvmlCallError as exc:
            log.warning("XID events not watched: %s", exc)
            self.registrations = tuple(XidRegistration(g, False, exc.name) for g in gpus)
            return
        self._opened = True
        regs = []
        for gpu in gpus:
            try:
                self._api.xid_register(gpu)
            except NvmlCallError as exc:
                log.warning("XID events of GPU %d not watched: %s", gpu, exc)
                regs.append(XidRegistration(gpu, False, exc.name))
            else:
                regs.append(XidRegistration(gpu, True))
        self.registrations = tuple(regs)
        if any(r.watched for r in regs):
            self._thread = threading.Thread(target=self._run, name="nvml-xid", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                event = self._api.xid_wait(self._wait_ms)
            except NvmlCallError as exc:
                if exc.name == "TIMEOUT":
                    continue
                if not failing:
                    log.error("waiting for XID events failed: %s; retrying every second", exc)
                failing = True
                self._stop.wait(1.0)
                continue
            if failing:
                log.info("waiting for XID events works again")
                failing = False
            log.warning("GPU %d: XID %d", event.gpu, event.xid)
            with self._cond:
                key = (event.gpu, event.xid)
                self._counts[key] = self._counts.get(key, 0) + 1
                self._seen += 1
                self._cond.notify_all()

    def counts(self) -> tuple[XidCount, ...]:
        with self._cond:
            return tuple(XidCount(g, x, n) for (g, x), n in sorted(self._counts.items()))

    def wait_for(self, events: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._seen >= events, timeout)

    def stop(self, timeout: float) -> bool:
        """Stop waiting; free the event set once the thread has left NVML. False if it
        is still inside a (hung) call."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        if not self._opened:
            return True
        try:
            self._api.xid_close()
        except NvmlCallError as exc:
            log.debug("freeing the XID event set: %s", exc)
        return True


class NvmlSampler:
    """Samples every GPU NVML sees. ``api_factory`` builds the :class:`NvmlApi` (default:
    :class:`LiveNvml`); it is called, and ``nvmlInit`` run, once, on the first pass that
    finds a driver. ``watch_xid`` starts the XID thread on the first successful pass."""

    name = "nvml"

    def __init__(
        self,
        api_factory: Callable[[], NvmlApi] | None = None,
        *,
        watch_xid: bool = True,
        xid_wait_ms: int = 1000,
    ) -> None:
        self._factory: Callable[[], NvmlApi] = api_factory or LiveNvml
        self._api: NvmlApi | None = None
        self._watch_xid = watch_xid
        self._xid_wait_ms = xid_wait_ms
        self._xid: _XidWatcher | None = None

    def _ensure_api(self) -> NvmlApi:
        if self._api is not None:
            return self._api
        try:
            api = self._factory()
            api.init()
        except NvmlCallError as exc:
            if exc.name in NO_DRIVER:
                raise NoData(f"no NVIDIA driver: {exc}") from exc
            raise
        self._api = api
        return api

    def sample(self) -> NvmlSnapshot:
        api = self._ensure_api()
        p = _Pass()
        driver = p.get("", api.driver_version)
        nvml_version = p.get("", api.nvml_version)
        count = api.device_count()
        if count == 0:
            raise NoData("NVML sees no GPU")
        max_links = api.nvlink_max_links()
        gpus = tuple(self._sample_gpu(api, p, gpu, max_links) for gpu in range(count))
        if self._watch_xid and self._xid is None:
            self._xid = _XidWatcher(api, self._xid_wait_ms)
            self._xid.start(range(count))
        return NvmlSnapshot(
            driver_version=driver,
            nvml_version=nvml_version,
            gpus=gpus,
            xid_registrations=self._xid.registrations if self._xid else (),
            xid_errors=self._xid.counts() if self._xid else (),
            issues=tuple(p.issues),
        )

    def wait_for_xid_events(self, events: int, timeout: float) -> bool:
        """Block until the XID thread has counted ``events`` events in all (tests, tools)."""
        return self._xid is not None and self._xid.wait_for(events, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the XID thread and shut NVML down (skipped while a call hangs in it)."""
        xid, self._xid = self._xid, None
        if xid is not None and not xid.stop(timeout):
            log.warning("XID thread still inside NVML after %.1fs; leaving NVML up", timeout)
            return
        api, self._api = self._api, None
        if api is not None:
            try:
                api.shutdown()
            except NvmlCallError as exc:
                log.debug("nvmlShutdown: %s", exc)

    def _sample_gpu(self, api: NvmlApi, p: _Pass, gpu: int, max_links: int) -> NvmlGpu:
        b = _GpuBuilder(gpu)
        g = str(gpu)
        try:
            bus_id = p.get(g, lambda: api.pci_bus_id(gpu))
            if bus_id is not None:
                b.pci_bus_id = p.get(f"{g}/pci_bus_id", lambda: normalize_pci_bus_id(bus_id))
            b.uuid = p.get(g, lambda: api.uuid(gpu))
            b.name = p.get(g, lambda: api.name(gpu))
            b.serial = p.get(g, lambda: api.serial(gpu))
            b.vbios_version = p.get(g, lambda: api.vbios_version(gpu))
            b.pcie = PcieLink(
                current_generation=p.get(g, lambda: api.pcie_current_link_generation(gpu)),
                max_generation=p.get(g, lambda: api.pcie_max_link_generation(gpu)),
                current_width=p.get(g, lambda: api.pcie_current_link_width(gpu)),
                max_width=p.get(g, lambda: api.pcie_max_link_width(gpu)),
                replays=p.get(g, lambda: api.pcie_replay_counter(gpu)),
            )
            rows = p.get(g, lambda: api.remapped_rows(gpu))
            if rows is not None:
                b.remapped_rows = RemappedRows(rows[0], rows[1], bool(rows[2]), bool(rows[3]))
            b.ecc_corrected_volatile = p.get(
                f"{g}/corrected",
                lambda: api.total_ecc_errors(gpu, MEMORY_ERROR_CORRECTED, VOLATILE_ECC),
            )
            b.ecc_uncorrected_volatile = p.get(
                f"{g}/uncorrected",
                lambda: api.total_ecc_errors(gpu, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),
            )
            b.clocks_event_reasons = p.get(g, lambda: api.clocks_event_reasons(gpu))
            procs = p.get(g, lambda: api.compute_processes(gpu))
            if procs is not None:
                b.compute_processes = tuple(ComputeProcess(pid, mem) for pid, mem in procs)
            common_speed: list[int | None] = []  # fetched once per GPU, when first needed
            for link in range(max_links):
                nvlink = self._sample_link(api, p, gpu, link, common_speed)
                if nvlink is not None:
                    b.nvlinks.append(nvlink)
        except _GpuLost:
            return b.freeze(lost=True)
        return b.freeze(lost=False)

    def _sample_link(
        self, api: NvmlApi, p: _Pass, gpu: int, link: int, common_speed: list[int | None]
    ) -> NvLink | None:
        where = f"{gpu}/link{link}"
        state = p.get(
            where,
            lambda: api.nvlink_state(gpu, link),
            quiet=UNSUPPORTED | {"INVALID_ARGUMENT"},
        )
        if state is None:
            return None
        version = p.get(where, lambda: api.nvlink_version(gpu, link))
        speed = remote_bus = remote_type = None
        if state != NVLINK_STATE_INACTIVE:
            speed = self._link_speed(api, p, gpu, link, common_speed)
            raw_bus = p.get(where, lambda: api.nvlink_remote_pci_bus_id(gpu, link))
            if raw_bus is not None:
                remote_bus = p.get(f"{where}/remote", lambda: normalize_pci_bus_id(raw_bus))
            kind = p.get(where, lambda: api.nvlink_remote_device_type(gpu, link))
            if kind is not None:
                remote_type = NVLINK_DEVICE_TYPES.get(kind, "unknown")
        counts = {
            name: self._link_error(api, p, (gpu, link), name, counter)
            for name, counter in NVLINK_ERROR_COUNTERS
        }
        return NvLink(
            link=link,
            state=state,
            version=version,
            speed_bytes_per_second=speed,
            remote_pci_bus_id=remote_bus,
            remote_device_type=remote_type,
            errors=NvLinkErrorCounts(**counts),
        )

    @staticmethod
    def _link_error(
        api: NvmlApi, p: _Pass, at: tuple[int, int], name: str, counter: int
    ) -> int | None:
        gpu, link = at
        where = f"{gpu}/link{link}/{name}"
        value = p.get(where, lambda: api.nvlink_error_counter(gpu, link, counter))
        if value is not None:
            return value
        fields: list[tuple[int, int]] = []
        if name in _FI_SCOPED_ERRORS:
            fields.append((_FI_SCOPED_ERRORS[name], link))
        legacy = _FI_LEGACY_ERRORS[name]
        if link < len(legacy):
            fields.append((legacy[link], 0))
        for field_id, scope in fields:
            value = p.get(where, functools.partial(api.field_value, gpu, field_id, scope))
            if value is not None:
                return value
        return None

    @staticmethod
    def _link_speed(
        api: NvmlApi, p: _Pass, gpu: int, link: int, common: list[int | None]
    ) -> int | None:
        """Bytes/second: the per-link speed field, else the older per-link field, else the
        speed NVML gives for all links. NVML reports MBps (10^6 bytes/s)."""
        where = f"{gpu}/link{link}/speed"
        mbps = p.get(where, lambda: api.field_value(gpu, FI_NVLINK_GET_SPEED, link))
        if mbps is None and link < len(_FI_LEGACY_SPEED):
            mbps = p.get(where, lambda: api.field_value(gpu, _FI_LEGACY_SPEED[link], 0))
        if mbps is None:
            if not common:
                common.append(
                    p.get(f"{gpu}/speed", lambda: api.field_value(gpu, FI_NVLINK_SPEED_COMMON, 0))
                )
            mbps = common[0]
        if mbps is None or mbps <= 0:
            return None
        return mbps * _MEGABYTE


# -- findings -----------------------------------------------------------------------------


def findings(snap: NvmlSnapshot) -> list[Finding]:
    """What an SRE should act on, sorted.

    * ``nvlink_down`` (``gpu0/link3``): a link NVML lists as inactive, on a node that uses
      NVLink (some link of some GPU is up). A node where no link is up at all (PCIe cards
      without bridges) reports none: nothing says it should have NVLink.
    * ``nvlink_errors`` (``gpu0/link3``): a replay, recovery or CRC-flit counter above 0
      (see :attr:`NvLinkErrorCounts.link_errors` for why not crc_data / ecc_data).
    * ``gpu_lost`` (``gpu1``): NVML answered GPU_IS_LOST.
    * ``pcie_link_degraded`` (``gpu0``): current PCIe width below the maximum. Not the
      generation: GPUs drop it at idle by design.
    * ``row_remap_failure`` (``gpu0``): a row remap failed; the GPU needs service.
    * ``xid`` (``gpu0/xid79``): XID events counted since the agent started.
    """
    out: list[Finding] = []
    node_uses_nvlink = any(link.up for gpu in snap.gpus for link in gpu.nvlinks)
    for gpu in snap.gpus:
        name = f"gpu{gpu.index}"
        where = f"GPU {gpu.index}" + (f" ({gpu.pci_bus_id})" if gpu.pci_bus_id else "")
        if gpu.lost:
            out.append(
                Finding(
                    "gpu_lost",
                    name,
                    f"{where}: NVML answers GPU_IS_LOST (fallen off the bus or inaccessible); "
                    "drain the node and reset or replace the GPU.",
                )
            )
        for link in gpu.nvlinks:
            if node_uses_nvlink and not link.up:
                out.append(
                    Finding(
                        "nvlink_down",
                        f"{name}/link{link.link}",
                        f"{where}: NVLink {link.link} is inactive while other links of this "
                        "node are up; NCCL traffic over it falls back or stalls.",
                    )
                )
            if link.errors.link_errors > 0:
                counts = ", ".join(
                    f"{k}={v}" for k, v in link.errors.items() if k in FINDING_NVLINK_ERRORS and v
                )
                out.append(
                    Finding(
                        "nvlink_errors",
                        f"{name}/link{link.link}",
                        f"{where}: NVLink {link.link} error counters are not zero ({counts}).",
                    )
                )
        pcie = gpu.pcie
        if (
            pcie.current_width is not None
            and pcie.max_width is not None
            and pcie.current_width < pcie.max_width
        ):
            out.append(
                Finding(
                    "pcie_link_degraded",
                    name,
                    f"{where}: PCIe link runs x{pcie.current_width} of x{pcie.max_width}.",
                )
            )
        if gpu.remapped_rows is not None and gpu.remapped_rows.failure:
            out.append(
                Finding(
                    "row_remap_failure",
                    name,
                    f"{where}: a memory row remap failed; the GPU needs service.",
                )
            )
    for xid in snap.xid_errors:
        if xid.count > 0:
            out.append(
                Finding(
                    "xid",
                    f"gpu{xid.gpu}/xid{xid.xid}",
                    f"GPU {xid.gpu} reported XID {xid.xid} {xid.count} time(s) since the "
                    "agent started.",
                )
            )
    return sorted(out)
