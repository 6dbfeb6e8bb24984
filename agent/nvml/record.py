"""Recording and replay of NVML answers, so a node's NVML can be replayed in tests and bug
reports exactly as it answered.

A recording is one JSON object::

    {
      "format": "fabricscope-nvml-recording/1",
      "recorded_at_unix": 1795000000,
      "host": {"driver": "580.159.04", "nvml": "13.580", ...},
      "calls": {
        "nvmlDeviceGetUUID(0)": {"value": "GPU-..."},
        "nvmlDeviceGetFieldValues(0,90,0)": {"error": "NOT_SUPPORTED", "code": 3},
        ...
      },
      "events": [{"gpu": 0, "xid": 79}]
    }

A key is the NVML function an :class:`~agent.nvml.api.NvmlApi` method stands for and the method's
arguments, comma-joined (a GPU is its NVML index). A value is the method's return value in
JSON (tuples as lists); an error is NVML's return-code name and number. A batched
``nvmlDeviceGetFieldValues`` call is recorded entry by entry, each under the key of a
one-field call (``nvmlDeviceGetFieldValues(<gpu>,<field>,<scope>)``), so recordings from
before the sampler batched fields stay valid. A call on a MIG device names its parent GPU and
its slot (``nvmlDeviceGetUUID(0,mig2)``: :func:`mig_key`); a recording without
``nvmlDeviceGetMigMode`` replays as a node whose GPUs have no MIG. ``events`` are XID events
in the order the recorded node delivered them; :class:`ReplayNvml` hands them out through
``xid_wait`` and tests can add more with :meth:`ReplayNvml.feed_xid`.

A recording made before a call existed lacks its key: ``nvmlDeviceGetGpuFabricInfoV``
missing from a recording replays as ``FUNCTION_NOT_FOUND`` (the node was not asked, as a
driver without the call answers), whatever ``strict`` says; every other missing key is
:class:`NotRecordedError` when strict.

The sampler's first pass asks every question its later passes ask (they read subsets: a
rotating share of the links' error counters, the static facts again), so a recording of one
pass replays for any number of passes, each giving what the recorded pass gave.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias, TypeVar

from agent.core.errors import NoData
from agent.core.isolation import ChildSpec, IsolatedSampler, expect
from agent.core.sysfs import ReadIssue
from agent.nvml.api import LiveNvml, NvmlAnswerError, NvmlApi, NvmlCallError, XidEvent
from agent.nvml.sampler import NvmlSampler
from agent.nvml.snapshot import NvmlSnapshot

FORMAT = "fabricscope-nvml-recording/1"

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
T = TypeVar("T")


class RecordingError(ValueError):
    """A recording is malformed (wrong format tag, a value of the wrong shape)."""


class NotRecordedError(LookupError):
    """The sampler asked a question the recording holds no answer to (a strict replay)."""


def call_key(call: str, *args: int) -> str:
    """``nvmlDeviceGetNvLinkState(0,3)``."""
    return f"{call}({','.join(str(a) for a in args)})"


def mig_key(call: str, gpu: int, slot: int) -> str:
    """``nvmlDeviceGetUUID(0,mig2)``: ``call`` on the MIG device in slot 2 of GPU 0 (its
    handle from ``nvmlDeviceGetMigDeviceHandleByIndex``)."""
    return f"{call}({gpu},mig{slot})"


def to_json(value: object) -> JsonValue:
    """A method's return value as JSON (tuples become lists)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    raise TypeError(f"cannot record {type(value).__name__}")


def _int(value: JsonValue, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise NvmlAnswerError(key.partition("(")[0], f"{key} recorded {value!r}, not an integer")
    return value


def _str(value: JsonValue, key: str) -> str:
    if not isinstance(value, str):
        raise NvmlAnswerError(key.partition("(")[0], f"{key} recorded {value!r}, not a string")
    return value


def _list(value: JsonValue, key: str) -> list[JsonValue]:
    if not isinstance(value, list):
        raise NvmlAnswerError(key.partition("(")[0], f"{key} recorded {value!r}, not a list")
    return value


class ReplayNvml:
    """:class:`~agent.nvml.api.NvmlApi` answering from a recording. ``strict``: a question the
    recording lacks raises :class:`NotRecordedError` (else it is answered ``NOT_SUPPORTED``)."""

    def __init__(self, recording: Mapping[str, JsonValue], *, strict: bool = True) -> None:
        if recording.get("format") != FORMAT:
            raise RecordingError(f"not a {FORMAT} recording: format={recording.get('format')!r}")
        calls = recording.get("calls")
        if not isinstance(calls, dict):
            raise RecordingError("recording has no 'calls' object")
        self._calls = calls
        self._strict = strict
        self._events: queue.Queue[XidEvent] = queue.Queue()
        events = recording.get("events", [])
        for ev in events if isinstance(events, list) else [events]:
            if not isinstance(ev, dict) or not all(
                isinstance(ev.get(k), int) for k in ("gpu", "xid")
            ):
                raise RecordingError(f"events: expected {{'gpu': N, 'xid': N}}, got {ev!r}")
            self.feed_xid(_int(ev["gpu"], "events"), _int(ev["xid"], "events"))

    def feed_xid(self, gpu: int, xid: int) -> None:
        """Deliver one more XID event to ``xid_wait`` (thread-safe)."""
        self._events.put(XidEvent(gpu, xid))

    def _answer(self, call: str, *args: int) -> JsonValue:
        return self._entry(call, call_key(call, *args))

    def _entry(self, call: str, key: str) -> JsonValue:
        """The recorded answer to ``call`` under ``key``: its value, or its error raised."""
        entry = self._calls.get(key)
        if entry is None:
            if self._strict:
                raise NotRecordedError(key)
            raise NvmlCallError(call, 3, "NOT_SUPPORTED")
        if not isinstance(entry, dict):
            raise RecordingError(f"{key}: expected an object, got {entry!r}")
        if "error" in entry:
            raise NvmlCallError(call, _int(entry.get("code"), key), _str(entry["error"], key))
        if "value" not in entry:
            raise RecordingError(f"{key}: neither 'value' nor 'error'")
        return entry["value"]

    def _i(self, call: str, *args: int) -> int:
        return _int(self._answer(call, *args), call_key(call, *args))

    def _s(self, call: str, *args: int) -> str:
        return _str(self._answer(call, *args), call_key(call, *args))

    def init(self) -> None:
        self._answer("nvmlInit")

    def shutdown(self) -> None:
        self._answer("nvmlShutdown")

    def nvlink_max_links(self) -> int:
        return self._i("NVML_NVLINK_MAX_LINKS")

    def driver_version(self) -> str:
        return self._s("nvmlSystemGetDriverVersion")

    def nvml_version(self) -> str:
        return self._s("nvmlSystemGetNVMLVersion")

    def device_count(self) -> int:
        return self._i("nvmlDeviceGetCount")

    def pci_bus_id(self, gpu: int) -> str:
        return self._s("nvmlDeviceGetPciInfo", gpu)

    def uuid(self, gpu: int) -> str:
        return self._s("nvmlDeviceGetUUID", gpu)

    def name(self, gpu: int) -> str:
        return self._s("nvmlDeviceGetName", gpu)

    def serial(self, gpu: int) -> str:
        return self._s("nvmlDeviceGetSerial", gpu)

    def vbios_version(self, gpu: int) -> str:
        return self._s("nvmlDeviceGetVbiosVersion", gpu)

    def pcie_current_link_generation(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetCurrPcieLinkGeneration", gpu)

    def pcie_max_link_generation(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetMaxPcieLinkGeneration", gpu)

    def pcie_current_link_width(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetCurrPcieLinkWidth", gpu)

    def pcie_max_link_width(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetMaxPcieLinkWidth", gpu)

    def pcie_replay_counter(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetPcieReplayCounter", gpu)

    def remapped_rows(self, gpu: int) -> tuple[int, int, int, int]:
        key = call_key("nvmlDeviceGetRemappedRows", gpu)
        raw = _list(self._answer("nvmlDeviceGetRemappedRows", gpu), key)
        if len(raw) != 4:
            raise NvmlAnswerError("nvmlDeviceGetRemappedRows", f"{key}: expected 4 integers")
        a, b, c, d = (_int(v, key) for v in raw)
        return a, b, c, d

    def total_ecc_errors(self, gpu: int, error_type: int, counter_type: int) -> int:
        return self._i("nvmlDeviceGetTotalEccErrors", gpu, error_type, counter_type)

    def clocks_event_reasons(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetCurrentClocksEventReasons", gpu)

    def compute_processes(self, gpu: int) -> tuple[tuple[int, int | None], ...]:
        call = "nvmlDeviceGetComputeRunningProcesses"
        key = call_key(call, gpu)
        out = []
        for item in _list(self._answer(call, gpu), key):
            pair = _list(item, key)
            if len(pair) != 2:
                raise NvmlAnswerError(call, f"{key}: expected [pid, used_bytes], got {pair!r}")
            out.append((_int(pair[0], key), None if pair[1] is None else _int(pair[1], key)))
        return tuple(out)

    def compute_mode(self, gpu: int) -> int:
        """Answered NOT_SUPPORTED when the recording lacks it, strict or not: recordings made
        before the probe asked for it never did."""
        call = "nvmlDeviceGetComputeMode"
        if call_key(call, gpu) not in self._calls:
            raise NvmlCallError(call, 3, "NOT_SUPPORTED")
        return self._i(call, gpu)

    def mig_mode(self, gpu: int) -> tuple[int, int]:
        """Answered NOT_SUPPORTED when the recording lacks it, strict or not: recordings
        made before the sampler read MIG never asked (so they replay as GPUs without MIG)."""
        call = "nvmlDeviceGetMigMode"
        key = call_key(call, gpu)
        if key not in self._calls:
            raise NvmlCallError(call, 3, "NOT_SUPPORTED")
        raw = _list(self._answer(call, gpu), key)
        if len(raw) != 2:
            raise NvmlAnswerError(call, f"{key}: expected [current, pending]")
        return _int(raw[0], key), _int(raw[1], key)

    def max_mig_device_count(self, gpu: int) -> int:
        return self._i("nvmlDeviceGetMaxMigDeviceCount", gpu)

    def _mig(self, call: str, gpu: int, slot: int) -> JsonValue:
        return self._entry(call, mig_key(call, gpu, slot))

    def mig_uuid(self, gpu: int, slot: int) -> str:
        return _str(self._mig("nvmlDeviceGetUUID", gpu, slot), mig_key("uuid", gpu, slot))

    def mig_name(self, gpu: int, slot: int) -> str:
        return _str(self._mig("nvmlDeviceGetName", gpu, slot), mig_key("name", gpu, slot))

    def mig_gpu_instance_id(self, gpu: int, slot: int) -> int:
        call = "nvmlDeviceGetGpuInstanceId"
        return _int(self._mig(call, gpu, slot), mig_key(call, gpu, slot))

    def mig_compute_instance_id(self, gpu: int, slot: int) -> int:
        call = "nvmlDeviceGetComputeInstanceId"
        return _int(self._mig(call, gpu, slot), mig_key(call, gpu, slot))

    def nvlink_state(self, gpu: int, link: int) -> int:
        return self._i("nvmlDeviceGetNvLinkState", gpu, link)

    def nvlink_version(self, gpu: int, link: int) -> int:
        return self._i("nvmlDeviceGetNvLinkVersion", gpu, link)

    def nvlink_remote_pci_bus_id(self, gpu: int, link: int) -> str:
        return self._s("nvmlDeviceGetNvLinkRemotePciInfo", gpu, link)

    def nvlink_remote_device_type(self, gpu: int, link: int) -> int:
        return self._i("nvmlDeviceGetNvLinkRemoteDeviceType", gpu, link)

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> int:
        return self._i("nvmlDeviceGetNvLinkErrorCounter", gpu, link, counter)

    def field_value(self, gpu: int, field_id: int, scope_id: int) -> int:
        return self._i("nvmlDeviceGetFieldValues", gpu, field_id, scope_id)

    def field_values(
        self, gpu: int, fields: Sequence[tuple[int, int]]
    ) -> tuple[int | NvmlCallError, ...]:
        """Each field from its own key, ``nvmlDeviceGetFieldValues(gpu,field,scope)``. A field
        the recording has no key for answers NOT_SUPPORTED, strict or not: recordings made
        before the sampler batched fields never asked them, and NOT_SUPPORTED sends the
        sampler to the per-call path those recordings do hold (what the node answered)."""
        call = "nvmlDeviceGetFieldValues"
        out: list[int | NvmlCallError] = []
        for field_id, scope_id in fields:
            key = call_key(call, gpu, field_id, scope_id)
            if key not in self._calls:
                out.append(NvmlCallError(call, 3, "NOT_SUPPORTED"))
                continue
            try:
                out.append(_int(self._answer(call, gpu, field_id, scope_id), key))
            except NvmlCallError as exc:
                out.append(exc)
        return tuple(out)

    def xid_open(self) -> None:
        self._answer("nvmlEventSetCreate")

    def xid_register(self, gpu: int) -> None:
        self._answer("nvmlDeviceRegisterEvents", gpu)

    def xid_wait(self, timeout_ms: int) -> XidEvent:
        try:
            return self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise NvmlCallError("nvmlEventSetWait_v2", 10, "TIMEOUT") from None

    def xid_close(self) -> None:
        self._answer("nvmlEventSetFree")

    def gpu_fabric_info(self, gpu: int) -> tuple[str, int, int, int]:
        call = "nvmlDeviceGetGpuFabricInfoV"
        key = call_key(call, gpu)
        if key not in self._calls:  # recorded before fabricscope asked (module docstring)
            raise NvmlCallError(call, 13, "FUNCTION_NOT_FOUND")
        raw = _list(self._answer(call, gpu), key)
        if len(raw) != 4:
            raise NvmlAnswerError(call, f"{key}: expected [uuid hex, status, clique, state]")
        return _str(raw[0], key), _int(raw[1], key), _int(raw[2], key), _int(raw[3], key)


class RecordingNvml:
    """:class:`~agent.nvml.api.NvmlApi` passing every call to ``inner`` and recording its answer,
    errors included (XID wait timeouts excepted: they are the normal "nothing happened"), and
    counting the calls. Thread-safe: the XID thread records events while a pass records
    calls. A key keeps its latest answer: a recording spanning several passes replays each
    of them as the last one answered."""

    def __init__(self, inner: NvmlApi) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.calls: dict[str, dict[str, JsonValue]] = {}
        self.events: list[XidEvent] = []
        #: NVML calls made through this recorder, by function (a batched
        #: nvmlDeviceGetFieldValues counts once), and field-value entries asked, by field id:
        #: what a pass costs (``bench/bench_nvml.py``, the tests); clear them to count anew
        self.counts: Counter[str] = Counter()
        self.fields_read: Counter[int] = Counter()

    def _rec(self, call: str, args: tuple[int, ...], thunk: Callable[[], T]) -> T:
        return self._rec_at(call, call_key(call, *args), thunk)

    def _rec_at(self, call: str, key: str, thunk: Callable[[], T]) -> T:
        with self._lock:
            self.counts[call] += 1
        try:
            value = thunk()
        except NvmlCallError as exc:
            with self._lock:
                self.calls[key] = {"error": exc.name, "code": exc.code}
            raise
        encoded = to_json(value)
        with self._lock:
            self.calls[key] = {"value": encoded}
        return value

    def recording(self, host: Mapping[str, JsonValue] | None = None) -> dict[str, JsonValue]:
        """The recording so far, as a JSON-ready object with sorted keys."""
        with self._lock:
            calls: dict[str, JsonValue] = {k: dict(v) for k, v in sorted(self.calls.items())}
            events: list[JsonValue] = [{"gpu": e.gpu, "xid": e.xid} for e in self.events]
        return {
            "format": FORMAT,
            "recorded_at_unix": int(time.time()),
            "host": dict(host or {}),
            "calls": calls,
            "events": events,
        }

    def init(self) -> None:
        self._rec("nvmlInit", (), self._inner.init)

    def shutdown(self) -> None:
        self._rec("nvmlShutdown", (), self._inner.shutdown)

    def nvlink_max_links(self) -> int:
        return self._rec("NVML_NVLINK_MAX_LINKS", (), self._inner.nvlink_max_links)

    def driver_version(self) -> str:
        return self._rec("nvmlSystemGetDriverVersion", (), self._inner.driver_version)

    def nvml_version(self) -> str:
        return self._rec("nvmlSystemGetNVMLVersion", (), self._inner.nvml_version)

    def device_count(self) -> int:
        return self._rec("nvmlDeviceGetCount", (), self._inner.device_count)

    def pci_bus_id(self, gpu: int) -> str:
        return self._rec("nvmlDeviceGetPciInfo", (gpu,), lambda: self._inner.pci_bus_id(gpu))

    def uuid(self, gpu: int) -> str:
        return self._rec("nvmlDeviceGetUUID", (gpu,), lambda: self._inner.uuid(gpu))

    def name(self, gpu: int) -> str:
        return self._rec("nvmlDeviceGetName", (gpu,), lambda: self._inner.name(gpu))

    def serial(self, gpu: int) -> str:
        return self._rec("nvmlDeviceGetSerial", (gpu,), lambda: self._inner.serial(gpu))

    def vbios_version(self, gpu: int) -> str:
        return self._rec(
            "nvmlDeviceGetVbiosVersion", (gpu,), lambda: self._inner.vbios_version(gpu)
        )

    def pcie_current_link_generation(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetCurrPcieLinkGeneration",
            (gpu,),
            lambda: self._inner.pcie_current_link_generation(gpu),
        )

    def pcie_max_link_generation(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetMaxPcieLinkGeneration",
            (gpu,),
            lambda: self._inner.pcie_max_link_generation(gpu),
        )

    def pcie_current_link_width(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetCurrPcieLinkWidth",
            (gpu,),
            lambda: self._inner.pcie_current_link_width(gpu),
        )

    def pcie_max_link_width(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetMaxPcieLinkWidth", (gpu,), lambda: self._inner.pcie_max_link_width(gpu)
        )

    def pcie_replay_counter(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetPcieReplayCounter", (gpu,), lambda: self._inner.pcie_replay_counter(gpu)
        )

    def remapped_rows(self, gpu: int) -> tuple[int, int, int, int]:
        return self._rec(
            "nvmlDeviceGetRemappedRows", (gpu,), lambda: self._inner.remapped_rows(gpu)
        )

    def total_ecc_errors(self, gpu: int, error_type: int, counter_type: int) -> int:
        return self._rec(
            "nvmlDeviceGetTotalEccErrors",
            (gpu, error_type, counter_type),
            lambda: self._inner.total_ecc_errors(gpu, error_type, counter_type),
        )

    def clocks_event_reasons(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetCurrentClocksEventReasons",
            (gpu,),
            lambda: self._inner.clocks_event_reasons(gpu),
        )

    def compute_processes(self, gpu: int) -> tuple[tuple[int, int | None], ...]:
        return self._rec(
            "nvmlDeviceGetComputeRunningProcesses",
            (gpu,),
            lambda: self._inner.compute_processes(gpu),
        )

    def compute_mode(self, gpu: int) -> int:
        return self._rec("nvmlDeviceGetComputeMode", (gpu,), lambda: self._inner.compute_mode(gpu))

    def mig_mode(self, gpu: int) -> tuple[int, int]:
        return self._rec("nvmlDeviceGetMigMode", (gpu,), lambda: self._inner.mig_mode(gpu))

    def max_mig_device_count(self, gpu: int) -> int:
        return self._rec(
            "nvmlDeviceGetMaxMigDeviceCount", (gpu,), lambda: self._inner.max_mig_device_count(gpu)
        )

    def _rec_mig(self, call: str, gpu: int, slot: int, thunk: Callable[[], T]) -> T:
        return self._rec_at(call, mig_key(call, gpu, slot), thunk)

    def mig_uuid(self, gpu: int, slot: int) -> str:
        return self._rec_mig(
            "nvmlDeviceGetUUID", gpu, slot, lambda: self._inner.mig_uuid(gpu, slot)
        )

    def mig_name(self, gpu: int, slot: int) -> str:
        return self._rec_mig(
            "nvmlDeviceGetName", gpu, slot, lambda: self._inner.mig_name(gpu, slot)
        )

    def mig_gpu_instance_id(self, gpu: int, slot: int) -> int:
        return self._rec_mig(
            "nvmlDeviceGetGpuInstanceId",
            gpu,
            slot,
            lambda: self._inner.mig_gpu_instance_id(gpu, slot),
        )

    def mig_compute_instance_id(self, gpu: int, slot: int) -> int:
        return self._rec_mig(
            "nvmlDeviceGetComputeInstanceId",
            gpu,
            slot,
            lambda: self._inner.mig_compute_instance_id(gpu, slot),
        )

    def nvlink_state(self, gpu: int, link: int) -> int:
        return self._rec(
            "nvmlDeviceGetNvLinkState", (gpu, link), lambda: self._inner.nvlink_state(gpu, link)
        )

    def nvlink_version(self, gpu: int, link: int) -> int:
        return self._rec(
            "nvmlDeviceGetNvLinkVersion",
            (gpu, link),
            lambda: self._inner.nvlink_version(gpu, link),
        )

    def nvlink_remote_pci_bus_id(self, gpu: int, link: int) -> str:
        return self._rec(
            "nvmlDeviceGetNvLinkRemotePciInfo",
            (gpu, link),
            lambda: self._inner.nvlink_remote_pci_bus_id(gpu, link),
        )

    def nvlink_remote_device_type(self, gpu: int, link: int) -> int:
        return self._rec(
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            (gpu, link),
            lambda: self._inner.nvlink_remote_device_type(gpu, link),
        )

    def nvlink_error_counter(self, gpu: int, link: int, counter: int) -> int:
        return self._rec(
            "nvmlDeviceGetNvLinkErrorCounter",
            (gpu, link, counter),
            lambda: self._inner.nvlink_error_counter(gpu, link, counter),
        )

    def field_value(self, gpu: int, field_id: int, scope_id: int) -> int:
        with self._lock:
            self.fields_read[field_id] += 1
        return self._rec(
            "nvmlDeviceGetFieldValues",
            (gpu, field_id, scope_id),
            lambda: self._inner.field_value(gpu, field_id, scope_id),
        )

    def field_values(
        self, gpu: int, fields: Sequence[tuple[int, int]]
    ) -> tuple[int | NvmlCallError, ...]:
        """Recorded field by field under the keys :meth:`field_value` uses; an error of the
        whole call is recorded as every field's answer (the sampler treats the two alike)."""
        call = "nvmlDeviceGetFieldValues"
        keys = [call_key(call, gpu, f, s) for f, s in fields]
        with self._lock:
            self.counts[call] += 1
            self.fields_read.update(f for f, _ in fields)
        try:
            answers = self._inner.field_values(gpu, fields)
        except NvmlCallError as exc:
            with self._lock:
                for key in keys:
                    self.calls[key] = {"error": exc.name, "code": exc.code}
            raise
        with self._lock:
            for key, answer in zip(keys, answers, strict=False):
                if isinstance(answer, NvmlCallError):
                    self.calls[key] = {"error": answer.name, "code": answer.code}
                else:
                    self.calls[key] = {"value": answer}
        return answers

    def xid_open(self) -> None:
        self._rec("nvmlEventSetCreate", (), self._inner.xid_open)

    def xid_register(self, gpu: int) -> None:
        self._rec("nvmlDeviceRegisterEvents", (gpu,), lambda: self._inner.xid_register(gpu))

    def xid_wait(self, timeout_ms: int) -> XidEvent:
        event = self._inner.xid_wait(timeout_ms)
        with self._lock:
            self.events.append(event)
        return event

    def xid_close(self) -> None:
        self._rec("nvmlEventSetFree", (), self._inner.xid_close)

    def gpu_fabric_info(self, gpu: int) -> tuple[str, int, int, int]:
        return self._rec(
            "nvmlDeviceGetGpuFabricInfoV", (gpu,), lambda: self._inner.gpu_fabric_info(gpu)
        )


def record(
    api: NvmlApi, *, xid_seconds: float = 0.0, host: Mapping[str, JsonValue] | None = None
) -> tuple[dict[str, JsonValue], NvmlSnapshot]:
    """One full sampling pass over ``api`` (XID registration included), then ``xid_seconds``
    of listening for XID events, all recorded. Returns the recording and the pass's snapshot.
    The first pass of a sampler reads every counter of every link, so the recording answers
    every later pass too. Raises :class:`~agent.core.errors.NoData` when there is no driver or
    GPU."""
    rec = RecordingNvml(api)
    sampler = NvmlSampler(lambda: rec)
    try:
        snap = sampler.sample()
        deadline = time.monotonic() + xid_seconds
        watched = any(r.watched for r in snap.xid_registrations)
        while (left := deadline - time.monotonic()) > 0:
            if not watched:  # nothing to wait on: just keep the promised time
                time.sleep(left)
                break
            sampler.poll_xid(max(1, min(1000, int(left * 1000))))
    finally:
        sampler.close()
    facts: dict[str, JsonValue] = {
        "driver": snap.driver_version,
        "nvml": snap.nvml_version,
        "gpus": [g.name for g in snap.gpus],
    }
    facts.update(host or {})
    return rec.recording(facts), snap


def load(path: str | Path) -> dict[str, JsonValue]:
    """Read a recording file (raises OSError, RecordingError)."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecordingError(f"{path}: not a {FORMAT} recording")
    return data


def dumps(recording: Mapping[str, JsonValue]) -> str:
    """Stable text for a recording (sorted keys, one call per line)."""
    return json.dumps(recording, indent=1, sort_keys=True) + "\n"


def replay_sampler(
    *,
    recording: str,
    watch_xid: bool = True,
    link_error_rotation: int = 18,
    slow_error_rotation: int = 72,
) -> NvmlSampler:
    """An NVML sampler replaying the recording file ``recording``: what an isolated child
    runs in benchmarks and tests without a GPU (``agent.nvml.record:replay_sampler``)."""
    data = load(recording)
    return NvmlSampler(
        lambda: ReplayNvml(data),
        watch_xid=watch_xid,
        link_error_rotation=link_error_rotation,
        slow_error_rotation=slow_error_rotation,
    )


# -- recording in a child process (``fabricscope snapshot``) ---------------------------------


@dataclass(frozen=True, slots=True)
class RecordedPass:
    """What :class:`RecordingSampler` answers: the pass's snapshot (None when NVML said there
    is no driver or GPU: ``nodata`` says so), and the recording so far as the text
    :func:`dumps` writes (empty before the first call), with its number of calls."""

    snapshot: NvmlSnapshot | None
    recording: str
    calls: int
    nodata: str | None = None
    issues: tuple[ReadIssue, ...] = ()


class RecordingSampler:
    """The live library sampled through a :class:`RecordingNvml`, every answer recorded: run
    in a child process (``agent.nvml.record:recording_sampler``) so that a crash inside the
    library while ``fabricscope snapshot`` records costs the NVML recording, not the sysfs
    archive. ``close()`` shuts NVML down."""

    name = "nvml"

    def __init__(self, inner: Callable[[], NvmlApi] | None = None) -> None:
        self._recorder = RecordingNvml((inner or LiveNvml)())
        self._sampler = NvmlSampler(lambda: self._recorder, watch_xid=False)

    def sample(self) -> RecordedPass:
        snap: NvmlSnapshot | None = None
        nodata: str | None = None
        try:
            snap = self._sampler.sample()
        except NoData as exc:  # "no driver" is an answer worth recording too
            nodata = str(exc)
        calls = len(self._recorder.calls)
        text = dumps(self._recorder.recording()) if calls else ""
        return RecordedPass(snap, text, calls, nodata)

    def close(self) -> None:
        self._sampler.close()


def recording_sampler() -> RecordingSampler:
    """The child process's factory (:class:`~agent.core.isolation.ChildSpec`)."""
    return RecordingSampler()


class ChildRecording:
    """The parent's side of :class:`RecordingSampler`: a sampler named ``nvml`` whose passes
    run in a supervised child (:class:`~agent.core.isolation.IsolatedSampler`); it returns the
    snapshot and keeps the latest ``recording`` text and its ``calls``. A crash or hang in
    the library fails the pass (``SamplerFailure``) and leaves the last recording kept."""

    name = "nvml"

    def __init__(self, timeout_seconds: float, child: IsolatedSampler | None = None) -> None:
        self._child = child or IsolatedSampler(
            "nvml",
            ChildSpec("agent.nvml.record:recording_sampler"),
            timeout_seconds=timeout_seconds,
            one_shot=True,
        )
        self.recording = ""
        self.calls = 0

    def call_deadline_seconds(self) -> float:
        return self._child.call_deadline_seconds()

    def sample(self) -> NvmlSnapshot:
        got = expect(self._child.sample(), RecordedPass)
        self.recording, self.calls = got.recording, got.calls
        if got.snapshot is None:
            raise NoData(got.nodata or "no NVML answer")
        return got.snapshot

    def close(self) -> None:
        self._child.close()
