"""Recording NVML answers and replaying them: a recording replays to exactly the snapshot
the recorded pass produced (on the GPU machine: from the live NVML)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from agent.nvml.api import LiveNvml, NvmlCallError
from agent.nvml.record import FORMAT, RecordingNvml, ReplayNvml, dumps, load, record
from agent.nvml.sampler import NvmlSampler
from agent.nvml.snapshot import NvmlSnapshot
from tests.nvml.test_nvml_fixtures import (
    Recording,
    h200x2_recording,
    with_call_error,
    with_field_values,
    with_gpu_lost,
    with_xid,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recorded_nvml() -> Recording:
    """A fresh copy of the H200 x2 recording (or its stand-in)."""
    return h200x2_recording()


#: passes that cover the slow rotation twice and two static refreshes of both GPUs
PASSES = 2 * 9 + 1
REFRESH = 7


def replayed_passes(rec: Recording, passes: int = PASSES) -> list[NvmlSnapshot]:
    """Snapshots of ``passes`` passes of one sampler over a strict replay of ``rec``."""
    sampler = NvmlSampler(lambda: ReplayNvml(rec), static_refresh_passes=REFRESH)
    try:
        return [sampler.sample() for _ in range(passes)]
    finally:
        sampler.close()


def replayed(rec: Recording) -> NvmlSnapshot:
    return replayed_passes(rec, 1)[0]


NOT_SUPPORTED = {"error": "NOT_SUPPORTED", "code": 3}
NOT_FOUND = {"error": "FUNCTION_NOT_FOUND", "code": 13}


@pytest.mark.parametrize(
    "fault",
    [
        lambda r: r,
        lambda r: with_gpu_lost(r, 1),
        lambda r: with_call_error(r, "nvmlDeviceGetPcieReplayCounter(0)", "UNKNOWN"),
        with_field_values,
        lambda r: with_call_error(
            with_field_values(r), "nvmlDeviceGetFieldValues(1,162,4)", "UNKNOWN"
        ),
    ],
    ids=["as-recorded", "gpu-lost", "one-error", "batched", "batched-one-error"],
)
def test_recording_a_replay_reproduces_it_pass_by_pass(
    recorded_nvml: Recording, fault: Callable[[Recording], Recording]
) -> None:
    """A recording made by today's sampler (RecordingNvml over a replay of the H200
    recording) replays to the same snapshots, pass by pass, through the rotation and static
    refreshes; recording that replay again gives the same answers, nothing more."""
    base = fault(recorded_nvml)
    again, snap = record(ReplayNvml(base))
    original = replayed_passes(base)
    assert snap == original[0]
    assert replayed_passes(again) == original
    # every answer recorded is the one given; a field entry or a MIG mode the old
    # recording never had is recorded as the NOT_SUPPORTED the replay gave, a fabric
    # question it never had as the FUNCTION_NOT_FOUND the replay gave (agent/nvml/record.py),
    # nothing else is invented
    given, recorded = base["calls"], again["calls"]
    assert isinstance(given, dict) and isinstance(recorded, dict)
    assert recorded
    for key, entry in recorded.items():
        fabric = key.startswith("nvmlDeviceGetGpuFabricInfoV(")
        assert given.get(key, NOT_FOUND if fabric else NOT_SUPPORTED) == entry, key
        assert (
            key in given
            or fabric
            or key.startswith(("nvmlDeviceGetFieldValues(", "nvmlDeviceGetMigMode("))
        )
    # a fixed point: the new recording answers every question of every later pass
    third, _ = record(ReplayNvml(again))
    assert third["calls"] == recorded
    assert again["format"] == FORMAT
    host = again["host"]
    assert isinstance(host, dict) and host["driver"] == snap.driver_version


def test_a_recording_of_many_passes_replays_them(recorded_nvml: Recording) -> None:
    """The recorder wrapped around a sampler for many passes (rotation, refreshes) holds
    every answer those passes got; replaying it gives the same passes."""
    base = with_field_values(recorded_nvml)
    rec = RecordingNvml(ReplayNvml(base))
    sampler = NvmlSampler(lambda: rec, static_refresh_passes=REFRESH)
    live = [sampler.sample() for _ in range(PASSES)]
    sampler.close()
    assert replayed_passes(rec.recording()) == live


def test_field_values_are_recorded_entry_by_entry(recorded_nvml: Recording) -> None:
    api = RecordingNvml(ReplayNvml(with_field_values(recorded_nvml)))
    answers = api.field_values(0, [(161, 3), (164, 3), (999, 0)])
    assert answers[:2] == (0, 26562)
    assert isinstance(answers[2], NvmlCallError) and answers[2].name == "NOT_SUPPORTED"
    assert api.calls["nvmlDeviceGetFieldValues(0,161,3)"] == {"value": 0}
    assert api.calls["nvmlDeviceGetFieldValues(0,999,0)"] == NOT_SUPPORTED
    assert api.counts["nvmlDeviceGetFieldValues"] == 1
    assert api.fields_read == {161: 1, 164: 1, 999: 1}
    assert ReplayNvml(api.recording()).field_values(0, [(164, 3), (999, 0)])[0] == 26562


def test_a_failed_field_values_call_is_recorded_as_every_entrys_answer(
    recorded_nvml: Recording,
) -> None:
    class WholeCallLost(ReplayNvml):
        def field_values(
            self, gpu: int, fields: Sequence[tuple[int, int]]
        ) -> tuple[int | NvmlCallError, ...]:
            raise NvmlCallError("nvmlDeviceGetFieldValues", 15, "GPU_IS_LOST")

    api = RecordingNvml(WholeCallLost(recorded_nvml))
    with pytest.raises(NvmlCallError, match="GPU_IS_LOST"):
        api.field_values(1, [(161, 0), (94, 0)])
    lost = {"error": "GPU_IS_LOST", "code": 15}
    assert api.calls["nvmlDeviceGetFieldValues(1,161,0)"] == lost
    assert api.calls["nvmlDeviceGetFieldValues(1,94,0)"] == lost
    answers = ReplayNvml(api.recording()).field_values(1, [(161, 0), (94, 0)])
    assert [a.name for a in answers if isinstance(a, NvmlCallError)] == ["GPU_IS_LOST"] * 2


def test_replay_answers_a_field_it_never_recorded_not_supported(
    recorded_nvml: Recording,
) -> None:
    """Strict or not: the H200 recording predates the batched path and holds no field 161;
    NOT_SUPPORTED sends the sampler to the per-call answers it does hold."""
    for strict in (True, False):
        (answer,) = ReplayNvml(recorded_nvml, strict=strict).field_values(0, [(161, 0)])
        assert isinstance(answer, NvmlCallError) and answer.name == "NOT_SUPPORTED"
    with pytest.raises(LookupError):  # a single field asked alone stays strict
        ReplayNvml(recorded_nvml).field_value(0, 161, 0)


def test_recording_keeps_xid_events(recorded_nvml: Recording) -> None:
    again, _ = record(ReplayNvml(with_xid(recorded_nvml, 1, 48)), xid_seconds=0.3)
    assert again["events"] == [{"gpu": 1, "xid": 48}]


def test_recording_survives_json_and_files(recorded_nvml: Recording, tmp_path: Path) -> None:
    rec, snap = record(ReplayNvml(recorded_nvml))
    path = tmp_path / "r.json"
    path.write_text(dumps(rec))
    assert load(path) == json.loads(dumps(rec))
    assert replayed(load(path)) == snap
    assert dumps(rec) == dumps(json.loads(dumps(rec)))  # stable text


def test_recorder_records_errors_and_passes_them_on(recorded_nvml: Recording) -> None:
    rec = RecordingNvml(
        ReplayNvml(with_call_error(recorded_nvml, "nvmlDeviceGetUUID(0)", "UNKNOWN"))
    )
    with pytest.raises(NvmlCallError, match="UNKNOWN"):
        rec.uuid(0)
    assert rec.uuid(1).startswith("GPU-")
    assert rec.calls["nvmlDeviceGetUUID(0)"] == {"error": "UNKNOWN", "code": 999}
    assert rec.calls["nvmlDeviceGetUUID(1)"] == {"value": rec.uuid(1)}


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "nvml_record_script", ROOT / "scripts" / "nvml_record.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_record_script_writes_a_replayable_file(
    recorded_nvml: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "node.recording.json"
    rc = _script().main(
        ["-o", str(out), "--xid-seconds", "0"], api_factory=lambda: ReplayNvml(recorded_nvml)
    )
    assert rc == 0
    assert "2 GPU(s), 36 NVLink(s) up" in capsys.readouterr().out
    assert replayed(load(out)) == replayed(recorded_nvml)
    assert load(out)["host"]["recorded_with"] == "scripts/nvml_record.py"  # type: ignore[index,call-overload]


def test_record_script_says_when_there_is_nothing_to_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_driver() -> ReplayNvml:
        rec: Recording = {
            "format": FORMAT,
            "calls": {"nvmlInit()": {"error": "DRIVER_NOT_LOADED", "code": 9}},
        }
        return ReplayNvml(rec)

    rc = _script().main(["-o", str(tmp_path / "x.json")], api_factory=no_driver)
    assert rc == 1
    assert "DRIVER_NOT_LOADED" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def _nvml_or_skip() -> None:
    try:
        api = LiveNvml()
        api.init()
    except NvmlCallError as exc:
        pytest.skip(f"no NVML here: {exc}")
    api.shutdown()


@pytest.mark.gpu
def test_live_recording_replays_to_the_live_snapshot(tmp_path: Path) -> None:
    """On the GPU machine: a live pass recorded, written, read back and replayed gives the
    same snapshot as the live pass (XID counts aside: events may arrive at any time)."""
    _nvml_or_skip()
    rec, live = record(LiveNvml())
    path = tmp_path / "live.recording.json"
    path.write_text(dumps(rec))
    again = replayed(load(path))
    # later passes ask nothing the first did not: the recording replays them all
    assert all(len(s.gpus) == len(live.gpus) for s in replayed_passes(load(path)))
    assert again.gpus == live.gpus
    assert again.issues == live.issues
    assert again.xid_registrations == live.xid_registrations
    assert (again.driver_version, again.nvml_version) == (live.driver_version, live.nvml_version)
    assert len(live.gpus) > 0
