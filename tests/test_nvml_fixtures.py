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


def h200x2_standin() -> Recording:
    """HAND-BUILT STAND-IN for tests/fixtures/nvml/h200x2.recording.json, written before a
    real recording existed. It is not a recording.

    Built from the facts ../shared/ENVIRONMENT.md documents for the nvidia-h200-x2 machine
    (driver 580.159.04, NVML 13.580; 2x "NVIDIA H200" at 0000:00:06.0 and 0000:00:07.0, Gen5
    x16 current and max; 18 NVLinks per GPU, all up, NV18 between them; replay/recovery/CRC
    counters 0; field values NVLINK_SPEED_MBPS_COMMON and the *_ERROR_COUNT_TOTAL fields
    NOT_SUPPORTED; NVLINK_LINK_COUNT 18). Everything else is a GUESS, marked below; tests
    assert documented facts only, so the real recording can replace this without edits.
    """
    b = RecordingBuilder({"driver": "580.159.04", "nvml": "13.580", "standin": True})
    b.ok("nvmlInit")
    b.ok("NVML_NVLINK_MAX_LINKS", value=36)  # nvidia-ml-py 13.615's constant
    b.ok("nvmlSystemGetDriverVersion", value="580.159.04")
    b.ok("nvmlSystemGetNVMLVersion", value="13.580")
    b.ok("nvmlDeviceGetCount", value=2)
    for gpu, bus in ((0, "00000000:00:06.0"), (1, "00000000:00:07.0")):
        b.ok("nvmlDeviceGetPciInfo", gpu, value=bus)
        b.ok("nvmlDeviceGetUUID", gpu, value=f"GPU-00000000-0000-0000-0000-00000000000{gpu}")
        b.ok("nvmlDeviceGetName", gpu, value="NVIDIA H200")
        b.ok("nvmlDeviceGetSerial", gpu, value=f"165000000000{gpu}")  # GUESS
        b.ok("nvmlDeviceGetVbiosVersion", gpu, value="96.00.A5.00.01")  # GUESS
        b.ok("nvmlDeviceGetCurrPcieLinkGeneration", gpu, value=5)
        b.ok("nvmlDeviceGetMaxPcieLinkGeneration", gpu, value=5)
        b.ok("nvmlDeviceGetCurrPcieLinkWidth", gpu, value=16)
        b.ok("nvmlDeviceGetMaxPcieLinkWidth", gpu, value=16)
        b.ok("nvmlDeviceGetPcieReplayCounter", gpu, value=0)  # GUESS
        b.ok("nvmlDeviceGetRemappedRows", gpu, value=[0, 0, 0, 0])  # GUESS
        b.ok("nvmlDeviceGetTotalEccErrors", gpu, 0, 0, value=0)  # GUESS
        b.ok("nvmlDeviceGetTotalEccErrors", gpu, 1, 0, value=0)  # GUESS
        b.ok("nvmlDeviceGetCurrentClocksEventReasons", gpu, value=0x1)  # GUESS: idle
        b.ok("nvmlDeviceGetComputeRunningProcesses", gpu, value=[])
        b.ok("nvmlDeviceRegisterEvents", gpu)  # GUESS
        b.err("nvmlDeviceGetFieldValues", gpu, 90, 0, name="NOT_SUPPORTED")
        for link in range(36):
            if link >= 18:
                b.err("nvmlDeviceGetNvLinkState", gpu, link, name="INVALID_ARGUMENT")  # GUESS
                continue
            b.ok("nvmlDeviceGetNvLinkState", gpu, link, value=1)
            b.ok("nvmlDeviceGetNvLinkVersion", gpu, link, value=4)  # GUESS
            b.err("nvmlDeviceGetFieldValues", gpu, 164, link, name="NOT_SUPPORTED")  # GUESS
            if link < 12:
                speed_l = (*range(84, 90), *range(132, 138))[link]
                b.err("nvmlDeviceGetFieldValues", gpu, speed_l, 0, name="NOT_SUPPORTED")  # GUESS
            # GUESS: the 2-GPU VM's links end at NVSwitches that the VM cannot see
            b.err("nvmlDeviceGetNvLinkRemotePciInfo", gpu, link, name="NOT_SUPPORTED")
            b.ok("nvmlDeviceGetNvLinkRemoteDeviceType", gpu, link, value=2)
            for name, counter in NVLINK_ERROR_COUNTERS:
                if name == "ecc_data":  # GUESS: not offered, nor its per-link field
                    b.err(
                        "nvmlDeviceGetNvLinkErrorCounter", gpu, link, counter, name="NOT_SUPPORTED"
                    )
                    if link < 12:
                        b.err("nvmlDeviceGetFieldValues", gpu, 148 + link, 0, name="NOT_SUPPORTED")
                else:
                    b.ok("nvmlDeviceGetNvLinkErrorCounter", gpu, link, counter, value=0)
    b.ok("nvmlEventSetCreate")  # GUESS
    b.ok("nvmlEventSetFree")
    b.ok("nvmlShutdown")
    return b.build()


def h200x2_recording() -> Recording:
    """The recorded H200 x2 node; the stand-in until the recording is committed."""
    if H200X2_RECORDING.exists():
        return load(H200X2_RECORDING)
    return h200x2_standin()


@pytest.fixture
def recorded_nvml() -> Recording:
    """A fresh copy of the H200 x2 recording (or its stand-in) for each test to edit."""
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
