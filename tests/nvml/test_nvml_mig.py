"""MIG devices through NVML (agent/nvml/mig.py): enumeration replayed from what real A100s
answered in public issue threads (tests/fixtures/nvml-mig, built into recordings by
tests/nvml/mig_transcripts.py), the pynvml adapter, recording, hostile answers, the
exported series, and the device plugin's ``MIG-<uuid>`` attributed to its parent GPU."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from agent.kubernetes.allocation import GpuAllocation
from agent.kubernetes.attribution import (
    AttributionSnapshot,
    attribute_allocations,
    gpu_allocation,
    resolve_gpu,
)
from agent.kubernetes.podresources import ContainerAllocation, DeviceAllocation, PodAllocation
from agent.nvml.api import ERROR_CODES, LiveNvml, NvmlCallError
from agent.nvml.mig import MAX_MIG_DEVICES, MigDevice, MigMode, parse_profile
from agent.nvml.record import JsonValue, RecordingNvml, ReplayNvml, call_key, mig_key
from agent.nvml.sampler import NvmlSampler
from agent.nvml.snapshot import NvmlSnapshot
from exporter.metrics import nvml as metrics
from exporter.metrics.spec import Families
from tests.nvml.mig_transcripts import MIG_FIXTURES, transcript_recording
from tests.nvml.test_nvml import fake_pynvml, raising
from tests.nvml.test_nvml_fixtures import h200x2_recording
from tests.standin_nvml import build_standin, run_against_standin

GO_NVML_60 = "a100-pcie-40gb.go-nvml-60.txt"
TELEGRAF_5812 = "a100-sxm4-80gb-x4.telegraf-5812.txt"
DATADOG_33120 = "a100-sxm4-80gb.datadog-33120.txt"

Recording = dict[str, JsonValue]


@pytest.fixture
def samplers() -> Iterator[list[NvmlSampler]]:
    made: list[NvmlSampler] = []
    yield made
    for s in made:
        s.close()


def sample(rec: Recording, made: list[NvmlSampler], *, strict: bool = False) -> NvmlSnapshot:
    sampler = NvmlSampler(lambda: ReplayNvml(rec, strict=strict), watch_xid=False)
    made.append(sampler)
    return sampler.sample()


def calls(rec: Recording) -> dict[str, JsonValue]:
    got = rec["calls"]
    assert isinstance(got, dict)
    return got


def pod(name: str, resource: str, device_id: str) -> PodAllocation:
    """A pod of one container holding one device."""
    return PodAllocation(
        "ml", name, (ContainerAllocation("job", (DeviceAllocation(resource, (device_id,)),)),)
    )


def series(snap: NvmlSnapshot, name: str) -> list[dict[str, str]]:
    out = Families("full")
    metrics.render(snap, out)
    for spec, samples in out.items():
        if spec.name == name:
            return [dict(zip(spec.labels, labels, strict=True)) for labels, _ in samples]
    return []


# -- recorded A100s --------------------------------------------------------------------------


def test_an_a100_enumerates_as_nvml_answered_in_go_nvml_60(samplers: list[NvmlSampler]) -> None:
    snap = sample(transcript_recording(GO_NVML_60), samplers)
    parent = "GPU-3b722aa5-db24-5b93-84c8-e4e0efcef078"
    assert snap.gpus[0].uuid == parent and snap.gpus[0].pci_bus_id == "0000:86:00.0"
    assert snap.mig_modes == (MigMode(0, True, True),)
    # slots 0-2 hold the three devices; slot 3 answered NOT_FOUND: an empty slot, quietly
    assert [(d.slot, d.uuid, d.gpu_instance, d.profile) for d in snap.mig_devices] == [
        (0, "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb", 2, "3g.20gb"),
        (1, "MIG-9d822d55-dc61-5acb-8c24-544828b47b03", 3, "2g.10gb"),
        (2, "MIG-5f16849a-8ae9-571a-bc2c-486916c4a324", 9, "1g.5gb"),
    ]
    assert {d.parent_uuid for d in snap.mig_devices} == {parent}
    # the thread gives no compute instance ids: absent, and the slice is named by its GI
    assert {d.compute_instance for d in snap.mig_devices} == {None}
    assert [d.instance for d in snap.mig_devices] == ["gi2", "gi3", "gi9"]
    assert snap.issues == ()
    info = series(snap, "fabricscope_gpu_mig_device_info")
    assert info[0] == {
        "gpu": "0",
        "uuid": parent,
        "mig_uuid": "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb",
        "gpu_instance": "2",
        "compute_instance": "",
        "profile": "3g.20gb",
    }
    assert series(snap, "fabricscope_gpu_mig_enabled") == [{"gpu": "0"}]


def test_seven_slices_of_one_a100_datadog_33120(samplers: list[NvmlSampler]) -> None:
    snap = sample(transcript_recording(DATADOG_33120), samplers)
    assert len(snap.mig_devices) == 7
    assert {d.profile for d in snap.mig_devices} == {"1g.10gb"}
    assert [d.slot for d in snap.mig_devices] == list(range(7))
    assert snap.issues == ()


def test_a_device_plugin_mig_uuid_lands_on_its_parent_gpu_telegraf_5812(
    samplers: list[NvmlSampler],
) -> None:
    """Four A100s, GPU 0 sliced in four: a pod holding slice 1 is on GPU 0 (its NVLinks and
    PCIe link), one holding GPU 1 whole is on GPU 1, and the probe counts GPU 0 as taken."""
    snap = sample(transcript_recording(TELEGRAF_5812), samplers)
    assert [m.gpu for m in snap.mig_modes] == [0]  # the thread lists MIG under GPU 0 only
    slice_1 = "MIG-a45882f0-9215-5733-a0c1-49286ab31cb5"
    assert resolve_gpu(slice_1, snap)[1] == snap.gpus[0]
    assert resolve_gpu(slice_1 + "::2", snap)[1] == snap.gpus[0]  # time-sliced MIG
    assert resolve_gpu("MIG-" + slice_1[4:].upper(), snap)[1] == snap.gpus[0]
    pods = (
        pod("tiny-0", "nvidia.com/mig-1g.20gb", slice_1),
        pod("big-0", "nvidia.com/gpu", "GPU-d8594bd4-0fc3-8595-e355-7c98138f3b95"),
    )
    gpus, _, _ = attribute_allocations(pods, snap, None)
    by_pod = {a.pod: a for a in gpus}
    assert (by_pod["tiny-0"].gpu, by_pod["tiny-0"].uuid) == (0, slice_1)
    # no GPU instance id in the thread: the slice is there, which one is unknown
    assert by_pod["tiny-0"].mig == "unknown"
    assert (by_pod["big-0"].gpu, by_pod["big-0"].mig) == (1, "")
    # the probe: GPU 0 (sliced) and GPU 1 are taken, GPUs 2 and 3 free, nothing unknown
    taken = gpu_allocation(AttributionSnapshot(gpus=tuple(gpus)))
    assert taken == GpuAllocation(frozenset({0, 1}))


def test_attribution_names_the_slice_and_index_ids_resolve(samplers: list[NvmlSampler]) -> None:
    snap = sample(transcript_recording(GO_NVML_60), samplers)
    pods = (
        pod("a", "nvidia.com/mig-2g.10gb", "MIG-9d822d55-dc61-5acb-8c24-544828b47b03"),
        # device-id-strategy=index: "<GPU index>:<MIG device slot>"
        pod("b", "nvidia.com/mig-1g.5gb", "0:2"),
        # a MIG UUID NVML does not know (another node's, or a slice destroyed since)
        pod("c", "nvidia.com/mig-1g.5gb", "MIG-00000000-0000-0000-0000-000000000000"),
    )
    gpus, _, _ = attribute_allocations(pods, snap, None)
    got = {a.pod: (a.gpu, a.pci_bus_id, a.mig) for a in gpus}
    assert got == {
        "a": (0, "0000:86:00.0", "gi3"),
        "b": (0, "0000:86:00.0", "gi9"),
        "c": (None, None, "unknown"),
    }


# -- the H200 and old recordings ------------------------------------------------------------


def test_a_recording_without_mig_answers_replays_as_gpus_without_mig(
    samplers: list[NvmlSampler],
) -> None:
    snap = sample(h200x2_recording(), samplers, strict=True)
    assert (snap.mig_modes, snap.mig_devices, snap.issues) == ((), (), ())


def h200_mig_off_answers() -> dict[str, JsonValue]:
    """The MIG answers the lent H200 gave with MIG off (tests/fixtures/nvml-mig)."""
    text = (MIG_FIXTURES / "h200-mig-off.txt").read_text()
    line = next(x for x in text.splitlines() if x.startswith("NVML MIG answers: "))
    answers = json.loads(line.removeprefix("NVML MIG answers: "))
    assert isinstance(answers, dict)
    return answers


def test_mig_disabled_is_a_mode_and_no_enumeration(samplers: list[NvmlSampler]) -> None:
    """What the lent H200 answered with MIG off, mode (0, 0), on both GPUs of the H200 x2
    recording: the slots are never asked (strict replay: a question the recording lacks
    would fail)."""
    off = h200_mig_off_answers()
    assert off == {"nvmlDeviceGetMigMode(0)": {"value": [0, 0]}}
    rec = h200x2_recording()
    for gpu in (0, 1):
        calls(rec)[call_key("nvmlDeviceGetMigMode", gpu)] = off["nvmlDeviceGetMigMode(0)"]
    snap = sample(rec, samplers, strict=True)
    assert snap.mig_modes == (MigMode(0, False, False), MigMode(1, False, False))
    assert (snap.mig_devices, snap.issues) == ((), ())
    assert series(snap, "fabricscope_gpu_mig_device_info") == []


# -- hostile answers ------------------------------------------------------------------------


def _error(name: str) -> JsonValue:
    return {"error": name, "code": ERROR_CODES[name]}


def test_mig_calls_not_supported_are_quiet(samplers: list[NvmlSampler]) -> None:
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[call_key("nvmlDeviceGetMigMode", 0)] = _error("NOT_SUPPORTED")
    snap = sample(rec, samplers)
    assert (snap.mig_modes, snap.mig_devices, snap.issues) == ((), (), ())
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[call_key("nvmlDeviceGetMaxMigDeviceCount", 0)] = _error("NOT_SUPPORTED")
    snap = sample(rec, samplers)
    assert (snap.mig_modes, snap.mig_devices, snap.issues) == ((MigMode(0, True, True),), (), ())


def test_mig_mode_with_no_instance(samplers: list[NvmlSampler]) -> None:
    """MIG on, nothing created yet (after a reset, before the MIG manager ran): every slot
    answers NOT_FOUND. The GPU is in MIG mode and holds no slice; nothing is an error."""
    rec = transcript_recording(GO_NVML_60)
    for slot in range(7):
        calls(rec)[mig_key("nvmlDeviceGetUUID", 0, slot)] = _error("NOT_FOUND")
    snap = sample(rec, samplers)
    assert snap.mig_modes == (MigMode(0, True, True),)
    assert (snap.mig_devices, snap.issues) == ((), ())
    assert series(snap, "fabricscope_gpu_mig_enabled") == [{"gpu": "0"}]


def test_zero_slots_is_no_device(samplers: list[NvmlSampler]) -> None:
    """The H200 with MIG off answered 0 slots; a GPU in MIG mode saying so has no device."""
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[call_key("nvmlDeviceGetMaxMigDeviceCount", 0)] = {"value": 0}
    snap = sample(rec, samplers)
    assert (snap.mig_devices, snap.issues) == ((), ())


def test_a_huge_slot_count_is_bounded(samplers: list[NvmlSampler]) -> None:
    """A driver answering 2**31 slots costs at most MAX_MIG_DEVICES questions and one
    issue; every slot answering is many instances, all kept."""
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[call_key("nvmlDeviceGetMaxMigDeviceCount", 0)] = {"value": 2**31}
    for slot in range(MAX_MIG_DEVICES + 5):
        calls(rec)[mig_key("nvmlDeviceGetUUID", 0, slot)] = {
            "value": f"MIG-{slot:08x}-0000-5000-8000-000000000000"
        }
    start = time.monotonic()
    snap = sample(rec, samplers)
    assert time.monotonic() - start < 5
    assert len(snap.mig_devices) == MAX_MIG_DEVICES
    assert [(i.path, i.reason) for i in snap.issues] == [
        ("nvml/0/nvmlDeviceGetMaxMigDeviceCount", "parse")
    ]


@pytest.mark.parametrize(
    "uuid",
    [
        "GPU-3b722aa5-db24-5b93-84c8-e4e0efcef078",  # the parent's UUID from a MIG handle
        "MIG-zzzz",
        "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb\nfabricscope_up 0",
        "MIG-" + "a" * 10_000,
        "",
    ],
)
def test_a_malformed_mig_uuid_is_an_issue_never_a_label(
    uuid: str, samplers: list[NvmlSampler]
) -> None:
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[mig_key("nvmlDeviceGetUUID", 0, 1)] = {"value": uuid}
    snap = sample(rec, samplers)
    assert [d.slot for d in snap.mig_devices] == [0, 2]
    assert [(i.path, i.reason) for i in snap.issues] == [("nvml/0/mig1/uuid", "parse")]
    assert all(len(i.detail) < 200 for i in snap.issues)
    assert uuid not in {s["mig_uuid"] for s in series(snap, "fabricscope_gpu_mig_device_info")}


def test_a_failing_instance_id_costs_that_id_only(samplers: list[NvmlSampler]) -> None:
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[mig_key("nvmlDeviceGetGpuInstanceId", 0, 0)] = _error("UNKNOWN")
    snap = sample(rec, samplers)
    assert [(d.slot, d.gpu_instance) for d in snap.mig_devices] == [(0, None), (1, 3), (2, 9)]
    assert [(i.path, i.reason) for i in snap.issues] == [
        ("nvml/0/nvmlDeviceGetGpuInstanceId/mig0", "io")
    ]


def test_mig_mode_of_the_wrong_shape_is_a_parse_issue(samplers: list[NvmlSampler]) -> None:
    rec = transcript_recording(GO_NVML_60)
    calls(rec)[call_key("nvmlDeviceGetMigMode", 0)] = {"value": [1]}
    snap = sample(rec, samplers)
    assert (snap.mig_modes, snap.mig_devices) == ((), ())
    assert [(i.path, i.reason) for i in snap.issues] == [("nvml/0/nvmlDeviceGetMigMode", "parse")]


def test_a_gpu_lost_during_enumeration_costs_its_slices_only(
    samplers: list[NvmlSampler],
) -> None:
    rec = transcript_recording(TELEGRAF_5812)
    calls(rec)[mig_key("nvmlDeviceGetUUID", 0, 2)] = _error("GPU_IS_LOST")
    snap = sample(rec, samplers)
    assert snap.mig_devices == ()  # GPU 0's enumeration stopped; the pass carried on
    assert len(snap.gpus) == 4 and snap.mig_modes == (MigMode(0, True, True),)


def test_parse_profile() -> None:
    assert parse_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == "1g.5gb"
    assert parse_profile("NVIDIA H200 MIG 1g.18gb+me") == "1g.18gb+me"
    assert parse_profile("NVIDIA H200") is None
    assert parse_profile("MIG 1g.5gb; rm -rf /") is None


# -- the adapter and the recorder -----------------------------------------------------------


def test_live_adapter_asks_the_mig_handle_by_slot() -> None:
    asked: list[tuple[object, int]] = []

    def handle(parent: object, slot: int) -> object:
        asked.append((parent, slot))
        if slot == 3:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", parent, slot)

    api = LiveNvml(
        fake_pynvml(
            nvmlDeviceGetMigMode=lambda h: [1, 0],
            nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
            nvmlDeviceGetMigDeviceHandleByIndex=handle,
            nvmlDeviceGetUUID=lambda h: b"MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb",
            nvmlDeviceGetName=lambda h: "NVIDIA A100-PCIE-40GB MIG 3g.20gb",
            nvmlDeviceGetGpuInstanceId=lambda h: 2,
            nvmlDeviceGetComputeInstanceId=raising(pynvml.NVML_ERROR_NOT_SUPPORTED),
        )
    )
    assert api.mig_mode(0) == (1, 0)
    assert api.max_mig_device_count(0) == 7
    assert api.mig_uuid(0, 1) == "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb"
    assert api.mig_name(0, 1) == "NVIDIA A100-PCIE-40GB MIG 3g.20gb"
    assert api.mig_gpu_instance_id(0, 1) == 2
    with pytest.raises(NvmlCallError) as info:
        api.mig_compute_instance_id(0, 1)
    assert (info.value.call, info.value.name) == ("nvmlDeviceGetComputeInstanceId", "NOT_SUPPORTED")
    with pytest.raises(NvmlCallError) as info:
        api.mig_uuid(0, 3)
    assert (info.value.call, info.value.name) == (
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "NOT_FOUND",
    )
    assert all(parent == 0 for parent, _ in asked)


def test_live_adapter_refuses_a_mig_mode_of_the_wrong_shape() -> None:
    from agent.nvml.api import NvmlAnswerError

    with pytest.raises(NvmlAnswerError):
        LiveNvml(fake_pynvml(nvmlDeviceGetMigMode=lambda h: 1)).mig_mode(0)


def test_recording_a_mig_node_replays_it_strictly(samplers: list[NvmlSampler]) -> None:
    base = transcript_recording(GO_NVML_60)
    recorder = RecordingNvml(ReplayNvml(base, strict=False))
    first = NvmlSampler(lambda: recorder, watch_xid=False)
    samplers.append(first)
    want = first.sample()
    rec = recorder.recording()
    assert calls(rec)["nvmlDeviceGetUUID(0,mig3)"] == {"error": "NOT_FOUND", "code": 6}
    calls(rec)["nvmlShutdown()"] = {"value": None}  # asked when the replay closes
    again = sample(copy.deepcopy(rec), samplers, strict=True)
    assert (again.mig_modes, again.mig_devices) == (want.mig_modes, want.mig_devices)
    assert again.mig_devices[0] == MigDevice(
        0,
        0,
        "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb",
        "GPU-3b722aa5-db24-5b93-84c8-e4e0efcef078",
        2,
        None,
        "3g.20gb",
    )


# -- through the real pynvml, against the stand-in library ------------------------------------

_LIVE_PASS = """
import json
from agent.nvml.sampler import NvmlSampler
s = NvmlSampler(watch_xid=False)
snap = s.sample()
s.close()
print(json.dumps({
    "gpu": [snap.gpus[0].uuid, snap.gpus[0].name],
    "modes": [[m.gpu, m.enabled, m.pending] for m in snap.mig_modes],
    "devices": [[d.gpu, d.slot, d.uuid, d.parent_uuid, d.gpu_instance, d.compute_instance,
                 d.profile] for d in snap.mig_devices],
    "issues": [[i.path, i.reason] for i in snap.issues],
}))
"""


@pytest.fixture(scope="module")
def standin_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/nvml_standin's libnvidia-ml.so.1, built for this module."""
    return build_standin(tmp_path_factory.mktemp("nvml-standin-mig"))


def live_pass(libdir: Path, mig: str) -> dict[str, object]:
    """One NvmlSampler pass over the real pynvml, which loads the stand-in library as it
    loads NVIDIA's (a process of its own: the loader reads LD_LIBRARY_PATH at start)."""
    answer = json.loads(run_against_standin(libdir, _LIVE_PASS, FABRICSCOPE_STANDIN_MIG=mig))
    assert isinstance(answer, dict)
    return answer


def test_the_live_adapter_enumerates_the_stand_ins_mig_devices(standin_lib: Path) -> None:
    """pynvml's own ctypes calls (nvmlDeviceGetMigMode, ...MaxMigDeviceCount,
    ...MigDeviceHandleByIndex, then UUID, name, GPU and compute instance on the MIG handle)
    against a library answering as the go-nvml issue 60 A100 did: the same records as the
    replay of that transcript."""
    got = live_pass(standin_lib, "go-nvml-60")
    parent = "GPU-3b722aa5-db24-5b93-84c8-e4e0efcef078"
    assert got["gpu"] == [parent, "NVIDIA A100-PCIE-40GB"]
    assert got["modes"] == [[0, True, True]]
    assert got["devices"] == [
        [0, 0, "MIG-23de08f7-6fcc-5be3-9094-cc3b4162f0bb", parent, 2, None, "3g.20gb"],
        [0, 1, "MIG-9d822d55-dc61-5acb-8c24-544828b47b03", parent, 3, None, "2g.10gb"],
        [0, 2, "MIG-5f16849a-8ae9-571a-bc2c-486916c4a324", parent, 9, None, "1g.5gb"],
    ]
    assert got["issues"] == []
    # the replay of the transcript gives the same devices
    made: list[NvmlSampler] = []
    try:
        replayed = sample(transcript_recording(GO_NVML_60), made)
    finally:
        for s in made:
            s.close()
    assert [
        [d.gpu, d.slot, d.uuid, d.parent_uuid, d.gpu_instance, d.compute_instance, d.profile]
        for d in replayed.mig_devices
    ] == got["devices"]


def test_the_live_adapter_on_a_gpu_without_mig(standin_lib: Path) -> None:
    got = live_pass(standin_lib, "")
    assert (got["modes"], got["devices"], got["issues"]) == ([], [], [])
