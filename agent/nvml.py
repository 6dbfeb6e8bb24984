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
    ``gpu_lost`` finding and metric); its remaining calls are skipped, it keeps its identity
    as last read (so ``gpu_info`` still names the lost GPU), and the other GPUs are still
    sampled. Any other error costs that one value and records an issue with path
    ``nvml/<gpu>/<call>[/<qualifier>]`` (``nvml/0/nvmlDeviceGetNvLinkErrorCounter/link3/replay``);
    an answer of the wrong shape (:class:`NvmlAnswerError`, a PCI address that does not parse)
    is a ``parse`` issue. PCI addresses are exported in sysfs form (``0000:19:00.0``).

NVLink
    Links are discovered by asking ``nvmlDeviceGetNvLinkState`` for every index below
    ``NVML_NVLINK_MAX_LINKS``; an index answered ``NOT_SUPPORTED`` or ``INVALID_ARGUMENT`` is
    no link. Speed, far end (PCI address and device type) are read for links that are up;
    error counters for every link. Replay, recovery and CRC-flit come from the per-link
    ``NVML_FI_DEV_NVLINK_ERROR_DL_*`` fields (161-163, scopeId = link) batched into one
    ``nvmlDeviceGetFieldValues`` per GPU, else ``nvmlDeviceGetNvLinkErrorCounter``, else the
    older per-link ``*_ERROR_COUNT_L<n>`` fields (links 0-11); crc_data and ecc_data from
    ``nvmlDeviceGetNvLinkErrorCounter``, else the older fields. Which links exist and what
    does not change is cached, and the error counters are read in rotation:
    :class:`NvmlSampler` says what a pass reads and why.

XID errors
    A background thread, started by the first :meth:`NvmlSampler.sample`, waits on an NVML
    event set registered for ``nvmlEventTypeXidCriticalError`` on every GPU and counts events
    per (GPU, XID code). The counts only grow (unlike dcgm-exporter's last-value gauge,
    dcgm-exporter #500/#190). A GPU that refuses registration is noted in the snapshot, not
    fatal. :meth:`NvmlSampler.close` stops the thread.

Hung calls
    The runner abandons a sampling call that exceeds its timeout. ``sample`` holds its lock
    only to take a pass number and to hand its caches over, and the XID thread holds its lock
    only to update or copy its counts, never across an NVML call, so a hung NVML call can
    block nothing but the thread it hangs in.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import NoReturn, Protocol, TypeAlias, TypeVar, cast

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
FI_ECC_SBE_VOL_TOTAL = 3  # NVML_FI_DEV_ECC_SBE_VOL_TOTAL: volatile corrected ECC errors
FI_ECC_DBE_VOL_TOTAL = 4  # NVML_FI_DEV_ECC_DBE_VOL_TOTAL: volatile uncorrected ECC errors
FI_PCIE_REPLAY_COUNTER = 94  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
#: NVML_FI_DEV_REMAPPED_COR, _UNC, _PENDING, _FAILURE: nvmlDeviceGetRemappedRows' four values
FI_REMAPPED_ROWS = (142, 143, 144, 145)
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

    def field_values(
        self, gpu: int, fields: Sequence[tuple[int, int]]
    ) -> tuple[int | NvmlCallError, ...]:
        """One nvmlDeviceGetFieldValues call for every ``(field id, scope id)`` in ``fields``:
        per field, in order, its value or its own return code as an :class:`NvmlCallError`
        (one field NOT_SUPPORTED does not cost the others). An error of the whole call
        (GPU_IS_LOST, FUNCTION_NOT_FOUND ...) raises."""

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


def _field_answer(call: str, v: _FieldValue) -> int | NvmlCallError:
    """One c_nvmlFieldValue_t: its value, or its own return code as an error."""
    code = int(v.nvmlReturn)
    if code != 0:
        return NvmlCallError.of(call, code)
    raw: object = getattr(v.value, _VALUE_MEMBERS.get(int(v.valueType), "ullVal"))
    return round(raw) if isinstance(raw, float) else _int(raw, call)


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
        answer = self.field_values(gpu, ((field_id, scope_id),))[0]
        if isinstance(answer, NvmlCallError):
            raise answer
        return answer

    def field_values(
        self, gpu: int, fields: Sequence[tuple[int, int]]
    ) -> tuple[int | NvmlCallError, ...]:
        call = "nvmlDeviceGetFieldValues"
        if not fields:
            return ()
        values = cast(Sequence[_FieldValue], self._dev(call, gpu, [(f, s) for f, s in fields]))
        if len(values) != len(fields):
            raise NvmlAnswerError(call, f"{len(values)} answers to {len(fields)} fields")
        return tuple(_field_answer(call, v) for v in values)

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
        link read crc_data 1-25 and ecc_data 2-39 while nvidia-smi reported no errors, so a
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
    """One GPU as NVML numbers it. A lost GPU keeps its identity (PCI address, UUID, name,
    serial, VBIOS) as last read, and otherwise only what its pass read before NVML said so."""

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


def _raise(exc: Exception) -> NoReturn:
    raise exc


def _path(where: str, call: str) -> str:
    """``nvml/<gpu>/<call>/<qualifier>`` from ``<gpu>/<qualifier>``."""
    gpu, _, qualifier = where.partition("/")
    return "/".join(p for p in ("nvml", gpu, call, qualifier) if p)


class _Miss(enum.Enum):
    """Why a read gave no value: NVML does not offer it here, or it failed (an issue)."""

    UNSUPPORTED = "unsupported"
    FAILED = "failed"


#: answers to "is there a link n" meaning "no such link" (links 18-35 of an 18-link GPU
#: answer INVALID_ARGUMENT)
NO_LINK = UNSUPPORTED | {"INVALID_ARGUMENT"}

#: one entry of a batched nvmlDeviceGetFieldValues as the sampler sees it (a failed whole call
#: or an answer of the wrong shape stands for every entry)
FieldAnswer: TypeAlias = int | NvmlCallError | NvmlAnswerError


class _Pass:
    """Error policy of one sampling pass (see the module docstring)."""

    def __init__(self) -> None:
        self.issues: list[ReadIssue] = []

    def attempt(
        self, where: str, thunk: Callable[[], T], *, quiet: frozenset[str] = UNSUPPORTED
    ) -> T | _Miss:
        """``thunk()``, or why not; ``where`` is ``<gpu>`` or ``<gpu>/<qualifier>`` or ``""``.
        An error in ``quiet`` is :attr:`_Miss.UNSUPPORTED`, any other an issue and
        :attr:`_Miss.FAILED`; GPU_IS_LOST raises :class:`_GpuLost`."""
        try:
            return thunk()
        except NvmlCallError as exc:
            if exc.name in quiet:
                return _Miss.UNSUPPORTED
            if exc.name == "GPU_IS_LOST" and where.partition("/")[0]:
                raise _GpuLost(str(exc)) from exc
            self.issues.append(ReadIssue(_path(where, exc.call), _issue_reason(exc.name), str(exc)))
        except NvmlAnswerError as exc:  # an answer of the wrong shape
            self.issues.append(ReadIssue(_path(where, exc.call), "parse", str(exc)))
        except ValueError as exc:  # an answer fabricscope cannot parse (a mangled PCI address)
            self.issues.append(ReadIssue(f"nvml/{where}", "parse", str(exc)))
        return _Miss.FAILED

    def get(
        self, where: str, thunk: Callable[[], T], *, quiet: frozenset[str] = UNSUPPORTED
    ) -> T | None:
        """``thunk()``, or ``None`` (see :meth:`attempt`)."""
        value = self.attempt(where, thunk, quiet=quiet)
        return None if isinstance(value, _Miss) else value

    def answer(self, where: str, answer: FieldAnswer) -> int | _Miss:
        """One entry of a batched field-values call, under the policy of a call of its own."""
        if isinstance(answer, int):
            return answer
        return self.attempt(where, functools.partial(_raise, answer))


class _Batch:
    """The field values one GPU's pass needs, gathered so that NVML is called once."""

    def __init__(self) -> None:
        self.fields: list[tuple[int, int]] = []
        self._index: dict[tuple[int, str], int] = {}
        self._answers: tuple[FieldAnswer, ...] = ()

    def ask(self, key: tuple[int, str], field_id: int, scope_id: int) -> None:
        self._index[key] = len(self.fields)
        self.fields.append((field_id, scope_id))

    def __contains__(self, key: tuple[int, str]) -> bool:
        return key in self._index

    def run(self, api: NvmlApi, gpu: int) -> None:
        if not self.fields:
            return
        n = len(self.fields)
        try:
            answers: tuple[FieldAnswer, ...] = api.field_values(gpu, self.fields)
        except (NvmlCallError, NvmlAnswerError) as exc:  # the whole call: every entry
            answers = (exc,) * n
        if len(answers) != n:
            error = NvmlAnswerError(
                "nvmlDeviceGetFieldValues", f"{len(answers)} answers to {n} fields"
            )
            answers = (error,) * n
        self._answers = answers

    def __getitem__(self, key: tuple[int, str]) -> FieldAnswer:
        return self._answers[self._index[key]]


class _Via(enum.Enum):
    """The NVML path that answers a value on one GPU, learned on the first read after each
    static refresh: a path that answered NOT_SUPPORTED is not asked again until the next."""

    FIELD = "field"  # an entry of the GPU's one batched nvmlDeviceGetFieldValues per pass
    CALL = "call"  # the value's own NVML call
    LEGACY = "legacy"  # an older per-link field id (links 0-11), one call each
    NOTHING = "nothing"  # no path answers: absent, not asked again


_COUNTER_PATHS = (_Via.FIELD, _Via.CALL, _Via.LEGACY)
_GPU_PATHS = (_Via.FIELD, _Via.CALL)
#: the counters ``nvidia-smi nvlink -e`` shows (findings), read every ``link_error_rotation``
#: passes through fields 161-163; the others, every ``slow_error_rotation`` passes, per call
_FAST_ERRORS = ("replay", "recovery", "crc_flit")
_SLOW_ERRORS = ("crc_data", "ecc_data")
_ERROR_COUNTER_IDS = dict(NVLINK_ERROR_COUNTERS)
#: GPU-level counters read each pass, by the fields that carry them in the batch
_GPU_FIELDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("pcie_replays", (FI_PCIE_REPLAY_COUNTER,)),
    ("remapped_rows", FI_REMAPPED_ROWS),
    ("ecc_corrected", (FI_ECC_SBE_VOL_TOTAL,)),
    ("ecc_uncorrected", (FI_ECC_DBE_VOL_TOTAL,)),
)
_GPU_FIELD_IDS = dict(_GPU_FIELDS)
_GPU_LEVEL = -1  # the "link" of a GPU-level value in the per-GPU caches


@dataclass(frozen=True, slots=True)
class _Identity:
    """What identifies a GPU and cannot change while the driver is loaded."""

    pci_bus_id: str | None = None
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    max_generation: int | None = None
    max_width: int | None = None


@dataclass(frozen=True, slots=True)
class _LinkStatic:
    """What a link says that changes only with its state. ``complete``: read without an
    issue (otherwise read again on the next pass)."""

    state: int
    version: int | None
    speed_bytes_per_second: int | None
    remote_pci_bus_id: str | None
    remote_device_type: str | None
    complete: bool


@dataclass(slots=True)
class _GpuCache:
    """What one GPU's passes carry to the next: static facts, the path that answers each
    value (:class:`_Via`), and the last value of each NVLink error counter by
    ``(link, counter)`` (a key absent: not read yet, or its last read failed). A pass works
    on a copy and the sampler keeps the newest pass's copies."""

    identity: _Identity
    #: identity read without an issue; else read again next pass
    static_complete: bool
    #: the pass on which the static facts are read again
    refresh_at: int
    #: link indices that exist (a probe that did not answer "no such link")
    links: tuple[int, ...]
    link_static: dict[int, _LinkStatic] = field(default_factory=dict)
    via: dict[tuple[int, str], _Via] = field(default_factory=dict)
    counts: dict[tuple[int, str], int | None] = field(default_factory=dict)
    #: NVML answered GPU_IS_LOST: read everything again
    stale: bool = False

    def copy(self) -> _GpuCache:
        return _GpuCache(
            self.identity,
            self.static_complete,
            self.refresh_at,
            self.links,
            dict(self.link_static),
            dict(self.via),
            dict(self.counts),
            self.stale,
        )


@dataclass(frozen=True, slots=True)
class _NodeStatic:
    driver_version: str | None
    nvml_version: str | None
    max_links: int
    complete: bool


@dataclass(frozen=True, slots=True)
class _State:
    """What the newest finished pass leaves for the next."""

    node: _NodeStatic | None = None
    gpus: Mapping[int, _GpuCache] = field(default_factory=dict)
    #: the pass that left it (-1: none yet)
    pass_index: int = -1


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

    def identify(self, ident: _Identity) -> None:
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
    finds a driver. ``watch_xid`` starts the XID thread on the first successful pass.

    What a pass costs, and why it does not read everything
        NVML's per-link reads are expensive in CPU (measured on a 2x H200 node, driver
        580.159.04, ``bench/nvml_fieldvalues.py``): ``nvmlDeviceGetNvLinkErrorCounter`` 0.46 ms
        per counter, a link-scoped entry of ``nvmlDeviceGetFieldValues`` 0.13 ms, against
        1.5 us for ``nvmlDeviceGetNvLinkState``. Reading all five counters of all links each
        pass cost 194 ms CPU for two GPUs (430 calls); an 8-GPU node would spend most of a
        second per pass. So a pass reads:

        * every pass, per GPU: link states; the GPU-level counters (PCIe replays, remapped
          rows, volatile ECC) as entries of ONE ``nvmlDeviceGetFieldValues`` call (fields
          94, 142-145, 3, 4), falling back to their own calls where a field answers
          NOT_SUPPORTED; current PCIe generation and width; clock-event reasons; compute
          processes.
        * replay, recovery and CRC-flit counters (the ones that make findings) of the links
          with ``link % link_error_rotation == pass % link_error_rotation``, as entries of
          the same batched call (fields 161-163, scopeId = link), falling back per link and
          counter to ``nvmlDeviceGetNvLinkErrorCounter`` and then the older per-link fields.
          With the default 18, each link's counters are at most 18 passes old (4.5 min at
          the default 15 s interval): alert on their increase over 15 minutes or more (the
          shipped rule uses 1 h).
        * crc_data and ecc_data (no scoped field carries them: one call per counter) of the
          links with ``link % slow_error_rotation == pass % slow_error_rotation``: default
          72, at most 72 passes old (18 min). They are no findings (non-zero on healthy
          links); alert on their rate over hours.

        Why: on an H200 NVML spends about 0.85 ms of CPU per NVLink touched per call (the
        driver asks the GPU's firmware), whatever the number of fields. Measured there on 2
        GPUs (bench/bench_nvml.py): rotations 6/36 cost 12.5 ms per steady pass (50 ms
        extrapolated to 8 GPUs); the defaults 18/72 cost 4.7 ms (18.8 ms for 8). Link state
        is still read every pass (0.07 ms a link), so a link going down shows at once.
        * once per ``static_refresh_passes`` passes (default 40, 10 min at 15 s; GPU ``g``
          on the passes where ``pass % N == g % N``, so GPUs do not all refresh at once),
          after GPU_IS_LOST, and while a previous read of them failed: what cannot change
          while the driver is loaded, that is identity (PCI address, UUID, name, serial,
          VBIOS), maximum PCIe generation and width, and which link indices exist (all
          ``NVML_NVLINK_MAX_LINKS`` probed). A link's version, speed and far end are read
          again when its state changes, and at that refresh.

        A counter not read in a pass is exported with its last value: a sample of a counter
        taken a few passes ago is still a correct sample of it. The first pass reads every
        counter of every link (a link seen for the first time is read at once), so one pass
        (``--once``, a snapshot, a recording) is complete; a counter whose read failed is
        absent until it is read again, on the next pass. The path that answers each value
        (batched field, own call, older field) is learned on the first read and kept until
        the static refresh, so a GPU that lacks the fields costs no extra calls per pass.

    Concurrency
        The runner abandons a hung pass and starts the next. Each pass works on a copy of
        what the previous passes cached, and only the newest pass's copy is kept, so a hung
        pass that returns late cannot put older counter values back (a counter that went
        backwards would read as a reset). The lock guarding that hand-over is never held
        across an NVML call.
    """

    name = "nvml"

    def __init__(
        self,
        api_factory: Callable[[], NvmlApi] | None = None,
        *,
        watch_xid: bool = True,
        xid_wait_ms: int = 1000,
        link_error_rotation: int = 18,
        slow_error_rotation: int = 72,
        static_refresh_passes: int = 40,
    ) -> None:
        for name, value in (
            ("link_error_rotation", link_error_rotation),
            ("slow_error_rotation", slow_error_rotation),
            ("static_refresh_passes", static_refresh_passes),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        self._factory: Callable[[], NvmlApi] = api_factory or LiveNvml
        self._api: NvmlApi | None = None
        self._watch_xid = watch_xid
        self._xid_wait_ms = xid_wait_ms
        self._xid: _XidWatcher | None = None
        self.link_error_rotation = link_error_rotation
        self.slow_error_rotation = slow_error_rotation
        self.static_refresh_passes = static_refresh_passes
        self._lock = threading.Lock()  # guards the two below, never held across NVML
        self._passes = 0
        self._state = _State()

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
        with self._lock:
            k = self._passes
            self._passes += 1
            state = self._state
        p = _Pass()
        node = state.node
        if node is None or not node.complete or k % self.static_refresh_passes == 0:
            before = len(p.issues)
            driver = p.get("", api.driver_version)
            nvml_version = p.get("", api.nvml_version)
            complete = len(p.issues) == before
            node = None
        count = api.device_count()
        if count == 0:
            raise NoData("NVML sees no GPU")
        if node is None:
            node = _NodeStatic(driver, nvml_version, api.nvlink_max_links(), complete)
        gpus: list[NvmlGpu] = []
        caches: dict[int, _GpuCache] = {}
        for gpu in range(count):
            old = state.gpus.get(gpu)
            snap, cache = self._sample_gpu(
                api, p, gpu, None if old is None else old.copy(), k=k, max_links=node.max_links
            )
            gpus.append(snap)
            if cache is not None:
                caches[gpu] = cache
        with self._lock:
            if k > self._state.pass_index:  # a hung pass returning late keeps nothing
                self._state = _State(node, caches, k)
        if self._watch_xid and self._xid is None:
            self._xid = _XidWatcher(api, self._xid_wait_ms)
            self._xid.start(range(count))
        return NvmlSnapshot(
            driver_version=node.driver_version,
            nvml_version=node.nvml_version,
            gpus=tuple(gpus),
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
        with self._lock:  # a new NVML session: nothing cached carries over
            self._passes = 0
            self._state = _State()
        if api is not None:
            try:
                api.shutdown()
            except NvmlCallError as exc:
                log.debug("nvmlShutdown: %s", exc)

    # -- one GPU ------------------------------------------------------------------------

    def _static_due(self, k: int, cache: _GpuCache) -> bool:
        return cache.stale or not cache.static_complete or k >= cache.refresh_at

    def _sample_gpu(
        self, api: NvmlApi, p: _Pass, gpu: int, cache: _GpuCache | None, *, k: int, max_links: int
    ) -> tuple[NvmlGpu, _GpuCache | None]:
        """One GPU's snapshot and what it leaves for the next pass (``cache`` is this pass's
        own copy)."""
        b = _GpuBuilder(gpu)
        if cache is not None:
            b.identify(cache.identity)  # a GPU lost later still names itself
        try:
            if cache is None or self._static_due(k, cache):
                n = self.static_refresh_passes
                # at least n passes on, on a pass = gpu (mod n): GPUs take turns
                refresh_at = k + n + (gpu - k) % n
                cache, states = self._read_static(api, p, gpu, max_links, cache)
                cache.refresh_at = refresh_at
                b.identify(cache.identity)
            else:
                states = self._link_states(api, p, gpu, cache.links)
            self._sample_rest(_GpuPass(api, p, gpu, cache), k, states, b)
        except _GpuLost:
            if cache is not None:
                cache.stale = True
            return b.freeze(lost=True), cache
        return b.freeze(lost=False), cache

    @staticmethod
    def _read_static(
        api: NvmlApi, p: _Pass, gpu: int, max_links: int, old: _GpuCache | None
    ) -> tuple[_GpuCache, dict[int, int]]:
        """Identity, maximum PCIe link, and which links exist (with this pass's states)."""
        g = str(gpu)
        before = len(p.issues)
        pci = None
        bus_id = p.get(g, lambda: api.pci_bus_id(gpu))
        if bus_id is not None:
            pci = p.get(f"{g}/pci_bus_id", lambda: normalize_pci_bus_id(bus_id))
        ident = _Identity(
            pci_bus_id=pci,
            uuid=p.get(g, lambda: api.uuid(gpu)),
            name=p.get(g, lambda: api.name(gpu)),
            serial=p.get(g, lambda: api.serial(gpu)),
            vbios_version=p.get(g, lambda: api.vbios_version(gpu)),
            max_generation=p.get(g, lambda: api.pcie_max_link_generation(gpu)),
            max_width=p.get(g, lambda: api.pcie_max_link_width(gpu)),
        )
        complete = len(p.issues) == before
        links: list[int] = []
        states: dict[int, int] = {}
        for link in range(max_links):
            state = p.attempt(
                f"{g}/link{link}", functools.partial(api.nvlink_state, gpu, link), quiet=NO_LINK
            )
            if state is _Miss.UNSUPPORTED:
                continue
            links.append(link)  # a link, even if its state failed this time
            if not isinstance(state, _Miss):
                states[link] = state
        cache = _GpuCache(ident, complete, 0, tuple(links))
        if old is not None and not old.stale:  # what outlives a refresh, not a lost GPU
            cache.via = old.via  # the paths that answer: the driver is the same
            kept = set(links)
            cache.counts = {key: v for key, v in old.counts.items() if key[0] in kept}
        return cache, states

    @staticmethod
    def _link_states(api: NvmlApi, p: _Pass, gpu: int, links: Sequence[int]) -> dict[int, int]:
        states: dict[int, int] = {}
        for link in links:
            state = p.get(
                f"{gpu}/link{link}", functools.partial(api.nvlink_state, gpu, link), quiet=NO_LINK
            )
            if state is not None:
                states[link] = state
        return states

    def _sample_rest(self, gp: _GpuPass, k: int, states: dict[int, int], b: _GpuBuilder) -> None:
        """Everything but the static part: one batched field-values call, then the calls."""
        api, p, gpu, cache, batch = gp.api, gp.p, gp.gpu, gp.cache, gp.batch
        g = str(gpu)
        for name, fields in _GPU_FIELDS:
            if cache.via.get((_GPU_LEVEL, name), _Via.FIELD) is _Via.FIELD:
                for i, field_id in enumerate(fields):
                    batch.ask((_GPU_LEVEL, f"{name}/{i}"), field_id, 0)
        restate: set[int] = set()  # links whose version, speed and far end are (re)read
        for link, state in states.items():
            known = cache.link_static.get(link)
            if known is None or known.state != state or not known.complete:
                restate.add(link)
                if state != NVLINK_STATE_INACTIVE:
                    batch.ask((link, "speed"), FI_NVLINK_GET_SPEED, link)
        r, r2 = self.link_error_rotation, self.slow_error_rotation
        due: dict[int, tuple[str, ...]] = {}
        for link in states:
            names: tuple[str, ...] = ()
            if link % r == k % r or any((link, n) not in cache.counts for n in _FAST_ERRORS):
                names += _FAST_ERRORS
            if link % r2 == k % r2 or any((link, n) not in cache.counts for n in _SLOW_ERRORS):
                names += _SLOW_ERRORS
            due[link] = names
            for name in names:
                if cache.via.get((link, name), _default_via(name)) is _Via.FIELD:
                    batch.ask((link, name), _FI_SCOPED_ERRORS[name], link)
        batch.run(api, gpu)

        replays = gp.gpu_value("pcie_replays", g, lambda: (api.pcie_replay_counter(gpu),))
        rows = gp.gpu_value("remapped_rows", g, lambda: api.remapped_rows(gpu))
        if rows is not None:
            b.remapped_rows = RemappedRows(rows[0], rows[1], bool(rows[2]), bool(rows[3]))
        corrected = gp.gpu_value(
            "ecc_corrected",
            f"{g}/corrected",
            lambda: (api.total_ecc_errors(gpu, MEMORY_ERROR_CORRECTED, VOLATILE_ECC),),
        )
        b.ecc_corrected_volatile = None if corrected is None else corrected[0]
        uncorrected = gp.gpu_value(
            "ecc_uncorrected",
            f"{g}/uncorrected",
            lambda: (api.total_ecc_errors(gpu, MEMORY_ERROR_UNCORRECTED, VOLATILE_ECC),),
        )
        b.ecc_uncorrected_volatile = None if uncorrected is None else uncorrected[0]
        b.pcie = PcieLink(
            current_generation=p.get(g, lambda: api.pcie_current_link_generation(gpu)),
            max_generation=cache.identity.max_generation,
            current_width=p.get(g, lambda: api.pcie_current_link_width(gpu)),
            max_width=cache.identity.max_width,
            replays=None if replays is None else replays[0],
        )
        b.clocks_event_reasons = p.get(g, lambda: api.clocks_event_reasons(gpu))
        procs = p.get(g, lambda: api.compute_processes(gpu))
        if procs is not None:
            b.compute_processes = tuple(ComputeProcess(pid, mem) for pid, mem in procs)

        for link, state in states.items():
            if link in restate:
                cache.link_static[link] = gp.link_static(link, state)
            for name in due[link]:
                gp.counter(link, name)
            info = cache.link_static[link]
            counts = {name: cache.counts.get((link, name)) for name, _ in NVLINK_ERROR_COUNTERS}
            b.nvlinks.append(
                NvLink(
                    link=link,
                    state=state,
                    version=info.version,
                    speed_bytes_per_second=info.speed_bytes_per_second,
                    remote_pci_bus_id=info.remote_pci_bus_id,
                    remote_device_type=info.remote_device_type,
                    errors=NvLinkErrorCounts(**counts),
                )
            )


def _default_via(name: str) -> _Via:
    return _Via.FIELD if name in _FI_SCOPED_ERRORS else _Via.CALL


def _paths(order: tuple[_Via, ...], start: _Via) -> tuple[_Via, ...]:
    """The paths to try, from the one learned (none once nothing answers)."""
    return order[order.index(start) :] if start in order else ()


@dataclass(slots=True)
class _GpuPass:
    """One GPU's part of one pass: the API, the pass's error policy, this pass's copy of the
    GPU's cache and the pass's batched field values."""

    api: NvmlApi
    p: _Pass
    gpu: int
    cache: _GpuCache
    batch: _Batch = field(default_factory=_Batch)
    #: NVML's speed for all links, fetched once per GPU when first needed
    common_speed: list[int | None] = field(default_factory=list)

    def gpu_value(
        self, name: str, call_where: str, call: Callable[[], tuple[int, ...]]
    ) -> tuple[int, ...] | None:
        """A GPU-level counter from its fields in the batch, else from its own call."""
        key = (_GPU_LEVEL, name)
        n_fields = len(_GPU_FIELD_IDS[name])
        first_failed: _Via | None = None
        for via in _paths(_GPU_PATHS, self.cache.via.get(key, _Via.FIELD)):
            got: tuple[int, ...] | _Miss
            if via is _Via.FIELD:
                answers = [self.batch[(_GPU_LEVEL, f"{name}/{i}")] for i in range(n_fields)]
                got = _combine(self.p, f"{self.gpu}/{name}", answers)
            else:
                got = self.p.attempt(call_where, call)
            if got is _Miss.UNSUPPORTED:
                continue
            if isinstance(got, _Miss):
                first_failed = first_failed or via
                continue
            self.cache.via[key] = first_failed or via
            return got
        self.cache.via[key] = first_failed or _Via.NOTHING
        return None

    def counter(self, link: int, name: str) -> None:
        """One NVLink error counter into the cache's counts: the batched scoped field, else
        ``nvmlDeviceGetNvLinkErrorCounter``, else the older per-link field."""
        key = (link, name)
        where = f"{self.gpu}/link{link}/{name}"
        legacy = _FI_LEGACY_ERRORS[name]
        first_failed: _Via | None = None
        for via in _paths(_COUNTER_PATHS, self.cache.via.get(key, _default_via(name))):
            got: int | _Miss
            if via is _Via.FIELD:
                got = self.p.answer(where, self.batch[key])
            elif via is _Via.CALL:
                counter = _ERROR_COUNTER_IDS[name]
                got = self.p.attempt(
                    where, functools.partial(self.api.nvlink_error_counter, self.gpu, link, counter)
                )
            elif link < len(legacy):
                got = self.p.attempt(
                    where, functools.partial(self.api.field_value, self.gpu, legacy[link], 0)
                )
            else:
                got = _Miss.UNSUPPORTED
            if got is _Miss.UNSUPPORTED:
                continue
            if isinstance(got, _Miss):
                first_failed = first_failed or via
                continue
            self.cache.via[key] = first_failed or via
            self.cache.counts[key] = got
            return
        if first_failed is None:  # nothing offers it: absent, not asked until the refresh
            self.cache.via[key] = _Via.NOTHING
            self.cache.counts[key] = None
        else:  # it failed: absent now, read again next pass
            self.cache.via[key] = first_failed
            self.cache.counts.pop(key, None)

    def link_static(self, link: int, state: int) -> _LinkStatic:
        api, p, gpu = self.api, self.p, self.gpu
        where = f"{gpu}/link{link}"
        before = len(p.issues)
        version = p.get(where, lambda: api.nvlink_version(gpu, link))
        speed = remote_bus = remote_type = None
        if state != NVLINK_STATE_INACTIVE:
            speed = self.link_speed(link)
            raw_bus = p.get(where, lambda: api.nvlink_remote_pci_bus_id(gpu, link))
            if raw_bus is not None:
                remote_bus = p.get(f"{where}/remote", lambda: normalize_pci_bus_id(raw_bus))
            kind = p.get(where, lambda: api.nvlink_remote_device_type(gpu, link))
            if kind is not None:
                remote_type = NVLINK_DEVICE_TYPES.get(kind, "unknown")
        return _LinkStatic(
            state, version, speed, remote_bus, remote_type, complete=len(p.issues) == before
        )

    def link_speed(self, link: int) -> int | None:
        """Bytes/second: the per-link speed field (batched), else the older per-link field,
        else the speed NVML gives for all links. NVML reports MBps (10^6 bytes/s)."""
        api, p, gpu = self.api, self.p, self.gpu
        where = f"{gpu}/link{link}/speed"
        got = p.answer(where, self.batch[(link, "speed")])
        mbps = None if isinstance(got, _Miss) else got
        if mbps is None and link < len(_FI_LEGACY_SPEED):
            mbps = p.get(where, lambda: api.field_value(gpu, _FI_LEGACY_SPEED[link], 0))
        if mbps is None:
            if not self.common_speed:
                self.common_speed.append(
                    p.get(f"{gpu}/speed", lambda: api.field_value(gpu, FI_NVLINK_SPEED_COMMON, 0))
                )
            mbps = self.common_speed[0]
        if mbps is None or mbps <= 0:
            return None
        return mbps * _MEGABYTE


def _combine(p: _Pass, where: str, answers: Sequence[FieldAnswer]) -> tuple[int, ...] | _Miss:
    """Several fields standing for one value: all their values, or the first entry's miss."""
    values: list[int] = []
    for answer in answers:
        got = p.answer(where, answer)
        if isinstance(got, _Miss):
            return got
        values.append(got)
    return tuple(values)


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
