"""Recording NVML answers and replaying them: a recording replays to exactly the snapshot
the recorded pass produced (on the GPU machine: from the live NVML)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from agent.nvml import LiveNvml, NvmlCallError, NvmlSampler, NvmlSnapshot
from agent.nvml_record import FORMAT, RecordingNvml, ReplayNvml, dumps, load, record
from tests.test_nvml_fixtures import (
    Recording,
    h200x2_recording,
    with_call_error,
    with_gpu_lost,
    with_xid,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def recorded_nvml() -> Recording:
    """A fresh copy of the H200 x2 recording (or its stand-in)."""
    return h200x2_recording()


def replayed(rec: Recording) -> NvmlSnapshot:
    sampler = NvmlSampler(lambda: ReplayNvml(rec), xid_wait_ms=50)
    try:
        return sampler.sample()
    finally:
        sampler.close()


@pytest.mark.parametrize(
    "fault",
    [
        lambda r: r,
        lambda r: with_gpu_lost(r, 1),
        lambda r: with_call_error(r, "nvmlDeviceGetPcieReplayCounter(0)", "UNKNOWN"),
    ],
    ids=["as-recorded", "gpu-lost", "one-error"],
)
def test_recording_a_replay_reproduces_it(
    recorded_nvml: Recording, fault: Callable[[Recording], Recording]
) -> None:
    base = fault(recorded_nvml)
    again, snap = record(ReplayNvml(base))
    assert snap == replayed(base)
    assert replayed(again) == snap
    # every answer recorded is the one given; nothing the pass did not ask is invented
    given, recorded = base["calls"], again["calls"]
    assert isinstance(given, dict) and isinstance(recorded, dict)
    assert recorded and all(given[key] == entry for key, entry in recorded.items())
    assert again["format"] == FORMAT
    host = again["host"]
    assert isinstance(host, dict) and host["driver"] == snap.driver_version


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
    assert again.gpus == live.gpus
    assert again.issues == live.issues
    assert again.xid_registrations == live.xid_registrations
    assert (again.driver_version, again.nvml_version) == (live.driver_version, live.nvml_version)
    assert len(live.gpus) > 0
