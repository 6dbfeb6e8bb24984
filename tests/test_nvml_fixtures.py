"""NVML recordings for the tests: the recorded H200 x2 node (or its hand-built stand-in until
the recording is committed), small hand-built recordings, and the derived fault fixtures.

The fault fixtures are functions, not files: each takes a recording and returns an edited
copy, so they apply unchanged to whichever base recording is in use (tests/fixtures/nvml/
README.md lists them). Each raises if the recording lacks the answer it edits, so a base
recording that answers differently fails loudly instead of silently testing nothing.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from agent.nvml import ERROR_CODES, NVLINK_ERROR_COUNTERS, NvmlSampler
from agent.nvml_record import FORMAT, JsonValue, ReplayNvml, call_key, load

FIXTURES = Path(__file__).resolve().parent / "fixtures"
H200X2_RECORDING = FIXTURES / "nvml" / "h200x2.recording.json"

Recording = dict[str, JsonValue]


class RecordingBuilder:
    """Writes a recording call by call."""

    def __init__(self, host: dict[str, JsonValue] | None = None) -> None:
        self.calls: dict[str, JsonValue] = {}
        self.events: list[JsonValue] = []
        self.host = host or {}

    def ok(self, call: str, *args: int, value: JsonValue = None) -> None:
        self.calls[call_key(call, *args)] = {"value": value}

    def err(self, call: str, *args: int, name: str) -> None:
        self.calls[call_key(call, *args)] = {"error": name, "code": ERROR_CODES[name]}

    def build(self) -> Recording:
        return {
            "format": FORMAT,
            "recorded_at_unix": 0,
            "host": dict(self.host),
            "calls": dict(self.calls),
            "events": list(self.events),
        }


def h200x2_recording() -> Recording:
    """Every NVML answer of a real 2x H200 node (driver 580.159.04), recorded by
    scripts/nvml_record.py on the lent nvidia-h200-x2 machine (tests/fixtures/nvml/README.md)."""
    return load(H200X2_RECORDING)


@pytest.fixture
def recorded_nvml() -> Recording:
    """A fresh copy of the H200 x2 recording for each test to edit."""
    return h200x2_recording()


# -- derived fault fixtures -----------------------------------------------------------


def _calls(rec: Recording) -> dict[str, JsonValue]:
    calls = rec["calls"]
    assert isinstance(calls, dict)
    return calls


def _set_value(rec: Recording, key: str, value: JsonValue) -> Recording:
    out = copy.deepcopy(rec)
    entry = _calls(out).get(key)
    if not isinstance(entry, dict) or "value" not in entry:
        raise KeyError(f"the recording has no value for {key} to edit (it answered {entry!r})")
    entry["value"] = value
    return out


def with_nvlink_errors(rec: Recording, gpu: int, link: int, **counts: int) -> Recording:
    """Edits ``nvmlDeviceGetNvLinkErrorCounter(gpu,link,<counter>)`` answers: each keyword
    (``replay``, ``recovery``, ``crc_flit``, ``crc_data``, ``ecc_data``) sets that counter of
    that one link to the given value. Nothing else changes."""
    ids = dict(NVLINK_ERROR_COUNTERS)
    for name, value in counts.items():
        key = call_key("nvmlDeviceGetNvLinkErrorCounter", gpu, link, ids[name])
        rec = _set_value(rec, key, value)
    return rec


def with_link_down(rec: Recording, gpu: int, link: int) -> Recording:
    """Edits ``nvmlDeviceGetNvLinkState(gpu,link)`` to 0 (inactive). The link's other
    answers stay in the recording, unused: the sampler asks a down link for no far end."""
    return _set_value(rec, call_key("nvmlDeviceGetNvLinkState", gpu, link), 0)


def with_gpu_lost(rec: Recording, gpu: int) -> Recording:
    """Edits every per-device answer of GPU ``gpu`` (each ``nvmlDevice*(gpu,...)`` call,
    XID registration included) into ``GPU_IS_LOST`` (code 15), as NVML answers once a GPU
    has fallen off the bus. The other GPUs' answers are unchanged."""
    out = copy.deepcopy(rec)
    calls = _calls(out)
    hits = 0
    for key in list(calls):
        call, _, args = key.partition("(")
        if call.startswith("nvmlDevice") and args.split(",")[0].rstrip(")") == str(gpu):
            calls[key] = {"error": "GPU_IS_LOST", "code": ERROR_CODES["GPU_IS_LOST"]}
            hits += 1
    if hits == 0:
        raise KeyError(f"the recording has no answers for GPU {gpu}")
    return out


def with_xid(rec: Recording, gpu: int, xid: int, times: int = 1) -> Recording:
    """Appends ``times`` XID events ``{"gpu": gpu, "xid": xid}`` to the recording's events."""
    out = copy.deepcopy(rec)
    events = out.setdefault("events", [])
    assert isinstance(events, list)
    events.extend({"gpu": gpu, "xid": xid} for _ in range(times))
    return out


def with_pcie_width(rec: Recording, gpu: int, width: int) -> Recording:
    """Edits ``nvmlDeviceGetCurrPcieLinkWidth(gpu)`` to ``width`` lanes."""
    return _set_value(rec, call_key("nvmlDeviceGetCurrPcieLinkWidth", gpu), width)


def with_row_remap_failure(rec: Recording, gpu: int) -> Recording:
    """Edits ``nvmlDeviceGetRemappedRows(gpu)``: the failure flag (4th value) becomes 1."""
    key = call_key("nvmlDeviceGetRemappedRows", gpu)
    entry = _calls(rec).get(key)
    assert isinstance(entry, dict)
    rows = entry.get("value")
    if not isinstance(rows, list):
        raise KeyError(f"the recording has no value for {key} to edit (it answered {entry!r})")
    return _set_value(rec, key, [*rows[:3], 1])


def with_call_error(rec: Recording, key: str, name: str) -> Recording:
    """Edits the answer to ``key`` into the error ``name`` (``NOT_SUPPORTED``, ``UNKNOWN``)."""
    out = copy.deepcopy(rec)
    calls = _calls(out)
    if key not in calls:
        raise KeyError(f"the recording has no answer for {key}")
    calls[key] = {"error": name, "code": ERROR_CODES[name]}
    return out


# -- tests of the fixtures themselves -----------------------------------------------------


def test_the_base_recording_replays_completely_and_is_json() -> None:
    rec = h200x2_recording()
    assert json.loads(json.dumps(rec)) == rec
    sampler = NvmlSampler(lambda: ReplayNvml(rec), xid_wait_ms=50)
    try:
        snap = sampler.sample()  # strict replay: a question it cannot answer raises
    finally:
        sampler.close()
    assert [g.index for g in snap.gpus] == [0, 1]


def test_each_fault_edits_only_what_it_says(recorded_nvml: Recording) -> None:
    base = _calls(recorded_nvml)

    def changed(rec: Recording) -> set[str]:
        calls = _calls(rec)
        return {k for k in calls if calls[k] != base.get(k)}

    assert changed(with_nvlink_errors(recorded_nvml, 0, 3, crc_flit=7)) == {
        "nvmlDeviceGetNvLinkErrorCounter(0,3,2)"
    }
    assert changed(with_link_down(recorded_nvml, 0, 3)) == {"nvmlDeviceGetNvLinkState(0,3)"}
    lost = changed(with_gpu_lost(recorded_nvml, 1))
    assert lost and all(k.startswith("nvmlDevice") and "(1" in k for k in lost)
    assert not any("(0" in k for k in lost)
    assert changed(with_xid(recorded_nvml, 0, 79)) == set()
    assert with_xid(recorded_nvml, 0, 79, times=2)["events"][-2:] == [  # type: ignore[index]
        {"gpu": 0, "xid": 79},
        {"gpu": 0, "xid": 79},
    ]
    assert changed(with_pcie_width(recorded_nvml, 0, 8)) == {"nvmlDeviceGetCurrPcieLinkWidth(0)"}
    assert changed(with_row_remap_failure(recorded_nvml, 1)) == {"nvmlDeviceGetRemappedRows(1)"}
    assert recorded_nvml == h200x2_recording()  # the input is never mutated


def test_a_fault_on_an_answer_the_recording_lacks_fails_loudly(recorded_nvml: Recording) -> None:
    with pytest.raises(KeyError):
        with_link_down(recorded_nvml, 0, 99)
    with pytest.raises(KeyError):
        with_gpu_lost(recorded_nvml, 7)
