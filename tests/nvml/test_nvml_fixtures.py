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
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.nvml.api import ERROR_CODES, NVLINK_ERROR_COUNTERS
from agent.nvml.record import FORMAT, JsonValue, ReplayNvml, call_key, load
from agent.nvml.sampler import NvmlSampler

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
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


#: the scoped field carrying each counter the sampler reads through the batched call
SCOPED_ERROR_FIELDS = {"replay": 161, "recovery": 162, "crc_flit": 163}
#: GPU-level fields the sampler batches, and the per-call answer each stands for:
#: (field id, per-call key arguments after the GPU, index into that answer or None)
GPU_FIELDS: tuple[tuple[int, str, tuple[int, ...], int | None], ...] = (
    (94, "nvmlDeviceGetPcieReplayCounter", (), None),
    (3, "nvmlDeviceGetTotalEccErrors", (0, 0), None),
    (4, "nvmlDeviceGetTotalEccErrors", (1, 0), None),
    (142, "nvmlDeviceGetRemappedRows", (), 0),
    (143, "nvmlDeviceGetRemappedRows", (), 1),
    (144, "nvmlDeviceGetRemappedRows", (), 2),
    (145, "nvmlDeviceGetRemappedRows", (), 3),
)


def with_nvlink_errors(rec: Recording, gpu: int, link: int, **counts: int) -> Recording:
    """Sets counters of one link: each keyword (``replay``, ``recovery``, ``crc_flit``,
    ``crc_data``, ``ecc_data``) sets that counter to the given value in every answer that
    carries it: ``nvmlDeviceGetNvLinkErrorCounter(gpu,link,<counter>)`` and, where the
    recording has it, the scoped field ``nvmlDeviceGetFieldValues(gpu,<161-163>,link)`` the
    sampler reads first. Nothing else changes."""
    ids = dict(NVLINK_ERROR_COUNTERS)
    for name, value in counts.items():
        rec = _set_value(
            rec, call_key("nvmlDeviceGetNvLinkErrorCounter", gpu, link, ids[name]), value
        )
        if name in SCOPED_ERROR_FIELDS:
            key = call_key("nvmlDeviceGetFieldValues", gpu, SCOPED_ERROR_FIELDS[name], link)
            if key in _calls(rec):
                rec = _set_value(rec, key, value)
    return rec


def with_field_values(rec: Recording) -> Recording:
    """Adds the answers of the fields the sampler batches into one ``nvmlDeviceGetFieldValues``
    per GPU, as a node whose driver offers them gives them: for every recorded NVLink, the
    scoped fields 161-163 (replay, recovery, CRC-flit), and per GPU the fields 94 (PCIe
    replays), 3 and 4 (volatile ECC) and 142-145 (remapped rows). Each value is copied from
    the recording's own per-call answer for the same counter (an error stays that error).
    The H200 recording predates the batched path; on the same kind of node every one of
    these fields answered (``bench/nvml_fieldvalues.py``), with the per-call values.
    Raises ``KeyError`` when the recording has no per-call answer to copy."""
    out = copy.deepcopy(rec)
    calls = _calls(out)
    ids = dict(NVLINK_ERROR_COUNTERS)
    added = 0
    for key in list(calls):
        call, _, args = key.partition("(")
        if call == "nvmlDeviceGetNvLinkErrorCounter":
            gpu, link, counter = (int(a) for a in args.rstrip(")").split(","))
            for name, field_id in SCOPED_ERROR_FIELDS.items():
                if ids[name] == counter:
                    calls[call_key("nvmlDeviceGetFieldValues", gpu, field_id, link)] = calls[key]
                    added += 1
        elif call == "nvmlDeviceGetPcieReplayCounter":
            gpu = int(args.rstrip(")"))
            for field_id, source, extra, index in GPU_FIELDS:
                entry = calls[call_key(source, gpu, *extra)]
                assert isinstance(entry, dict)
                value = entry.get("value")
                if index is not None and isinstance(value, list):
                    entry = {"value": value[index]}
                calls[call_key("nvmlDeviceGetFieldValues", gpu, field_id, 0)] = copy.deepcopy(entry)
                added += 1
    if added == 0:
        raise KeyError("the recording has no per-call counter answers to copy")
    return out


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
    """Edits ``nvmlDeviceGetRemappedRows(gpu)``: the failure flag (4th value) becomes 1; so
    does field 145 (``NVML_FI_DEV_REMAPPED_FAILURE``) where the recording has it."""
    key = call_key("nvmlDeviceGetRemappedRows", gpu)
    entry = _calls(rec).get(key)
    assert isinstance(entry, dict)
    rows = entry.get("value")
    if not isinstance(rows, list):
        raise KeyError(f"the recording has no value for {key} to edit (it answered {entry!r})")
    out = _set_value(rec, key, [*rows[:3], 1])
    field_key = call_key("nvmlDeviceGetFieldValues", gpu, 145, 0)
    if field_key in _calls(out):
        out = _set_value(out, field_key, 1)
    return out


def with_call_error(rec: Recording, key: str, name: str) -> Recording:
    """Edits the answer to ``key`` into the error ``name`` (``NOT_SUPPORTED``, ``UNKNOWN``)."""
    out = copy.deepcopy(rec)
    calls = _calls(out)
    if key not in calls:
        raise KeyError(f"the recording has no answer for {key}")
    calls[key] = {"error": name, "code": ERROR_CODES[name]}
    return out


# -- tests of the fixtures themselves -----------------------------------------------------


@pytest.mark.parametrize(
    "variant", [h200x2_recording, lambda: with_field_values(h200x2_recording())]
)
def test_the_base_recording_replays_completely_and_is_json(
    variant: Callable[[], Recording],
) -> None:
    rec = variant()
    assert json.loads(json.dumps(rec)) == rec
    sampler = NvmlSampler(lambda: ReplayNvml(rec), static_refresh_passes=5)
    try:  # strict replay: a question it cannot answer raises; a full rotation and refreshes
        snaps = [sampler.sample() for _ in range(2 * sampler.slow_error_rotation + 1)]
    finally:
        sampler.close()
    assert [g.index for g in snaps[0].gpus] == [0, 1]
    assert all(s.issues == () for s in snaps)


def test_field_values_copies_the_per_call_answers(recorded_nvml: Recording) -> None:
    base = _calls(recorded_nvml)
    calls = _calls(with_field_values(recorded_nvml))
    added = {k: v for k, v in calls.items() if k not in base}
    assert all(calls[k] == v for k, v in base.items())  # nothing recorded changes
    scoped = [k for k in added if int(k.split(",")[1]) in SCOPED_ERROR_FIELDS.values()]
    assert len(scoped) == 2 * 18 * 3  # every recorded link, replay/recovery/crc_flit
    assert len(added) == len(scoped) + 2 * 7  # and the seven GPU-level fields per GPU
    assert calls["nvmlDeviceGetFieldValues(1,94,0)"] == base["nvmlDeviceGetPcieReplayCounter(1)"]
    assert (
        calls["nvmlDeviceGetFieldValues(0,163,5)"] == base["nvmlDeviceGetNvLinkErrorCounter(0,5,2)"]
    )
    assert calls["nvmlDeviceGetFieldValues(0,145,0)"] == {"value": 0}
    with pytest.raises(KeyError):
        with_field_values(RecordingBuilder().build())


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


def test_faults_edit_the_batched_fields_too_where_present(recorded_nvml: Recording) -> None:
    """With field answers present the sampler reads those first: the faults edit both."""
    fields = with_field_values(recorded_nvml)
    base = _calls(fields)

    def changed(rec: Recording) -> set[str]:
        calls = _calls(rec)
        return {k for k in calls if calls[k] != base.get(k)}

    assert changed(with_nvlink_errors(fields, 0, 3, crc_flit=7, crc_data=9)) == {
        "nvmlDeviceGetNvLinkErrorCounter(0,3,2)",
        "nvmlDeviceGetFieldValues(0,163,3)",
        "nvmlDeviceGetNvLinkErrorCounter(0,3,3)",  # crc_data: no field carries it
    }
    assert changed(with_row_remap_failure(fields, 1)) == {
        "nvmlDeviceGetRemappedRows(1)",
        "nvmlDeviceGetFieldValues(1,145,0)",
    }
    lost = changed(with_gpu_lost(fields, 1))
    assert "nvmlDeviceGetFieldValues(1,161,0)" in lost
    assert "nvmlDeviceGetFieldValues(1,94,0)" in lost


def test_a_fault_on_an_answer_the_recording_lacks_fails_loudly(recorded_nvml: Recording) -> None:
    with pytest.raises(KeyError):
        with_link_down(recorded_nvml, 0, 99)
    with pytest.raises(KeyError):
        with_gpu_lost(recorded_nvml, 7)
