"""The NVML adapter: every NVML call the samplers make, as plain Python values.

Every call goes through :class:`NvmlApi`: one method per call, each returning plain Python
values (``int``, ``str``, tuples) or raising :class:`NvmlCallError` with NVML's return code
and its name (``NOT_SUPPORTED``, ``GPU_IS_LOST`` ...). :class:`LiveNvml` is the one
implementation that imports ``pynvml``; :class:`agent.nvml.record.ReplayNvml` answers from a
JSON recording of what a real node said, and :class:`agent.nvml.record.RecordingNvml` records
a live node, so tests replay recorded answers instead of mocking calls. NVML needs no CUDA
context: the agent never creates one and never holds GPU memory.

The constants below are copied from ``nvml.h`` so that only :class:`LiveNvml` imports pynvml.
NVML is not used from two threads at once anywhere in fabricscope: the sampler polls XID
events on its own thread (see :mod:`agent.nvml.sampler`), and the agent runs it in a child process
(:mod:`agent.core.isolation`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, cast

from agent.core.errors import NoData

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

#: nvmlNvLinkErrorCounter_t, in fabricscope's names (``reason`` label values)
NVLINK_ERROR_COUNTERS: tuple[tuple[str, int], ...] = (
    ("replay", 0),  # NVML_NVLINK_ERROR_DL_REPLAY
    ("recovery", 1),  # NVML_NVLINK_ERROR_DL_RECOVERY
    ("crc_flit", 2),  # NVML_NVLINK_ERROR_DL_CRC_FLIT
    ("crc_data", 3),  # NVML_NVLINK_ERROR_DL_CRC_DATA
    ("ecc_data", 4),  # NVML_NVLINK_ERROR_DL_ECC_DATA
)
#: per-link field values carrying the same counters (scopeId = link)
FI_SCOPED_ERRORS = {"replay": 161, "recovery": 162, "crc_flit": 163}
#: older per-link fields, ``*_ERROR_COUNT_L0..L11``: the field id for link n (scopeId 0)
FI_LEGACY_ERRORS: dict[str, tuple[int, ...]] = {
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
#: NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX / _RX: payload KiB through the GPU's NVLinks since the
#: driver loaded; asked with scopeId :data:`SCOPE_ALL_LINKS` they answer the sum over every link
#: (on a lent 4x H100: a 4-rank ring all_reduce moving 7,864,320 KiB per GPU read 7,864,689 KiB,
#: and the per-link values summed to the same; idle links do not move them, unlike the _RAW_
#: fields 140/141, which count link-level traffic and moved ~600 KiB in 5 s at idle)
FI_NVLINK_THROUGHPUT_DATA_TX = 138
FI_NVLINK_THROUGHPUT_DATA_RX = 139
#: the scopeId that asks a per-link field for every link at once (UINT_MAX)
SCOPE_ALL_LINKS = 0xFFFFFFFF
FI_LEGACY_SPEED = (*range(84, 90), *range(132, 138))  # NVML_FI_DEV_NVLINK_SPEED_MBPS_L0..L11
FI_NVLINK_SPEED_COMMON = 90  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON

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

    def compute_mode(self, gpu: int) -> int:
        """nvmlDeviceGetComputeMode: 0 default, 1 exclusive thread (retired), 2 prohibited,
        3 exclusive process (what an MPS control daemon sets on the GPUs it shares)."""

    def mig_mode(self, gpu: int) -> tuple[int, int]:
        """nvmlDeviceGetMigMode: (current, pending), 1 = enabled (:mod:`agent.nvml.mig`)."""

    def max_mig_device_count(self, gpu: int) -> int:
        """nvmlDeviceGetMaxMigDeviceCount: MIG device slots, not how many exist."""

    def mig_uuid(self, gpu: int, slot: int) -> str:
        """nvmlDeviceGetUUID of nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot); an empty
        slot raises the handle call's NOT_FOUND."""

    def mig_name(self, gpu: int, slot: int) -> str:
        """nvmlDeviceGetName of that MIG device (``<model> MIG <profile>``)."""

    def mig_gpu_instance_id(self, gpu: int, slot: int) -> int:
        """nvmlDeviceGetGpuInstanceId of that MIG device."""

    def mig_compute_instance_id(self, gpu: int, slot: int) -> int:
        """nvmlDeviceGetComputeInstanceId of that MIG device."""

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

    def gpu_fabric_info(self, gpu: int) -> tuple[str, int, int, int]:
        """nvmlDeviceGetGpuFabricInfoV (nvmlDeviceGetGpuFabricInfo where the driver or
        pynvml lacks it): (cluster UUID as 32 hex digits, status code, clique ID, state
        code), as :func:`agent.nvml.fabric.parse_fabric` reads them."""


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


class _FabricInfo(Protocol):  # pynvml's c_nvmlGpuFabricInfo(V)_t, the fields used
    clusterUuid: Sequence[int]  # noqa: N815
    status: int
    cliqueId: int  # noqa: N815
    state: int


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


def open_api(factory: Callable[[], NvmlApi]) -> NvmlApi:
    """``factory()`` initialised (``nvmlInit``); :class:`~agent.core.errors.NoData` when NVML says
    there is no driver here (:data:`NO_DRIVER`), its other errors raised as they are."""
    api = factory()
    try:
        api.init()
    except NvmlCallError as exc:
        if exc.name in NO_DRIVER:
            raise NoData(f"no NVIDIA driver: {exc}") from exc
        raise
    return api


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

    def compute_mode(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetComputeMode", gpu)

    def mig_mode(self, gpu: int) -> tuple[int, int]:
        call = "nvmlDeviceGetMigMode"
        raw = self._dev(call, gpu)
        if not isinstance(raw, list | tuple) or len(raw) != 2:
            raise NvmlAnswerError(call, f"answered {type(raw).__name__}, expected two modes")
        return _int(raw[0], call), _int(raw[1], call)

    def max_mig_device_count(self, gpu: int) -> int:
        return self._dint("nvmlDeviceGetMaxMigDeviceCount", gpu)

    def _mig(self, call: str, gpu: int, slot: int) -> object:
        """``call`` on the MIG device in ``slot`` of ``gpu`` (handles are not kept: a MIG
        device's handle dies with it when the GPU is re-partitioned)."""
        handle = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", gpu, slot)
        return self._call(call, handle)

    def mig_uuid(self, gpu: int, slot: int) -> str:
        return _text(self._mig("nvmlDeviceGetUUID", gpu, slot))

    def mig_name(self, gpu: int, slot: int) -> str:
        return _text(self._mig("nvmlDeviceGetName", gpu, slot))

    def mig_gpu_instance_id(self, gpu: int, slot: int) -> int:
        call = "nvmlDeviceGetGpuInstanceId"
        return _int(self._mig(call, gpu, slot), call)

    def mig_compute_instance_id(self, gpu: int, slot: int) -> int:
        call = "nvmlDeviceGetComputeInstanceId"
        return _int(self._mig(call, gpu, slot), call)

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

    def gpu_fabric_info(self, gpu: int) -> tuple[str, int, int, int]:
        info: _FabricInfo | None = None
        for call, struct in (
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
            ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
        ):
            make = getattr(self._nv, struct, None)
            if make is None:
                continue
            out = cast(ctypes.Structure, make())
            try:
                self._dev(call, gpu, ctypes.byref(out))
            except NvmlCallError as exc:
                if exc.name != "FUNCTION_NOT_FOUND":
                    raise
                continue
            info = cast(_FabricInfo, out)
            break
        if info is None:
            raise NvmlCallError("nvmlDeviceGetGpuFabricInfoV", 13, "FUNCTION_NOT_FOUND")
        call = "nvmlDeviceGetGpuFabricInfoV"
        return (
            bytes(info.clusterUuid).hex(),
            _int(info.status, call),
            _int(info.cliqueId, call),
            _int(info.state, call),
        )


def _address(handle: object) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None
