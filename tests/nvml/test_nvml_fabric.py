"""Each GPU's NVLink fabric registration (``agent/nvml/fabric.py``): the answers real nodes
printed (``tests/fixtures/nvml-fabric``, each ``Fabric`` section turned back into the NVML
answer it prints), hostile answers, the replayed sampler's snapshot and series, and the real
pynvml reading the stand-in library's ``nvmlDeviceGetGpuFabricInfoV`` struct."""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.nvml.api import ERROR_CODES
from agent.nvml.fabric import FAILED, NO_DOMAIN, GpuFabric, parse_fabric, read_fabric
from agent.nvml.record import RecordingNvml, ReplayNvml, call_key
from agent.nvml.sampler import NvmlSampler
from agent.nvml.sweep import Pass
from exporter.metrics import nvml as metrics
from exporter.metrics.spec import Families
from tests.nvml.test_nvml_fixtures import Recording, h200x2_recording
from tests.standin_nvml import build_standin, run_against_standin

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvml-fabric"
CALL = "nvmlDeviceGetGpuFabricInfoV"

#: nvidia-smi's words for NVML's fabric states and statuses
_STATES = {"N/A": 0, "Not Supported": 0, "Not Started": 1, "In Progress": 2, "Completed": 3}
_STATUS = {"Success": 0, "N/A": 0, "Insufficient Resources": ERROR_CODES["INSUFFICIENT_RESOURCES"]}


def printed(name: str) -> list[tuple[str, int, int, int]]:
    """Each ``Fabric`` section of a fixture as the NVML answer it prints."""
    return printed_text((FIXTURES / name).read_text())


def printed_text(text: str) -> list[tuple[str, int, int, int]]:
    """Each ``Fabric`` section of ``nvidia-smi -q`` text as the NVML answer it prints: (UUID
    hex, status, clique, state); a field printed N/A (no answer, or state 0 on a GPU without
    multi-node NVLink) is 0, as NVML leaves it. A section is the lines indented deeper than
    its ``Fabric`` heading."""
    out = []
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if line.strip() != "Fabric":
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for ln in lines[k + 1 :]:
            if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
                break
            body.append(ln)
        fields = dict(re.findall(r"^\s*(\w[\w ]*?)\s*:\s*(.+?)\s*$", "\n".join(body), re.M))
        uuid = fields.get("ClusterUUID", "N/A")
        clique = fields.get("CliqueId", "N/A")
        out.append(
            (
                "0" * 32 if uuid == "N/A" else uuid.replace("-", ""),
                _STATUS[fields["Status"]],
                0 if clique == "N/A" else int(clique),
                _STATES[fields["State"]],
            )
        )
    return out


@pytest.mark.parametrize(
    ("fixture", "state", "domain", "status"),
    [
        ("gb200-completed.txt", "completed", "9c6f5af3-53bf-49b5-a436-b66766c413c3.4026", None),
        # registered, its health unhealthy: still in its domain (health is not membership)
        ("gb200-unhealthy.txt", "completed", "dc6e40c4-d722-4357-9ba6-5291dd461278.2", None),
        ("gb200-not-supported.txt", "not_supported", None, None),
        ("in-progress.txt", "in_progress", None, None),
        ("insufficient-resources.txt", FAILED, None, "INSUFFICIENT_RESOURCES"),
    ],
)
def test_what_real_nodes_printed(
    fixture: str, state: str, domain: str | None, status: str | None
) -> None:
    answers = printed(fixture)
    assert answers
    for gpu, answer in enumerate(answers):
        got = parse_fabric(gpu, answer)
        assert (got.state, got.domain, got.status) == (state, domain, status)


def test_completed_with_a_zero_uuid_is_no_domain() -> None:
    """An H100 without multi-node NVLink can say completed, success, UUID all zeros: every
    such GPU would share one domain, so it is in none."""
    got = parse_fabric(0, ("0" * 32, 0, 0, 3))
    assert (got.state, got.domain) == (NO_DOMAIN, None)


@pytest.mark.parametrize(
    "answer",
    [
        ("9c6f5af353bf49b5a436b66766c413c3", 0, 4026, 7),  # a state NVML does not define
        ("zz" * 16, 0, 4026, 3),  # not hex
        ("9c6f5af3", 0, 4026, 3),  # not 16 bytes
        ("9c6f5af353bf49b5a436b66766c413c3" * 100, 0, 1, 3),  # huge
        ("9c6f5af353bf49b5a436b66766c413c3", 0, 1 << 40, 3),  # clique past 32 bits
        ("9c6f5af353bf49b5a436b66766c413c3", 0, -1, 3),
    ],
)
def test_garbage_is_a_parse_error(answer: tuple[str, int, int, int]) -> None:
    with pytest.raises(ValueError):
        parse_fabric(0, answer)


def recording(calls: dict[str, object]) -> ReplayNvml:
    return ReplayNvml({"format": "fabricscope-nvml-recording/1", "calls": calls})


def test_read_turns_each_answer_into_a_state_or_one_issue() -> None:
    """GPU 0 not supported (quiet), 1 in progress, 2 garbage (one parse issue, no record), 3
    a failed call (one issue, no record), 4 lost since its pass (skipped), 5 in a domain."""
    uuid = "9c6f5af353bf49b5a436b66766c413c3"
    api = recording(
        {
            call_key(CALL, 0): {"error": "NOT_SUPPORTED", "code": 3},
            call_key(CALL, 1): {"value": ["0" * 32, 0, 0, 2]},
            call_key(CALL, 2): {"value": ["not hex", 0, 1, 3]},
            call_key(CALL, 3): {"error": "UNKNOWN", "code": 999},
            call_key(CALL, 4): {"error": "GPU_IS_LOST", "code": 15},
            call_key(CALL, 5): {"value": [uuid, 0, 4026, 3]},
            call_key(CALL, 6): {"value": [uuid, 0]},  # the wrong shape
        }
    )
    p = Pass()
    got = read_fabric(api, p, range(8))  # GPU 7 not in the recording: not asked, FUNCTION_NOT_FOUND
    assert [(f.gpu, f.state, f.domain) for f in got] == [
        (0, "not_supported", None),
        (1, "in_progress", None),
        (5, "completed", "9c6f5af3-53bf-49b5-a436-b66766c413c3.4026"),
        (7, "not_supported", None),
    ]
    assert sorted((i.path, i.reason) for i in p.issues) == [
        ("nvml/2/fabric", "parse"),
        ("nvml/3/nvmlDeviceGetGpuFabricInfoV/fabric", "io"),
        ("nvml/6/nvmlDeviceGetGpuFabricInfoV/fabric", "parse"),
    ]


def with_fabric(rec: Recording, *answers: list[object]) -> Recording:
    out = copy.deepcopy(rec)
    calls = out["calls"]
    assert isinstance(calls, dict)
    for gpu, answer in enumerate(answers):
        calls[call_key(CALL, gpu)] = {"value": answer}
    return out


def rendered(rec: Recording) -> Families:
    """One pass of the NVML sampler over ``rec``, as the exporter renders it."""
    sampler = NvmlSampler(lambda: ReplayNvml(rec))
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    out = Families("default")
    metrics.render(snap, out)
    return out


def series(rec: Recording) -> dict[tuple[str, tuple[str, ...]], float]:
    out = rendered(rec)
    return {
        (s.name, labels): v
        for s, samples in out.items()
        for labels, v in samples
        if s.name.startswith("fabricscope_gpu_fabric_")
    }


def test_the_sampler_exports_the_domain_only_when_completed() -> None:
    """The real 2x H200 recording, its fabric answers edited to the GB200 node's (GPU 0) and
    the in-progress node's (GPU 1); the recording as made (no fabric answer: recorded before
    the call existed) says not_supported for both."""
    (gb200,) = printed("gb200-completed.txt")[:1]
    (waiting,) = printed("in-progress.txt")
    got = series(with_fabric(h200x2_recording(), list(gb200), list(waiting)))
    assert got == {
        ("fabricscope_gpu_fabric_state", ("0", "completed", "")): 1,
        ("fabricscope_gpu_fabric_state", ("1", "in_progress", "")): 1,
        (
            "fabricscope_gpu_fabric_info",
            ("0", "9c6f5af3-53bf-49b5-a436-b66766c413c3", "4026"),
        ): 1,
    }
    assert series(h200x2_recording()) == {
        ("fabricscope_gpu_fabric_state", (g, "not_supported", "")): 1 for g in ("0", "1")
    }


def test_a_registration_is_read_on_its_gpus_turn_while_done_and_every_pass_while_not() -> None:
    """GPU 0 completed (read when ``(pass - 0) % 4 == 0`` with a rotation of 4, 2 by default),
    GPU 1 in progress (read every pass until it completes), then GPU 0's read failing once
    (no record that pass, read again on the next) and completing on its turn: the 4
    passes' delay a finished registration may carry."""
    (gb200,) = printed("gb200-completed.txt")[:1]
    (waiting,) = printed("in-progress.txt")
    rec = with_fabric(h200x2_recording(), list(gb200), list(waiting))
    calls = rec["calls"]
    assert isinstance(calls, dict)
    api = RecordingNvml(ReplayNvml(rec))
    sampler = NvmlSampler(lambda: api, watch_xid=False, fabric_rotation=4)

    def run() -> tuple[list[tuple[int, str]], set[int]]:
        api.calls.clear()
        snap = sampler.sample()
        asked = {int(k[len(CALL) + 1 : -1]) for k in api.calls if k.startswith(CALL + "(")}
        return [(f.gpu, f.state) for f in snap.fabric], asked

    try:
        assert run() == ([(0, "completed"), (1, "in_progress")], {0, 1})
        for _ in range(1, 4):
            assert run() == ([(0, "completed"), (1, "in_progress")], {1})
        calls[call_key(CALL, 1)] = {"value": list(gb200)}  # GPU 1 completes
        assert run() == ([(0, "completed"), (1, "completed")], {0, 1})  # pass 4: GPU 0's turn
        calls[call_key(CALL, 0)] = {"error": "UNKNOWN", "code": 999}
        assert run() == ([(0, "completed"), (1, "completed")], {1})  # pass 5: GPU 1's turn
        for _ in range(6, 8):
            assert run() == ([(0, "completed"), (1, "completed")], set())
        assert run() == ([(1, "completed")], {0})  # pass 8: GPU 0's turn fails: no record
        calls[call_key(CALL, 0)] = {"value": list(waiting)}
        # pass 9: GPU 0 asked again after its failure (and GPU 1's turn)
        assert run() == ([(0, "in_progress"), (1, "completed")], {0, 1})
    finally:
        sampler.close()


# -- the real pynvml over the stand-in library --------------------------------------------


@pytest.fixture(scope="module")
def standin_lib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield build_standin(tmp_path_factory.mktemp("nvml-fabric-standin"))


_READ = """
from agent.nvml.api import LiveNvml
from agent.nvml.fabric import read_fabric
from agent.nvml.sweep import Pass
api = LiveNvml()
api.init()
p = Pass()
print(repr([(f.state, f.domain, f.status) for f in read_fabric(api, p, [0])]), len(p.issues))
"""


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("", "[('not_supported', None, None)] 0"),
        (
            "3 0 4026 9c6f5af353bf49b5a436b66766c413c3",
            "[('completed', '9c6f5af3-53bf-49b5-a436-b66766c413c3.4026', None)] 0",
        ),
        ("2 0 0 00000000000000000000000000000000", "[('in_progress', None, None)] 0"),
        (
            f"3 {ERROR_CODES['INSUFFICIENT_RESOURCES']} 0 00000000000000000000000000000000",
            "[('failed', None, 'INSUFFICIENT_RESOURCES')] 0",
        ),
        ("9 0 1 9c6f5af353bf49b5a436b66766c413c3", "[] 1"),  # a state of no name: one issue
    ],
)
def test_real_pynvml_reads_the_struct(standin_lib: Path, spec: str, want: str) -> None:
    out = run_against_standin(standin_lib, _READ, FABRICSCOPE_STANDIN_FABRIC=spec)
    assert out.strip() == want


def test_a_record_names_its_domain() -> None:
    assert GpuFabric(0, "completed", "u", 1).domain == "u.1"
    assert GpuFabric(0, "in_progress").domain is None


def test_a_single_h200_is_cleanly_not_supported() -> None:
    """The real H200 of a lent machine (one GPU, no NVLink peer; README): NVML answered
    success with state 0, nvidia-smi printed N/A; one pass of the sampler over that
    recording: not_supported, no issue, no domain."""
    from agent.nvml.record import load

    rec = load(FIXTURES / "h200-single.recording.json")
    calls = rec["calls"]
    assert isinstance(calls, dict)
    assert calls[call_key(CALL, 0)] == {"value": ["0" * 32, 0, 0, 0]}
    sampler = NvmlSampler(lambda: ReplayNvml(rec))
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    assert snap.fabric == (GpuFabric(0, "not_supported"),)
    assert not [i for i in snap.issues if "fabric" in i.path.lower()]
    assert (
        "State                                          : N/A"
        in (FIXTURES / "h200-single.txt").read_text()
    )


def test_the_h200s_printed_section_is_the_answer_it_recorded() -> None:
    """The lent H200's ``nvidia-smi -q`` Fabric section (every field N/A) reads back as the
    answer its recording holds: what the live test below compares on a GPU machine."""
    from agent.nvml.record import load

    (answer,) = printed("h200-single.txt")
    rec = load(FIXTURES / "h200-single.recording.json")
    calls = rec["calls"]
    assert isinstance(calls, dict)
    assert calls[call_key(CALL, 0)] == {"value": list(answer)}
    assert parse_fabric(0, answer).state == "not_supported"


@pytest.mark.gpu
def test_live_fabric_is_what_nvidia_smi_prints() -> None:
    """On the GPU machine: every GPU's registration read through the live library (one pass,
    no issue) has the state and domain ``nvidia-smi -q`` prints in its Fabric section. A GPU
    without multi-node NVLink (the lent H200) reads ``not_supported``, quietly."""
    import shutil

    from agent.nvml.api import LiveNvml, NvmlCallError

    smi = shutil.which("nvidia-smi")
    try:
        api = LiveNvml()
        api.init()
    except NvmlCallError as exc:
        pytest.skip(f"no NVML here: {exc}")
    if smi is None:
        api.shutdown()
        pytest.skip("no nvidia-smi here")
    try:
        p = Pass()
        got = read_fabric(api, p, range(api.device_count()))
    finally:
        api.shutdown()
    assert p.issues == [], p.issues
    text = subprocess.run(
        [smi, "-q"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    want = [parse_fabric(gpu, answer) for gpu, answer in enumerate(printed_text(text))]
    assert got and len(want) == len(got)
    assert [(f.gpu, f.state, f.domain, f.status) for f in got] == [
        (w.gpu, w.state, w.domain, w.status) for w in want
    ]
