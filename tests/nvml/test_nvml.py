"""The NVML sampler, its adapter, findings, topology join and rendering, replayed from
recordings (tests/nvml/test_nvml_fixtures.py) rather than mocked calls."""

from __future__ import annotations

import copy
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pynvml
import pytest

from agent.core.errors import NoData
from agent.core.findings import Finding
from agent.core.sysfs import ReadIssue
from agent.nvml.api import (
    NVML_ERROR_NAMES,
    LiveNvml,
    NvmlAnswerError,
    NvmlApi,
    NvmlCallError,
    XidEvent,
    error_name,
)
from agent.nvml.findings import findings
from agent.nvml.record import RecordingError, RecordingNvml, ReplayNvml, load
from agent.nvml.sampler import NvmlSampler, normalize_pci_bus_id
from agent.nvml.snapshot import NvLink, NvLinkErrorCounts, NvmlGpu, NvmlSnapshot, XidCount
from agent.nvml.topology import nvlink_matrix
from exporter.metrics import nvml as metrics
from exporter.metrics.spec import Detail, Families
from tests.nvml.mig_transcripts import transcript_recording
from tests.nvml.test_nvml_fixtures import (
    Recording,
    RecordingBuilder,
    h200x2_recording,
    with_call_error,
    with_field_values,
    with_gpu_lost,
    with_link_down,
    with_nvlink_errors,
    with_pcie_width,
    with_row_remap_failure,
    with_xid,
)

Samples = dict[tuple[str, tuple[str, ...]], float]


@pytest.fixture
def recorded_nvml() -> Recording:
    """A fresh copy of the H200 x2 recording (or its stand-in) for each test to edit."""
    return h200x2_recording()


@pytest.fixture(params=["per-call", "batched"])
def either_path(request: pytest.FixtureRequest) -> Recording:
    """The H200 x2 recording as recorded (its NVML answers through the per-call path: it
    holds no answers for the batched fields) and with the batched fields answering, as on
    a node whose driver offers them (tests/fixtures/nvml/README.md)."""
    rec = h200x2_recording()
    return rec if request.param == "per-call" else with_field_values(rec)


@pytest.fixture
def replay_sampler() -> Iterator[list[NvmlSampler]]:
    """Collects the samplers a test builds and closes them (frees their XID event sets)."""
    made: list[NvmlSampler] = []
    yield made
    for s in made:
        s.close()


def sample(rec: Recording, made: list[NvmlSampler]) -> NvmlSnapshot:
    sampler = NvmlSampler(lambda: ReplayNvml(rec))
    made.append(sampler)
    return sampler.sample()


def rendered(snap: NvmlSnapshot, detail: Detail = "full") -> Samples:
    out = Families(detail)
    metrics.render(snap, out)
    return {
        (spec.name, labels): value for spec, samples in out.items() for labels, value in samples
    }


def kinds(found: list[Finding]) -> list[tuple[str, str]]:
    return [(f.kind, f.subject) for f in found]


# -- the adapter --------------------------------------------------------------------------


def test_error_names_are_pynvmls() -> None:
    consts = {
        name.removeprefix("NVML_ERROR_"): getattr(pynvml, name)
        for name in dir(pynvml)
        if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
    }
    assert len(consts) > 25
    for name, code in consts.items():
        assert error_name(code) == name
    assert set(NVML_ERROR_NAMES.values()) <= set(consts)
    assert error_name(4242) == "CODE_4242"


def fake_pynvml(**functions: Callable[..., object]) -> types.ModuleType:
    """A module standing in for pynvml: pynvml's real error classes and structures, the
    given functions, and device handles that are the index itself."""
    mod = types.ModuleType("fake_pynvml")
    mod.NVMLError = pynvml.NVMLError  # type: ignore[attr-defined]
    mod.NVML_NVLINK_MAX_LINKS = 18  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    for name, fn in functions.items():
        setattr(mod, name, fn)
    return mod


def raising(code: int) -> Callable[..., object]:
    def fn(*args: object) -> object:
        raise pynvml.NVMLError(code)

    return fn


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (pynvml.NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST"),
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "NO_PERMISSION"),
        (pynvml.NVML_ERROR_TIMEOUT, "TIMEOUT"),
        (pynvml.NVML_ERROR_UNKNOWN, "UNKNOWN"),
    ],
)
def test_live_adapter_maps_pynvml_errors(code: int, name: str) -> None:
    api = LiveNvml(fake_pynvml(nvmlDeviceGetUUID=raising(code)))
    with pytest.raises(NvmlCallError) as info:
        api.uuid(0)
    assert (info.value.call, info.value.code, info.value.name) == ("nvmlDeviceGetUUID", code, name)


def test_live_adapter_names_a_failed_handle_after_the_call() -> None:
    mod = fake_pynvml(nvmlDeviceGetUUID=lambda h: "GPU-x")
    mod.nvmlDeviceGetHandleByIndex = raising(pynvml.NVML_ERROR_GPU_IS_LOST)  # type: ignore[attr-defined]
    with pytest.raises(NvmlCallError) as info:
        LiveNvml(mod).uuid(1)
    assert (info.value.call, info.value.name) == ("nvmlDeviceGetUUID", "GPU_IS_LOST")


def test_live_adapter_reports_a_function_pynvml_lacks() -> None:
    with pytest.raises(NvmlCallError) as info:
        LiveNvml(fake_pynvml()).pcie_replay_counter(0)
    assert (info.value.name, info.value.code) == ("FUNCTION_NOT_FOUND", 13)


def test_live_adapter_decodes_pynvml_structures() -> None:
    pci = pynvml.nvmlPciInfo_t()
    pci.busId = b"00000000:19:00.0"
    fields = (pynvml.c_nvmlFieldValue_t * 1)()
    fields[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    fields[0].value.ullVal = 26562
    unsupported = (pynvml.c_nvmlFieldValue_t * 1)()
    unsupported[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    event = pynvml.c_nvmlEventData_t()
    event.eventData = 79
    proc = types.SimpleNamespace(pid=4242, usedGpuMemory=2 << 30)
    idle = types.SimpleNamespace(pid=7, usedGpuMemory=None)
    api = LiveNvml(
        fake_pynvml(
            nvmlDeviceGetPciInfo=lambda h: pci,
            nvmlDeviceGetUUID=lambda h: "GPU-ee7954ec",
            nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: pci,
            nvmlDeviceGetFieldValues=lambda h, ids: fields if ids == [(164, 3)] else unsupported,
            nvmlDeviceGetRemappedRows=lambda h: (1, 0, 0, 1),
            nvmlDeviceGetComputeRunningProcesses=lambda h: [proc, idle],
            nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x41,
            nvmlEventSetCreate=lambda: "set",
            nvmlEventSetWait_v2=lambda s, ms: event,
            nvmlDeviceGetIndex=lambda h: 1,
        )
    )
    assert api.pci_bus_id(0) == "00000000:19:00.0"
    assert api.nvlink_remote_pci_bus_id(0, 3) == "00000000:19:00.0"
    assert api.uuid(0) == "GPU-ee7954ec"
    assert api.field_value(0, 164, 3) == 26562
    with pytest.raises(NvmlCallError) as info:
        api.field_value(0, 90, 0)
    assert (info.value.call, info.value.name) == ("nvmlDeviceGetFieldValues", "NOT_SUPPORTED")
    assert api.remapped_rows(0) == (1, 0, 0, 1)
    assert api.compute_processes(0) == ((4242, 2 << 30), (7, None))
    # pynvml without nvmlDeviceGetCurrentClocksEventReasons: the older name, same bits
    assert api.clocks_event_reasons(0) == 0x41
    api.xid_open()
    assert api.xid_wait(1000) == XidEvent(1, 79)


def test_live_adapter_batches_field_values_in_one_call() -> None:
    asked: list[object] = []
    fields = (pynvml.c_nvmlFieldValue_t * 3)()
    fields[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    fields[0].value.ullVal = 7
    fields[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    fields[2].valueType = pynvml.NVML_VALUE_TYPE_DOUBLE
    fields[2].value.dVal = 2.6
    lost = pynvml.NVML_ERROR_GPU_IS_LOST

    def get_fields(handle: object, ids: object) -> object:
        asked.append(ids)
        if handle == 1:
            raise pynvml.NVMLError(lost)
        return fields

    api = LiveNvml(fake_pynvml(nvmlDeviceGetFieldValues=get_fields))
    answers = api.field_values(0, [(161, 3), (162, 3), (94, 0)])
    assert asked == [[(161, 3), (162, 3), (94, 0)]]  # one C call for all three
    assert answers[0] == 7 and answers[2] == 3
    assert isinstance(answers[1], NvmlCallError)
    assert (answers[1].call, answers[1].name) == ("nvmlDeviceGetFieldValues", "NOT_SUPPORTED")
    assert api.field_values(0, []) == ()
    assert len(asked) == 1  # nothing asked, no call
    with pytest.raises(NvmlCallError, match="GPU_IS_LOST"):  # an error of the whole call
        api.field_values(1, [(161, 0)])
    with pytest.raises(NvmlCallError) as info:
        LiveNvml(fake_pynvml()).field_values(0, [(161, 0)])
    assert info.value.name == "FUNCTION_NOT_FOUND"


def test_sampler_settings_must_be_positive() -> None:
    for setting in ("link_error_rotation", "slow_error_rotation", "static_refresh_passes"):
        with pytest.raises(ValueError, match=setting):
            NvmlSampler(**{setting: 0})  # type: ignore[arg-type]


def test_nodata_when_the_nvml_library_cannot_load(monkeypatch: pytest.MonkeyPatch) -> None:
    # pynvml's own loader, with libnvidia-ml.so.1 absent (as on this CI machine; forced so
    # the test means the same on a GPU machine): nvmlInit raises NVMLError_LibraryNotFound
    def no_library(name: str) -> object:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    sampler = NvmlSampler()
    with pytest.raises(NoData, match="LIBRARY_NOT_FOUND"):
        sampler.sample()
    with pytest.raises(NoData):  # and again on the next pass: nothing was cached
        sampler.sample()


def test_nodata_without_driver_but_other_init_errors_raise() -> None:
    b = RecordingBuilder()
    b.err("nvmlInit", name="DRIVER_NOT_LOADED")
    with pytest.raises(NoData):
        NvmlSampler(lambda: ReplayNvml(b.build())).sample()
    b.err("nvmlInit", name="NO_PERMISSION")
    with pytest.raises(NvmlCallError, match="NO_PERMISSION"):
        NvmlSampler(lambda: ReplayNvml(b.build())).sample()


def test_nodata_when_nvml_sees_no_gpu() -> None:
    b = RecordingBuilder()
    b.ok("nvmlInit")
    b.ok("nvmlSystemGetDriverVersion", value="580.159.04")
    b.ok("nvmlSystemGetNVMLVersion", value="13.580")
    b.ok("nvmlDeviceGetCount", value=0)
    with pytest.raises(NoData, match="no GPU"):
        NvmlSampler(lambda: ReplayNvml(b.build())).sample()


def test_replay_is_strict_and_checks_the_format(recorded_nvml: Recording) -> None:
    api = ReplayNvml(recorded_nvml)
    with pytest.raises(LookupError, match=r"nvmlDeviceGetUUID\(9\)"):
        api.uuid(9)
    assert isinstance(ReplayNvml(recorded_nvml, strict=False), ReplayNvml)
    with pytest.raises(NvmlCallError, match="NOT_SUPPORTED"):
        ReplayNvml(recorded_nvml, strict=False).uuid(9)
    with pytest.raises(RecordingError):
        ReplayNvml({**recorded_nvml, "format": "something-else/1"})
    bad = RecordingBuilder()
    bad.ok("nvmlDeviceGetCount", value="two")
    with pytest.raises(NvmlAnswerError, match="integer"):
        ReplayNvml(bad.build()).device_count()


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:19:00.0", "0000:19:00.0"),
        ("00000000:9B:00.0", "0000:9b:00.0"),
        ("00000008:01:00.0", "0008:01:00.0"),  # GB200
        ("00010000:01:00.0", "10000:01:00.0"),  # a VMD domain
        ("0000:00:06.0", "0000:00:06.0"),
    ],
)
def test_normalize_pci_bus_id(nvml: str, sysfs: str) -> None:
    assert normalize_pci_bus_id(nvml) == sysfs


def test_normalize_pci_bus_id_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a PCI bus id"):
        normalize_pci_bus_id("GPU-00000000")


# -- the recorded node ---------------------------------------------------------------


def test_recorded_node_replays_its_documented_facts(
    either_path: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    snap = sample(either_path, replay_sampler)
    assert snap.driver_version == "580.159.04"
    assert [(g.index, g.name, g.pci_bus_id, g.lost) for g in snap.gpus] == [
        (0, "NVIDIA H200", "0000:00:06.0", False),
        (1, "NVIDIA H200", "0000:00:07.0", False),
    ]
    for gpu in snap.gpus:
        assert (gpu.pcie.current_generation, gpu.pcie.max_generation) == (5, 5)
        assert (gpu.pcie.current_width, gpu.pcie.max_width) == (16, 16)
        assert [link.link for link in gpu.nvlinks] == list(range(18))
        assert all(link.up for link in gpu.nvlinks)
        for link in gpu.nvlinks:
            assert (link.errors.replay, link.errors.recovery, link.errors.crc_flit) == (0, 0, 0)
    assert snap.issues == ()
    assert findings(snap) == []
    assert nvlink_matrix(snap) == {(0, 1): 18, (1, 0): 18}
    assert snap.gpus[1].pcie.replays == 1
    # crc_data (1-25) and ecc_data (2-39) are non-zero on every link of this healthy node
    errors = [link.errors for g in snap.gpus for link in g.nvlinks]
    assert all(e.crc_data and e.ecc_data for e in errors)
    assert (min(e.crc_data or 0 for e in errors), max(e.crc_data or 0 for e in errors)) == (1, 25)


def test_later_passes_give_the_same_snapshot(
    either_path: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    """Through a whole slow rotation and two static refreshes: counters not read in a pass
    carry their last value, so a node whose answers do not change looks the same."""
    sampler = NvmlSampler(
        lambda: ReplayNvml(either_path),
        static_refresh_passes=4,
        link_error_rotation=3,
        slow_error_rotation=9,
    )
    replay_sampler.append(sampler)
    first = sampler.sample()
    for _ in range(2 * sampler.slow_error_rotation):
        assert sampler.sample() == first


def test_not_supported_leaves_the_series_absent_without_an_issue(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    rec = with_call_error(recorded_nvml, "nvmlDeviceGetPcieReplayCounter(0)", "NOT_SUPPORTED")
    snap = sample(rec, replay_sampler)
    assert snap.gpus[0].pcie.replays is None
    assert snap.gpus[1].pcie.replays is not None
    assert snap.issues == ()
    out = rendered(snap)
    assert ("fabricscope_gpu_pcie_replays_total", ("0",)) not in out
    assert ("fabricscope_gpu_pcie_replays_total", ("1",)) in out
    assert out[("fabricscope_gpu_pcie_current_link_width", ("0",))] == 16


@pytest.mark.parametrize(("error", "reason"), [("UNKNOWN", "io"), ("NO_PERMISSION", "permission")])
def test_another_error_costs_one_series_and_records_an_issue(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler], error: str, reason: str
) -> None:
    rec = with_call_error(recorded_nvml, "nvmlDeviceGetPcieReplayCounter(0)", error)
    snap = sample(rec, replay_sampler)
    assert snap.issues == (
        ReadIssue(
            "nvml/0/nvmlDeviceGetPcieReplayCounter",
            reason,
            f"nvmlDeviceGetPcieReplayCounter: NVML_ERROR_{error} "
            f"({4 if error == 'NO_PERMISSION' else 999})",
        ),
    )
    assert snap.gpus[0].pcie.replays is None
    assert snap.gpus[0].pcie.current_width == 16  # the rest of the GPU carries on
    assert len(snap.gpus[0].nvlinks) == 18


def test_a_link_error_issue_names_the_link(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    rec = with_call_error(recorded_nvml, "nvmlDeviceGetNvLinkState(1,5)", "UNKNOWN")
    snap = sample(rec, replay_sampler)
    assert [i.path for i in snap.issues] == ["nvml/1/nvmlDeviceGetNvLinkState/link5"]
    assert [link.link for link in snap.gpus[1].nvlinks] == [n for n in range(18) if n != 5]


def test_a_malformed_answer_is_a_parse_issue(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    calls = recorded_nvml["calls"]
    assert isinstance(calls, dict)
    calls["nvmlDeviceGetPciInfo(0)"] = {"value": "GPU-not-a-bus-id"}
    calls["nvmlDeviceGetMaxPcieLinkWidth(1)"] = {"value": "16x"}
    snap = sample(recorded_nvml, replay_sampler)
    assert [(i.path, i.reason) for i in snap.issues] == [
        ("nvml/0/pci_bus_id", "parse"),
        ("nvml/1/nvmlDeviceGetMaxPcieLinkWidth", "parse"),
    ]
    assert (snap.gpus[0].pci_bus_id, snap.gpus[0].name) == (None, "NVIDIA H200")
    assert (snap.gpus[1].pcie.max_width, snap.gpus[1].pcie.current_width) == (None, 16)


# -- each fault: exactly its finding and its metric ----------------------------------


def test_nvlink_crc_errors(either_path: Recording, replay_sampler: list[NvmlSampler]) -> None:
    snap = sample(with_nvlink_errors(either_path, 0, 3, crc_flit=7, replay=2), replay_sampler)
    assert kinds(findings(snap)) == [("nvlink_errors", "gpu0/link3")]
    assert "crc_flit=7" in findings(snap)[0].detail
    out = rendered(snap)
    assert out[("fabricscope_nvlink_errors_total", ("0", "3", "crc_flit"))] == 7
    assert out[("fabricscope_nvlink_errors_total", ("0", "3", "replay"))] == 2
    assert out[("fabricscope_nvlink_errors_total", ("0", "4", "crc_flit"))] == 0


def test_nvlink_down(either_path: Recording, replay_sampler: list[NvmlSampler]) -> None:
    snap = sample(with_link_down(either_path, 0, 3), replay_sampler)
    assert kinds(findings(snap)) == [("nvlink_down", "gpu0/link3")]
    out = rendered(snap)
    assert out[("fabricscope_nvlink_up", ("0", "3"))] == 0
    assert out[("fabricscope_nvlink_up", ("0", "4"))] == 1
    assert nvlink_matrix(snap) == {(0, 1): 17, (1, 0): 17}


def test_gpu_lost_isolates(either_path: Recording, replay_sampler: list[NvmlSampler]) -> None:
    healthy = sample(either_path, replay_sampler)
    snap = sample(with_gpu_lost(either_path, 1), replay_sampler)
    assert kinds(findings(snap)) == [("gpu_lost", "gpu1")]
    assert snap.gpus[0] == healthy.gpus[0]  # the other GPU fully sampled
    assert snap.gpus[1] == NvmlGpu(index=1, lost=True)
    assert snap.issues == ()
    out = rendered(snap)
    assert out[("fabricscope_gpu_lost", ("1",))] == 1
    assert out[("fabricscope_gpu_lost", ("0",))] == 0
    assert out[("fabricscope_gpu_xid_watched", ("1",))] == 0
    assert out[("fabricscope_gpu_xid_watched", ("0",))] == 1
    assert not any(
        labels[0] == "1" for name, labels in out if name.startswith("fabricscope_nvlink")
    )


def test_xid_event(recorded_nvml: Recording, replay_sampler: list[NvmlSampler]) -> None:
    sampler = NvmlSampler(lambda: ReplayNvml(with_xid(recorded_nvml, 0, 79)))
    replay_sampler.append(sampler)
    snap = sampler.sample()  # the pass collects the event queued before it ended
    assert kinds(findings(snap)) == [("xid", "gpu0/xid79")]
    assert rendered(snap)[("fabricscope_gpu_xid_errors_total", ("0", "79"))] == 1


def test_pcie_link_degraded(either_path: Recording, replay_sampler: list[NvmlSampler]) -> None:
    snap = sample(with_pcie_width(either_path, 0, 8), replay_sampler)
    assert kinds(findings(snap)) == [("pcie_link_degraded", "gpu0")]
    assert rendered(snap)[("fabricscope_gpu_pcie_current_link_width", ("0",))] == 8


def test_row_remap_failure(either_path: Recording, replay_sampler: list[NvmlSampler]) -> None:
    snap = sample(with_row_remap_failure(either_path, 1), replay_sampler)
    assert kinds(findings(snap)) == [("row_remap_failure", "gpu1")]
    out = rendered(snap)
    assert out[("fabricscope_gpu_row_remap_failure", ("1",))] == 1
    assert out[("fabricscope_gpu_row_remap_failure", ("0",))] == 0


def test_xid_counters_only_grow_across_passes(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    api = ReplayNvml(recorded_nvml)
    sampler = NvmlSampler(lambda: api)
    replay_sampler.append(sampler)
    assert sampler.sample().xid_errors == ()
    api.feed_xid(0, 79)
    assert sampler.sample().xid_errors == (XidCount(0, 79, 1),)
    api.feed_xid(0, 48)
    api.feed_xid(0, 79)
    third = sampler.sample()
    assert third.xid_errors == (XidCount(0, 48, 1), XidCount(0, 79, 2))
    assert sampler.sample().xid_errors == third.xid_errors  # a pass without events: unchanged


class _OneThread:
    """Wraps an API and records which threads call it, and whether two calls overlap."""

    def __init__(self, inner: ReplayNvml) -> None:
        self.inner = inner
        self.threads: set[int] = set()
        self.calls: list[str] = []
        self._inside = threading.Lock()
        self.overlapped = False

    def __getattr__(self, name: str) -> object:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def call(*args: object) -> object:
            if not self._inside.acquire(blocking=False):
                self.overlapped = True
                self._inside.acquire()
            try:
                self.threads.add(threading.get_ident())
                self.calls.append(name)
                return attr(*args)
            finally:
                self._inside.release()

        return call


def test_every_nvml_call_is_made_on_the_passing_thread(recorded_nvml: Recording) -> None:
    """No XID thread: the event set is opened, polled and freed by the thread running the
    passes (issue 13: NVML entered from two threads corrupted a real node's heap)."""
    api = _OneThread(ReplayNvml(recorded_nvml))
    before = set(threading.enumerate())
    sampler = NvmlSampler(lambda: api)  # type: ignore[arg-type,return-value]
    sampler.sample()
    api.inner.feed_xid(1, 31)
    assert sampler.sample().xid_errors == (XidCount(1, 31, 1),)
    # no thread started (one left by an earlier test may have ended meanwhile: a subset, not ==)
    assert set(threading.enumerate()) <= before
    sampler.close()
    assert api.threads == {threading.get_ident()}
    assert not api.overlapped
    assert api.calls.count("xid_wait") == 3  # pass 1: TIMEOUT; pass 2: the event, TIMEOUT
    assert api.calls[-2:] == ["xid_close", "shutdown"]


def test_xid_registration_refused_is_noted_not_fatal(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    rec = with_call_error(recorded_nvml, "nvmlDeviceRegisterEvents(1)", "NOT_SUPPORTED")
    snap = sample(rec, replay_sampler)
    assert [(r.gpu, r.watched, r.error) for r in snap.xid_registrations] == [
        (0, True, None),
        (1, False, "NOT_SUPPORTED"),
    ]
    assert len(snap.gpus) == 2
    assert snap.issues == ()


class _HangOnce:
    """Wraps an API: the first ``pcie_replay_counter(0)`` blocks until released."""

    def __init__(self, inner: ReplayNvml) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def pcie_replay_counter(self, gpu: int) -> int:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait(10)
        return self.inner.pcie_replay_counter(gpu)


def test_a_hung_call_blocks_no_later_pass(recorded_nvml: Recording) -> None:
    api = _HangOnce(ReplayNvml(recorded_nvml))
    sampler = NvmlSampler(lambda: api, watch_xid=False)  # type: ignore[arg-type,return-value]
    hung = threading.Thread(target=sampler.sample, daemon=True)
    hung.start()
    assert api.entered.wait(5)
    t0 = time.monotonic()
    snap = sampler.sample()  # what the runner's next pass does once the hung one returns
    assert time.monotonic() - t0 < 5
    assert len(snap.gpus) == 2
    api.release.set()
    hung.join(5)
    assert not hung.is_alive()


# -- what a pass reads: static facts cached, error counters rotated ---------------------


class Passes:
    """A sampler over a counting recorder around a strict replay of ``rec``. ``calls`` is
    the replayed recording's answers (edit it between passes: the node changes); each
    :meth:`run` returns the pass's snapshot, its NVML calls by function and the answer
    keys it asked (a batched field-values call asks one key per field)."""

    def __init__(self, rec: Recording, made: list[NvmlSampler], **settings: int) -> None:
        rec = copy.deepcopy(rec)  # edited in place; the caller's stays as it was
        calls = rec["calls"]
        assert isinstance(calls, dict)
        self.calls = calls
        self.api = RecordingNvml(ReplayNvml(rec))
        # the mechanism is tested with short rotations (3 and 9 passes) so a whole slow
        # rotation takes few passes; production defaults are longer (6 and 36)
        settings = {"link_error_rotation": 3, "slow_error_rotation": 9} | settings
        self.sampler = NvmlSampler(lambda: self.api, watch_xid=False, **settings)
        made.append(self.sampler)

    def run(self) -> tuple[NvmlSnapshot, Counter[str], set[str]]:
        self.api.counts.clear()
        self.api.calls.clear()
        snap = self.sampler.sample()
        return snap, Counter(self.api.counts), set(self.api.calls)

    def edit(self, edited: Recording) -> None:
        """The node now answers as ``edited`` does."""
        new = edited["calls"]
        assert isinstance(new, dict)
        self.calls.update(new)


def asked(keys: set[str], call: str, gpu: int, *, arg: int | None = None) -> set[int]:
    """The link (or scope) argument of every ``call(gpu,link,...)`` key asked; with ``arg``,
    only keys whose last argument is ``arg`` (a counter id or a field id)."""
    out = set()
    for key in keys:
        name, _, args = key.partition("(")
        if name != call:
            continue
        values = [int(a) for a in args.rstrip(")").split(",")]
        if values[0] != gpu:
            continue
        if call == "nvmlDeviceGetFieldValues":  # (gpu, field, scope): arg is the field
            if arg is None or values[1] == arg:
                out.add(values[2])
        elif arg is None or values[-1] == arg:
            out.add(values[1])
    return out


#: per GPU and pass: the per-call path of the H200 recording (no field answers recorded)
PER_CALL_FIRST = {
    "nvmlDeviceGetPciInfo": 1,
    "nvmlDeviceGetUUID": 1,
    "nvmlDeviceGetName": 1,
    "nvmlDeviceGetSerial": 1,
    "nvmlDeviceGetVbiosVersion": 1,
    "nvmlDeviceGetMaxPcieLinkGeneration": 1,
    "nvmlDeviceGetMaxPcieLinkWidth": 1,
    "nvmlDeviceGetNvLinkState": 36,  # links 0-35 probed once; 18-35 INVALID_ARGUMENT
    "nvmlDeviceGetFieldValues": 1,  # all of it NOT_SUPPORTED: learned, not asked again
    "nvmlDeviceGetPcieReplayCounter": 1,
    "nvmlDeviceGetRemappedRows": 1,
    "nvmlDeviceGetTotalEccErrors": 2,
    "nvmlDeviceGetCurrPcieLinkGeneration": 1,
    "nvmlDeviceGetCurrPcieLinkWidth": 1,
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlDeviceGetComputeRunningProcesses": 1,
    "nvmlDeviceGetNvLinkVersion": 18,
    "nvmlDeviceGetNvLinkRemotePciInfo": 18,
    "nvmlDeviceGetNvLinkRemoteDeviceType": 18,
    "nvmlDeviceGetNvLinkErrorCounter": 90,  # 18 links x 5 counters: the first pass reads all
    "nvmlDeviceGetMigMode": 1,  # every pass (the recording has none: a GPU without MIG)
    "nvmlDeviceGetGpuFabricInfoV": 1,  # the first pass (the recording predates it: not offered)
}
PER_CALL_STEADY = {
    "nvmlDeviceGetNvLinkState": 18,
    "nvmlDeviceGetPcieReplayCounter": 1,
    "nvmlDeviceGetRemappedRows": 1,
    "nvmlDeviceGetTotalEccErrors": 2,
    "nvmlDeviceGetCurrPcieLinkGeneration": 1,
    "nvmlDeviceGetCurrPcieLinkWidth": 1,
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlDeviceGetComputeRunningProcesses": 1,
    "nvmlDeviceGetNvLinkErrorCounter": 6 * 3 + 2 * 2,  # 18/3 links x 3, 18/9 links x 2
    "nvmlDeviceGetMigMode": 1,
}
BATCHED_FIRST = {
    k: v
    for k, v in PER_CALL_FIRST.items()
    if k
    not in (
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetTotalEccErrors",
    )
} | {"nvmlDeviceGetNvLinkErrorCounter": 18 * 2}  # crc_data, ecc_data: no field carries them
BATCHED_STEADY = {
    "nvmlDeviceGetNvLinkState": 18,
    "nvmlDeviceGetFieldValues": 1,  # 7 GPU-level fields + 6 links x 3 counters
    "nvmlDeviceGetCurrPcieLinkGeneration": 1,
    "nvmlDeviceGetCurrPcieLinkWidth": 1,
    "nvmlDeviceGetCurrentClocksEventReasons": 1,
    "nvmlDeviceGetComputeRunningProcesses": 1,
    "nvmlDeviceGetNvLinkErrorCounter": 2 * 2,
    "nvmlDeviceGetMigMode": 1,
}
NODE_FIRST = {
    "nvmlInit": 1,
    "nvmlSystemGetDriverVersion": 1,
    "nvmlSystemGetNVMLVersion": 1,
    "nvmlDeviceGetCount": 1,
    "NVML_NVLINK_MAX_LINKS": 1,
}


def per_node(per_gpu: dict[str, int], node: dict[str, int]) -> Counter[str]:
    return Counter({k: 2 * v for k, v in per_gpu.items()}) + Counter(node)


@pytest.mark.parametrize(
    ("variant", "first", "steady", "fields_steady"),
    [
        ("per-call", PER_CALL_FIRST, PER_CALL_STEADY, 0),
        ("batched", BATCHED_FIRST, BATCHED_STEADY, 2 * (7 + 6 * 3)),
    ],
)
def test_calls_per_pass_drop_after_the_first(
    replay_sampler: list[NvmlSampler],
    variant: str,
    first: dict[str, int],
    steady: dict[str, int],
    fields_steady: int,
) -> None:
    """Before caching and rotation every pass made 430 calls on this node (the recording's
    answers, less init, shutdown and XID registration). Now the first pass reads everything
    (per-call: 401 calls; batched: 285) and later passes only what can change (99; 57, plus
    one fabric call per GPU whose turn it is), MIG mode included (one call per GPU and pass);
    the fabric registration is read for GPU ``g`` on the passes where ``(pass - g) % 2 == 0``
    (the recording answers no NVLink traffic field: that rotation is tested on the 4x H100
    recording below)."""
    rec = h200x2_recording()
    run = Passes(rec if variant == "per-call" else with_field_values(rec), replay_sampler)
    _, calls, _ = run.run()
    assert calls == per_node(first, NODE_FIRST)
    assert sum(calls.values()) == (401 if variant == "per-call" else 285)
    for k in range(1, 2 * run.sampler.slow_error_rotation + 1):
        run.api.fields_read.clear()
        _, calls, _ = run.run()
        turns = sum((k - gpu) % run.sampler.fabric_rotation == 0 for gpu in (0, 1))
        fabric = Counter({"nvmlDeviceGetGpuFabricInfoV": turns})
        assert calls == per_node(steady, {"nvmlDeviceGetCount": 1}) + fabric
        assert sum(run.api.fields_read.values()) == fields_steady
        assert sum(calls.values()) == (99 if variant == "per-call" else 57) + turns


def test_rotation_reads_every_link_once_per_rotation(
    either_path: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    """Pass k reads replay/recovery/crc_flit of the links with link % 3 == k % 3 and
    crc_data/ecc_data of those with link % 9 == k % 9, on every GPU: within 3 (9) passes
    every link is read exactly once."""
    run = Passes(either_path, replay_sampler)
    run.run()  # the first pass reads every link
    batched = "nvmlDeviceGetFieldValues(0,161,0)" in run.calls
    fast_seen: Counter[tuple[int, int]] = Counter()
    slow_seen: Counter[tuple[int, int]] = Counter()
    for k in range(1, 10):
        _, _, keys = run.run()
        for gpu in (0, 1):
            if batched:
                fast = asked(keys, "nvmlDeviceGetFieldValues", gpu, arg=161)
            else:
                fast = asked(keys, "nvmlDeviceGetNvLinkErrorCounter", gpu, arg=0)
            slow = asked(keys, "nvmlDeviceGetNvLinkErrorCounter", gpu, arg=3)
            assert fast == {n for n in range(18) if n % 3 == k % 3}
            assert slow == {n for n in range(18) if n % 9 == k % 9}
            assert asked(keys, "nvmlDeviceGetNvLinkErrorCounter", gpu, arg=4) == slow
            fast_seen.update((gpu, n) for n in fast)
            slow_seen.update((gpu, n) for n in slow)
        if k == 3:
            assert fast_seen == Counter({(g, n): 1 for g in (0, 1) for n in range(18)})
    assert slow_seen == Counter({(g, n): 1 for g in (0, 1) for n in range(18)})


def test_a_counter_change_shows_within_its_rotation(
    either_path: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    run = Passes(either_path, replay_sampler)
    first, _, _ = run.run()
    crc_data = first.gpus[0].nvlinks[5].errors.crc_data
    assert crc_data is not None
    run.edit(with_nvlink_errors(either_path, 0, 5, crc_flit=7, crc_data=crc_data + 40))
    seen = []
    for _ in range(1, 10):
        snap, _, _ = run.run()
        errors = snap.gpus[0].nvlinks[5].errors
        seen.append((errors.crc_flit, errors.crc_data))
        assert (
            errors.link_errors == (kinds(findings(snap)) == [("nvlink_errors", "gpu0/link5")]) * 7
        )
    # link 5 is read on pass 2 (5 % 3), crc_data on pass 5 (5 % 9); carried forward between
    old, new = crc_data, crc_data + 40
    assert (
        seen
        == [(0, old), (7, old), (7, old), (7, old), (7, new), (7, new), (7, new)] + [(7, new)] * 2
    )


def test_a_link_changing_state_has_its_static_info_read_again(
    replay_sampler: list[NvmlSampler],
) -> None:
    rec = with_field_values(h200x2_recording())
    run = Passes(rec, replay_sampler)
    healthy, _, keys = run.run()
    statics = ("nvmlDeviceGetNvLinkVersion", "nvmlDeviceGetNvLinkRemotePciInfo")
    assert all(asked(keys, c, 0) == set(range(18)) for c in statics)
    _, _, keys = run.run()
    assert not any(asked(keys, c, g) for c in statics for g in (0, 1))  # cached
    assert asked(keys, "nvmlDeviceGetFieldValues", 0, arg=164) == set()

    run.edit(with_link_down(rec, 0, 3))
    down, _, keys = run.run()
    assert asked(keys, "nvmlDeviceGetNvLinkVersion", 0) == {3}
    assert asked(keys, "nvmlDeviceGetNvLinkRemotePciInfo", 0) == set()  # down: no far end
    link = down.gpus[0].nvlinks[3]
    assert (link.up, link.speed_bytes_per_second, link.remote_pci_bus_id) == (False, None, None)
    assert kinds(findings(down)) == [("nvlink_down", "gpu0/link3")]

    run.edit(rec)  # trained again
    back, _, keys = run.run()
    for call in (*statics, "nvmlDeviceGetNvLinkRemoteDeviceType"):
        assert asked(keys, call, 0) == {3}
        assert asked(keys, call, 1) == set()
    assert asked(keys, "nvmlDeviceGetFieldValues", 0, arg=164) == {3}
    assert back == healthy


def test_static_facts_are_read_again_every_static_refresh_passes(
    either_path: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    """GPU g on the passes >= N with pass % N == g % N (GPUs take turns); the node's driver
    and NVML versions on pass % N == 0. Nothing changes in between."""
    run = Passes(either_path, replay_sampler, static_refresh_passes=5)
    first, _, _ = run.run()
    uuids, probes, drivers = {}, {}, []
    for k in range(1, 13):
        snap, calls, keys = run.run()
        assert snap == first
        uuids[k] = {g for g in (0, 1) if f"nvmlDeviceGetUUID({g})" in keys}
        probes[k] = {g for g in (0, 1) if len(asked(keys, "nvmlDeviceGetNvLinkState", g)) == 36}
        if calls["nvmlSystemGetDriverVersion"]:
            drivers.append(k)
        # a refresh probes which links exist, but a link's version, speed and far end are
        # not asked again while its state is the same (they change only with it); the
        # counters carry on in rotation (they are no static fact)
        for g in (0, 1):
            assert asked(keys, "nvmlDeviceGetNvLinkRemotePciInfo", g) == set()
            assert asked(keys, "nvmlDeviceGetNvLinkVersion", g) == set()
            assert asked(keys, "nvmlDeviceGetFieldValues", g, arg=164) == set()
        for g in (0, 1):
            slow = asked(keys, "nvmlDeviceGetNvLinkErrorCounter", g, arg=3)
            assert slow == {n for n in range(18) if n % 9 == k % 9}
    refreshed = {5: {0}, 6: {1}, 10: {0}, 11: {1}}
    assert uuids == {k: refreshed.get(k, set()) for k in range(1, 13)}
    assert probes == uuids
    assert drivers == [5, 10]


def test_a_link_changing_state_on_a_refresh_pass_has_its_static_info_read_again(
    replay_sampler: list[NvmlSampler],
) -> None:
    """The refresh keeps a link's version, speed and far end only while its state is the
    one they were read in: a link down on the refresh pass itself loses its far end."""
    rec = with_field_values(h200x2_recording())
    run = Passes(rec, replay_sampler, static_refresh_passes=3)
    healthy, _, _ = run.run()
    run.run()
    run.run()
    run.edit(with_link_down(rec, 0, 3))
    down, _, keys = run.run()  # pass 3: GPU 0's refresh
    assert "nvmlDeviceGetUUID(0)" in keys
    assert asked(keys, "nvmlDeviceGetNvLinkVersion", 0) == {3}
    link = down.gpus[0].nvlinks[3]
    assert (link.up, link.speed_bytes_per_second, link.remote_pci_bus_id) == (False, None, None)
    run.edit(rec)
    back, _, keys = run.run()
    assert asked(keys, "nvmlDeviceGetNvLinkRemotePciInfo", 0) == {3}
    assert back == healthy


def test_a_static_fact_whose_read_failed_is_read_again_next_pass(
    replay_sampler: list[NvmlSampler],
) -> None:
    rec = h200x2_recording()
    run = Passes(with_call_error(rec, "nvmlDeviceGetUUID(0)", "UNKNOWN"), replay_sampler)
    for k in range(2):  # not cached absent for a refresh period: asked each pass, an issue
        snap, _, keys = run.run()
        assert snap.gpus[0].uuid is None
        assert [i.path for i in snap.issues] == ["nvml/0/nvmlDeviceGetUUID"]
        assert "nvmlDeviceGetUUID(0)" in keys
        assert ("nvmlDeviceGetUUID(1)" in keys) is (k == 0)  # GPU 1's is cached
    run.edit(rec)
    snap, _, _ = run.run()
    assert (snap.gpus[0].uuid, snap.issues) == ("GPU-fcb7ca97-bfcc-fefd-ace7-bc505d8b2d51", ())
    _, _, keys = run.run()
    assert "nvmlDeviceGetUUID(0)" not in keys  # cached now


def test_a_field_not_supported_falls_back_to_its_call_and_is_remembered(
    replay_sampler: list[NvmlSampler],
) -> None:
    base = with_field_values(h200x2_recording())
    rec = base
    for key in (
        "nvmlDeviceGetFieldValues(0,161,3)",  # replay of GPU 0 link 3
        "nvmlDeviceGetFieldValues(0,94,0)",  # PCIe replays of GPU 0
        "nvmlDeviceGetFieldValues(1,143,0)",  # one of GPU 1's four remapped-rows fields
    ):
        rec = with_call_error(rec, key, "NOT_SUPPORTED")
    expected = Passes(base, replay_sampler)
    run = Passes(rec, replay_sampler)
    for k in range(10):
        want, _, _ = expected.run()
        snap, _, keys = run.run()
        assert snap == want  # the same values, from the per-call answers
        assert snap.issues == ()
        assert ("nvmlDeviceGetPcieReplayCounter(0)" in keys) is True
        assert ("nvmlDeviceGetRemappedRows(1)" in keys) is True
        assert "nvmlDeviceGetPcieReplayCounter(1)" not in keys  # its field answers
        link3 = k % 3 == 0  # link 3's turn (and pass 0)
        assert ("nvmlDeviceGetNvLinkErrorCounter(0,3,0)" in keys) is link3
        assert "nvmlDeviceGetNvLinkErrorCounter(0,3,1)" not in keys  # recovery: field 162
        if k > 0:  # learned: the fields that said NOT_SUPPORTED are not asked again
            assert asked(keys, "nvmlDeviceGetFieldValues", 0, arg=161) == (
                {n for n in range(18) if n % 3 == k % 3} - {3}
            )
            assert "nvmlDeviceGetFieldValues(0,94,0)" not in keys
            assert asked(keys, "nvmlDeviceGetFieldValues", 1, arg=142) == set()
            assert "nvmlDeviceGetFieldValues(0,142,0)" in keys


class _NoFieldValues(ReplayNvml):
    """A binding without nvmlDeviceGetFieldValues: every batched call fails as a whole."""

    def field_values(
        self, gpu: int, fields: Sequence[tuple[int, int]]
    ) -> tuple[int | NvmlCallError, ...]:
        raise NvmlCallError("nvmlDeviceGetFieldValues", 13, "FUNCTION_NOT_FOUND")

    def field_value(self, gpu: int, field_id: int, scope_id: int) -> int:
        raise NvmlCallError("nvmlDeviceGetFieldValues", 13, "FUNCTION_NOT_FOUND")


def test_without_field_values_everything_comes_from_the_calls(
    replay_sampler: list[NvmlSampler],
) -> None:
    rec = with_field_values(h200x2_recording())
    expected = NvmlSampler(lambda: ReplayNvml(rec), watch_xid=False)
    api = RecordingNvml(_NoFieldValues(rec))
    sampler = NvmlSampler(lambda: api, watch_xid=False)
    replay_sampler += [expected, sampler]
    for k in range(4):
        api.counts.clear()
        want = expected.sample()
        snap = sampler.sample()
        # speed has no per-link call: NVML's answer is absent, as it was before batching
        assert snap.gpus[0].nvlinks[0].speed_bytes_per_second is None
        assert snap.gpus == tuple(
            NvmlGpu(**{**_fields(g), "nvlinks": tuple(_no_speed(n) for n in g.nvlinks)})
            for g in want.gpus
        )
        assert snap.issues == ()
        # pass 0: per GPU the batch, then speed through the older per-link fields (links
        # 0-11) and the all-links field; all of it learned or cached: none after
        assert api.counts["nvmlDeviceGetFieldValues"] == (2 * (1 + 12 + 1) if k == 0 else 0)


def _fields(gpu: NvmlGpu) -> dict[str, object]:
    return {name: getattr(gpu, name) for name in NvmlGpu.__dataclass_fields__}


def _no_speed(link: NvLink) -> NvLink:
    return NvLink(
        link.link,
        link.state,
        link.version,
        None,
        link.remote_pci_bus_id,
        link.remote_device_type,
        link.errors,
    )


def test_a_gpu_lost_mid_run_is_isolated_and_read_again_when_back(
    either_path: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    run = Passes(either_path, replay_sampler)
    healthy, _, _ = run.run()
    run.run()
    run.edit(with_gpu_lost(either_path, 1))
    for _ in range(2):
        snap, _, keys = run.run()
        assert snap.gpus[0] == healthy.gpus[0]  # the other GPU fully sampled
        was = healthy.gpus[1]
        # a lost GPU still names itself (gpu_info), nothing else
        assert snap.gpus[1] == NvmlGpu(
            index=1,
            lost=True,
            pci_bus_id=was.pci_bus_id,
            uuid=was.uuid,
            name=was.name,
            serial=was.serial,
            vbios_version=was.vbios_version,
        )
        assert kinds(findings(snap)) == [("gpu_lost", "gpu1")]
        assert snap.issues == ()
    run.edit(either_path)  # reset and back: everything of GPU 1 is read again
    snap, _, keys = run.run()
    assert snap == healthy
    assert "nvmlDeviceGetUUID(1)" in keys and "nvmlDeviceGetUUID(0)" not in keys
    assert asked(keys, "nvmlDeviceGetNvLinkErrorCounter", 1, arg=3) == set(range(18))
    assert asked(keys, "nvmlDeviceGetNvLinkErrorCounter", 0, arg=3) == {4, 13}  # pass 4


def test_a_failed_counter_read_is_absent_and_read_again_next_pass(
    replay_sampler: list[NvmlSampler],
) -> None:
    rec = h200x2_recording()
    calls = rec["calls"]
    assert isinstance(calls, dict)
    calls["nvmlDeviceGetFieldValues(0,42,0)"] = {"error": "NOT_SUPPORTED", "code": 3}  # L3 field
    healthy = Passes(copy.deepcopy(rec), replay_sampler).run()[0]
    run = Passes(
        with_call_error(rec, "nvmlDeviceGetNvLinkErrorCounter(0,3,3)", "UNKNOWN"), replay_sampler
    )
    for _ in range(2):
        snap, _, keys = run.run()
        assert snap.gpus[0].nvlinks[3].errors.crc_data is None
        assert [i.path for i in snap.issues] == [
            "nvml/0/nvmlDeviceGetNvLinkErrorCounter/link3/crc_data"
        ]
    run.edit(rec)
    snap, _, keys = run.run()  # pass 2: not link 3's turn, but its last read failed
    assert "nvmlDeviceGetNvLinkErrorCounter(0,3,3)" in keys
    assert snap == healthy


def test_a_hung_pass_returning_late_leaves_nothing_behind(
    replay_sampler: list[NvmlSampler],
) -> None:
    """The runner abandons a hung pass and starts the next; when the hung one returns, its
    (older) counter values must not replace the newer pass's, or a counter not read in the
    following pass would go backwards."""
    rec = h200x2_recording()
    calls = rec["calls"]
    assert isinstance(calls, dict)
    api = _HangOnce(ReplayNvml(rec))
    sampler = NvmlSampler(lambda: api, watch_xid=False)  # type: ignore[arg-type,return-value]
    replay_sampler.append(sampler)
    hung = threading.Thread(target=sampler.sample, daemon=True)
    hung.start()
    assert api.entered.wait(5)
    calls.update(with_nvlink_errors(rec, 0, 4, crc_flit=5)["calls"])  # type: ignore[arg-type]
    newer = sampler.sample()  # pass 1 (pass 0 hangs)
    assert newer.gpus[0].nvlinks[4].errors.crc_flit == 5
    calls.update(h200x2_recording()["calls"])  # type: ignore[arg-type]
    api.release.set()  # pass 0 now reads the counters (0) and returns
    hung.join(5)
    assert not hung.is_alive()
    later = sampler.sample()  # pass 2: link 4 is not read (4 % 3 != 2): carried from pass 1
    assert later.gpus[0].nvlinks[4].errors.crc_flit == 5


# -- topology ---------------------------------------------------------------------------


def _gpu(index: int, bus: str, links: list[tuple[bool, str | None, str | None]]) -> NvmlGpu:
    return NvmlGpu(
        index=index,
        pci_bus_id=bus,
        nvlinks=tuple(
            NvLink(n, 1 if up else 0, remote_pci_bus_id=rb, remote_device_type=rt)
            for n, (up, rb, rt) in enumerate(links)
        ),
    )


def test_nvlink_matrix_counts_direct_links_per_pair() -> None:
    a, b, c = "0000:01:00.0", "0000:02:00.0", "0000:03:00.0"
    snap = NvmlSnapshot(
        gpus=(
            _gpu(0, a, [(True, b, "GPU"), (True, b, "GPU"), (True, c, None), (False, c, "GPU")]),
            _gpu(1, b, [(True, a, "GPU"), (True, a, "GPU")]),
            # GPU 2 could not name its far ends: GPU 0's end still counts
            _gpu(2, c, [(True, None, None)]),
        )
    )
    assert nvlink_matrix(snap) == {(0, 1): 2, (0, 2): 1, (1, 0): 2, (2, 0): 1}


def test_nvlink_matrix_through_nvswitches_is_the_smaller_side() -> None:
    sw = "0000:ff:00.0"
    snap = NvmlSnapshot(
        gpus=(
            _gpu(0, "0000:01:00.0", [(True, sw, "NVSwitch")] * 18),
            _gpu(1, "0000:02:00.0", [(True, None, "NVSwitch")] * 17 + [(False, None, None)]),
            _gpu(2, "0000:03:00.0", [(True, None, "IBMNPU")]),
        )
    )
    assert nvlink_matrix(snap) == {(0, 1): 17, (1, 0): 17}


# -- rendering ------------------------------------------------------------------------


def test_render_exact_values(replay_sampler: list[NvmlSampler]) -> None:
    """One GPU, two links; every series and value, nothing else."""
    b = RecordingBuilder()
    b.ok("nvmlInit")
    b.ok("NVML_NVLINK_MAX_LINKS", value=3)
    b.ok("nvmlSystemGetDriverVersion", value="580.159.04")
    b.err("nvmlSystemGetNVMLVersion", name="NOT_SUPPORTED")
    b.ok("nvmlDeviceGetCount", value=1)
    b.ok("nvmlDeviceGetPciInfo", 0, value="00000000:9B:00.0")
    b.ok("nvmlDeviceGetUUID", 0, value="GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa")
    b.ok("nvmlDeviceGetName", 0, value="NVIDIA H100 80GB HBM3")
    b.ok("nvmlDeviceGetSerial", 0, value="1650124031592")
    b.ok("nvmlDeviceGetVbiosVersion", 0, value="96.00.74.00.0D")
    b.ok("nvmlDeviceGetCurrPcieLinkGeneration", 0, value=3)
    b.ok("nvmlDeviceGetMaxPcieLinkGeneration", 0, value=5)
    b.ok("nvmlDeviceGetCurrPcieLinkWidth", 0, value=16)
    b.ok("nvmlDeviceGetMaxPcieLinkWidth", 0, value=16)
    b.ok("nvmlDeviceGetPcieReplayCounter", 0, value=67)
    b.ok("nvmlDeviceGetRemappedRows", 0, value=[2, 1, 1, 0])
    b.ok("nvmlDeviceGetTotalEccErrors", 0, 0, 0, value=5)
    b.ok("nvmlDeviceGetTotalEccErrors", 0, 1, 0, value=0)
    b.ok("nvmlDeviceGetCurrentClocksEventReasons", 0, value=0x8 | 0x80)
    b.ok("nvmlDeviceGetComputeRunningProcesses", 0, value=[[4242, 1 << 30], [4243, None]])
    b.err("nvmlEventSetCreate", name="NOT_SUPPORTED")
    b.ok("nvmlShutdown")
    # link 0: up, to an NVSwitch, speed from the per-link field
    b.ok("nvmlDeviceGetNvLinkState", 0, 0, value=1)
    b.ok("nvmlDeviceGetNvLinkVersion", 0, 0, value=4)
    b.ok("nvmlDeviceGetFieldValues", 0, 164, 0, value=26562)
    b.ok("nvmlDeviceGetNvLinkRemotePciInfo", 0, 0, value="00000000:C5:00.0")
    b.ok("nvmlDeviceGetNvLinkRemoteDeviceType", 0, 0, value=2)
    for counter, value in enumerate((1, 0, 2, 0)):
        b.ok("nvmlDeviceGetNvLinkErrorCounter", 0, 0, counter, value=value)
    b.err("nvmlDeviceGetNvLinkErrorCounter", 0, 0, 4, name="NOT_SUPPORTED")
    b.ok("nvmlDeviceGetFieldValues", 0, 148, 0, value=3)  # ecc_data through the old field
    # link 1: inactive; per-link counters unsupported, the per-link fields answer replay
    b.ok("nvmlDeviceGetNvLinkState", 0, 1, value=0)
    b.err("nvmlDeviceGetNvLinkVersion", 0, 1, name="NOT_SUPPORTED")
    for counter in range(5):
        b.err("nvmlDeviceGetNvLinkErrorCounter", 0, 1, counter, name="NOT_SUPPORTED")
    b.ok("nvmlDeviceGetFieldValues", 0, 161, 1, value=9)  # replay, scoped to link 1
    # recovery (scoped, then L1), crc_flit (scoped, then L1), crc_data L1, ecc_data L1
    for fid, scope in ((162, 1), (54, 0), (163, 1), (33, 0), (40, 0), (149, 0)):
        b.err("nvmlDeviceGetFieldValues", 0, fid, scope, name="NOT_SUPPORTED")
    # link 2: no such link
    b.err("nvmlDeviceGetNvLinkState", 0, 2, name="INVALID_ARGUMENT")
    # NVLink payload through every link (scopeId UINT_MAX), in KiB: bytes after x 1024
    b.ok("nvmlDeviceGetFieldValues", 0, 138, 0xFFFFFFFF, value=7864689)
    b.ok("nvmlDeviceGetFieldValues", 0, 139, 0xFFFFFFFF, value=7864684)
    snap = sample(b.build(), replay_sampler)
    assert snap.issues == ()
    g, up, down = ("0",), ("0", "0"), ("0", "1")
    assert rendered(snap) == {
        ("fabricscope_gpu_driver_info", ("580.159.04",)): 1,
        # no fabric answer recorded: not offered (tests/nvml/test_nvml_fabric.py has them)
        ("fabricscope_gpu_fabric_state", ("0", "not_supported", "")): 1,
        (
            "fabricscope_gpu_info",
            (
                "0",
                "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
                "0000:9b:00.0",
                "NVIDIA H100 80GB HBM3",
                "96.00.74.00.0D",
            ),
        ): 1,
        ("fabricscope_gpu_lost", g): 0,
        ("fabricscope_gpu_pcie_current_link_generation", g): 3,
        ("fabricscope_gpu_pcie_max_link_generation", g): 5,
        # Gen3 of Gen5 with two compute processes on it: judged, and degraded
        ("fabricscope_gpu_pcie_link_generation_degraded", g): 1,
        ("fabricscope_gpu_pcie_current_link_width", g): 16,
        ("fabricscope_gpu_pcie_max_link_width", g): 16,
        ("fabricscope_gpu_pcie_replays_total", g): 67,
        ("fabricscope_gpu_remapped_rows_total", ("0", "correctable")): 2,
        ("fabricscope_gpu_remapped_rows_total", ("0", "uncorrectable")): 1,
        ("fabricscope_gpu_row_remap_pending", g): 1,
        ("fabricscope_gpu_row_remap_failure", g): 0,
        ("fabricscope_gpu_ecc_errors_total", ("0", "correctable")): 5,
        ("fabricscope_gpu_ecc_errors_total", ("0", "uncorrectable")): 0,
        ("fabricscope_gpu_nvlink_transmitted_bytes_total", g): 7864689 * 1024,
        ("fabricscope_gpu_nvlink_received_bytes_total", g): 7864684 * 1024,
        ("fabricscope_gpu_clocks_event_active", ("0", "gpu_idle")): 0,
        ("fabricscope_gpu_clocks_event_active", ("0", "applications_clocks_setting")): 0,
        ("fabricscope_gpu_clocks_event_active", ("0", "sw_power_cap")): 0,
        ("fabricscope_gpu_clocks_event_active", ("0", "hw_slowdown")): 1,
        ("fabricscope_gpu_clocks_event_active", ("0", "sync_boost")): 0,
        ("fabricscope_gpu_clocks_event_active", ("0", "sw_thermal_slowdown")): 0,
        ("fabricscope_gpu_clocks_event_active", ("0", "hw_thermal_slowdown")): 0,
        ("fabricscope_gpu_clocks_event_active", ("0", "hw_power_brake_slowdown")): 1,
        ("fabricscope_gpu_clocks_event_active", ("0", "display_clock_setting")): 0,
        ("fabricscope_gpu_compute_processes", g): 2,
        ("fabricscope_gpu_xid_watched", g): 0,
        ("fabricscope_nvlink_up", up): 1,
        ("fabricscope_nvlink_up", down): 0,
        ("fabricscope_nvlink_version", up): 4,
        ("fabricscope_nvlink_speed_bytes_per_second", up): 26_562_000_000,
        ("fabricscope_nvlink_remote_info", ("0", "0", "0000:c5:00.0", "NVSwitch")): 1,
        ("fabricscope_nvlink_errors_total", ("0", "0", "replay")): 1,
        ("fabricscope_nvlink_errors_total", ("0", "0", "recovery")): 0,
        ("fabricscope_nvlink_errors_total", ("0", "0", "crc_flit")): 2,
        ("fabricscope_nvlink_errors_total", ("0", "0", "crc_data")): 0,
        ("fabricscope_nvlink_errors_total", ("0", "0", "ecc_data")): 3,
        ("fabricscope_nvlink_errors_total", ("0", "1", "replay")): 9,
        ("fabricscope_gpu_nvlinks_up", g): 1,
        ("fabricscope_nvlink_remote_links", ("0", "0000:c5:00.0", "NVSwitch")): 1,
        ("fabricscope_gpu_nvlink_errors_total", ("0", "replay")): 10,
        ("fabricscope_gpu_nvlink_errors_total", ("0", "recovery")): 0,
        ("fabricscope_gpu_nvlink_errors_total", ("0", "crc_flit")): 2,
        ("fabricscope_gpu_nvlink_errors_total", ("0", "crc_data")): 0,
        ("fabricscope_gpu_nvlink_errors_total", ("0", "ecc_data")): 3,
    }
    # below full: the down link and the non-zero finding counters per link, facts per GPU,
    # the non-slowdown clock reasons and per-link far ends left out
    default = rendered(snap, "default")
    assert {k: v for k, v in default.items() if k[0].startswith("fabricscope_nvlink_")} == {
        ("fabricscope_nvlink_up", down): 0,
        ("fabricscope_nvlink_version", ("0", "")): 4,
        ("fabricscope_nvlink_speed_bytes_per_second", ("0", "")): 26_562_000_000,
        ("fabricscope_nvlink_remote_links", ("0", "0000:c5:00.0", "NVSwitch")): 1,
        ("fabricscope_nvlink_errors_total", ("0", "0", "replay")): 1,
        ("fabricscope_nvlink_errors_total", ("0", "0", "crc_flit")): 2,
        ("fabricscope_nvlink_errors_total", ("0", "1", "replay")): 9,
    }
    assert {k[1][1] for k in default if k[0] == "fabricscope_gpu_clocks_event_active"} == {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
    assert rendered(snap, "minimal") == default  # every NVML family is read by a rule
    assert kinds(findings(snap)) == [
        ("gpu_pcie_speed_degraded", "gpu0"),
        ("nvlink_down", "gpu0/link1"),
        ("nvlink_errors", "gpu0/link0"),
        ("nvlink_errors", "gpu0/link1"),
    ]
    assert snap.gpus[0].serial == "1650124031592"
    procs = snap.gpus[0].compute_processes
    assert procs is not None and [(p.pid, p.used_memory_bytes) for p in procs] == [
        (4242, 1 << 30),
        (4243, None),
    ]


H100X4 = Path(__file__).resolve().parents[1] / "fixtures" / "nvml" / "h100x4.recording.json"


def test_the_4x_h100_recording_gives_each_gpus_nvlink_traffic(
    replay_sampler: list[NvmlSampler],
) -> None:
    """Recorded on a lent 4x H100 after the probe and traffic checks had run: NVML's payload
    KiB through every link (field 138/139, scopeId UINT_MAX), exported in bytes."""
    got = rendered(sample(load(H100X4), replay_sampler))
    assert got[("fabricscope_gpu_nvlink_transmitted_bytes_total", ("0",))] == 2207520926 * 1024
    assert got[("fabricscope_gpu_nvlink_received_bytes_total", ("3",))] == 1987360837 * 1024
    assert sum(1 for name, _ in got if name == "fabricscope_nvlink_up") == 72


def test_nvlink_traffic_is_read_on_each_gpus_turn_and_stands_between(
    replay_sampler: list[NvmlSampler],
) -> None:
    """The traffic fields (138/139 over all links, about 1.2 ms of CPU a GPU on an H200) are
    read for GPU ``g`` on the passes where ``(pass - g) % 4 == 0`` (a rotation of 4 here; 2 by
    default): each GPU's counters are at most 4 passes old, and a pass exports the last value
    read (a counter sampled a minute ago is still a correct sample of it)."""
    run = Passes(load(H100X4), replay_sampler, traffic_rotation=4)
    first, _, keys = run.run()
    assert all(asked(keys, "nvmlDeviceGetFieldValues", g, arg=138) for g in range(4))
    before = [(g.nvlink_transmitted_bytes, g.nvlink_received_bytes) for g in first.gpus]
    assert all(tx is not None and rx is not None for tx, rx in before)
    key = "nvmlDeviceGetFieldValues(2,138,4294967295)"
    answer = copy.deepcopy(run.calls[key])
    for k in range(1, 9):
        if k == 5:  # GPU 2 sent more since: its next turn (pass 6) shows it
            assert isinstance(answer, dict) and isinstance(answer["value"], int)
            answer["value"] += 1000
            run.calls[key] = answer
        snap, _, keys = run.run()
        for g in range(4):
            assert bool(asked(keys, "nvmlDeviceGetFieldValues", g, arg=138)) == ((k - g) % 4 == 0)
        tx = [gpu.nvlink_transmitted_bytes for gpu in snap.gpus]
        expected = [b[0] for b in before]
        if k >= 6:
            expected[2] = (expected[2] or 0) + 1000 * 1024
        assert tx == expected


def test_every_spec_is_rendered_by_some_fixture(
    recorded_nvml: Recording, replay_sampler: list[NvmlSampler]
) -> None:
    snap = sample(with_xid(recorded_nvml, 0, 79), replay_sampler)
    seen = {name for name, _ in rendered(snap)}
    seen |= {"fabricscope_gpu_xid_errors_total", "fabricscope_nvlink_speed_bytes_per_second"}
    # rendered in test_render_exact_values (the recording's GPUs run no compute process)
    seen |= {"fabricscope_nvlink_remote_info", "fabricscope_gpu_pcie_link_generation_degraded"}
    # the 4x H100 recording (NVSwitch) answers the NVLink traffic fields the H200's predates
    seen |= {name for name, _ in rendered(sample(load(H100X4), replay_sampler))}
    # MIG: an A100 in MIG mode (tests/nvml/test_nvml_mig.py)
    mig = transcript_recording("a100-pcie-40gb.go-nvml-60.txt")
    mig_sampler = NvmlSampler(lambda: ReplayNvml(mig, strict=False), watch_xid=False)
    replay_sampler.append(mig_sampler)
    seen |= {name for name, _ in rendered(mig_sampler.sample())}
    # no recording is of a GPU in a multi-node NVLink domain: tests/nvml/test_nvml_fabric.py
    seen |= {"fabricscope_gpu_fabric_info"}
    assert {s.name for s in metrics.SPECS} == seen
    assert len({s.name for s in metrics.SPECS}) == len(metrics.SPECS)


def test_link_error_counts_sum_only_link_errors() -> None:
    assert NvLinkErrorCounts(replay=1, crc_flit=2, ecc_data=50).link_errors == 3
    assert NvLinkErrorCounts().link_errors == 0


def _api_type_check(api: NvmlApi) -> None:
    """Static check (mypy): both implementations satisfy the protocol."""
    del api


_api_type_check(ReplayNvml({"format": "fabricscope-nvml-recording/1", "calls": {}}))
_api_type_check(LiveNvml(types.ModuleType("unused")))


def test_live_adapter_falls_back_when_the_driver_lacks_the_newest_call() -> None:
    def v3(h: object) -> object:
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

    proc = types.SimpleNamespace(pid=11, usedGpuMemory=1024)
    api = LiveNvml(
        fake_pynvml(
            NVMLLibraryMismatchError=pynvml.NVMLLibraryMismatchError,
            nvmlDeviceGetComputeRunningProcesses=v3,
            nvmlDeviceGetComputeRunningProcesses_v2=lambda h: [proc],
        )
    )
    assert api.compute_processes(0) == ((11, 1024),)


def test_a_pass_pickles_to_the_same_records_through_the_childs_pipe(
    replay_sampler: list[NvmlSampler],
) -> None:
    """The child hands each pass to the agent pickled (agent/core/frames.py): the GPU, link
    and counter records pickle as their fields (a smaller, faster form) and come back equal,
    of their own classes, hashable and frozen as before."""
    import copy
    import dataclasses
    import io
    import pickle

    from agent.core.frames import encode, read_frame

    snap = sample(load(H100X4), replay_sampler)
    back = pickle.loads(pickle.dumps(snap, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == snap and hash(back.gpus) == hash(snap.gpus)
    link = back.gpus[1].nvlinks[3]
    assert type(link).__name__ == "NvLink" and link.errors.crc_data is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        link.state = 0  # type: ignore[misc]
    assert copy.copy(snap.gpus[0]) == snap.gpus[0]
    assert dataclasses.replace(link, state=0).errors == link.errors
    assert read_frame(io.BytesIO(encode(("ok", snap)))) == ("ok", snap)
