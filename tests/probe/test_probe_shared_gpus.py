"""The probe never runs on a shared GPU, MPS included: a GPU whose compute mode is not the
default (the NVIDIA device plugin's MPS control daemon sets exclusive-process on every GPU it
shares, for as long as it runs: ``cmd/mps-control-daemon/mps/daemon.go``) is busy although
no process runs on it and no pod holds a replica of it yet. Time-slicing and MPS replicas a
pod holds are taken through the kubelet (tests/kubernetes/test_claims.py).

What is real here: the compute mode of the recorded H200 node (its ``nvidia-smi -q`` says
``Compute Mode: Default`` for both GPUs, tests/fixtures/nvidia-smi/h200x2/q.txt), pynvml's own
``nvmlDeviceGetComputeMode`` call through the stand-in library; no MPS daemon ran here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.nvml.api import NvmlAnswerError
from agent.nvml.record import ReplayNvml, load
from agent.probe.run.devices import GpuViewSampler, NvmlBusyGpus
from tests.probe.test_probe_service import FakeNvml
from tests.standin_nvml import build_standin, run_against_standin

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"
SMI_Q = ROOT / "tests" / "fixtures" / "nvidia-smi" / "h200x2" / "q.txt"

EXCLUSIVE_PROCESS = 3  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
PROHIBITED = 2


def busy(modes: dict[int, int | str]) -> frozenset[int] | None:
    view = GpuViewSampler(lambda: FakeNvml(4, modes=modes))
    return NvmlBusyGpus(view)()


def test_an_mps_shared_gpu_is_busy_though_nothing_runs_on_it() -> None:
    """Before this check the probe's busy check asked only for compute processes: an
    exclusive-process GPU with no pod on it yet was free, and a probe on it would keep the
    MPS server, and so every sharing pod, from starting."""
    assert busy({}) == frozenset()
    assert busy({2: EXCLUSIVE_PROCESS}) == frozenset({2})
    assert busy({1: PROHIBITED, 3: EXCLUSIVE_PROCESS}) == frozenset({1, 3})


@pytest.mark.parametrize("mode", [1, 4, 255, 2**32 - 1])
def test_a_mode_that_is_not_the_default_is_never_probed(mode: int) -> None:
    """Hostile or unknown answers (the retired exclusive-thread mode, values NVML does not
    define, the largest unsigned int): not the default, so not probed."""
    assert busy({0: mode}) == frozenset({0})


def test_a_gpu_without_the_call_has_the_default_mode_and_other_errors_are_unknown() -> None:
    assert busy({0: "NOT_SUPPORTED", 1: "FUNCTION_NOT_FOUND"}) == frozenset()
    assert busy({0: "GPU_IS_LOST"}) is None  # unknown: the service probes no GPU at all


def test_the_recorded_h200_is_free_and_an_edited_mps_gpu_is_busy(tmp_path: Path) -> None:
    """The recorded node's GPUs had the default mode (its nvidia-smi -q, recorded beside the
    NVML recording). A recording made before the call existed replays as NOT_SUPPORTED (the
    default); the same recording EDITED so that GPU 1 answers exclusive-process is busy; a
    non-integer answer is one clear error (in the agent the busy check then reads unknown)."""
    smi = SMI_Q.read_text()
    assert smi.count("Compute Mode") == 2 and smi.count(": Default") >= 2
    recording = load(H200)
    view = GpuViewSampler(lambda: ReplayNvml(recording))
    assert NvmlBusyGpus(view)() == frozenset()
    edited = json.loads(H200.read_text())
    edited["calls"]["nvmlDeviceGetComputeMode(0)"] = {"value": 0}
    edited["calls"]["nvmlDeviceGetComputeMode(1)"] = {"value": EXCLUSIVE_PROCESS}
    path = tmp_path / "mps.recording.json"
    path.write_text(json.dumps(edited))
    mps = load(path)
    assert NvmlBusyGpus(GpuViewSampler(lambda: ReplayNvml(mps)))() == frozenset({1})
    edited["calls"]["nvmlDeviceGetComputeMode(1)"] = {"value": "EXCLUSIVE_PROCESS"}
    path.write_text(json.dumps(edited))
    bad = load(path)
    with pytest.raises(NvmlAnswerError, match="nvmlDeviceGetComputeMode"):
        GpuViewSampler(lambda: ReplayNvml(bad)).sample()


_LIVE = """
import json, os
from agent.probe.run.devices import GpuViewSampler
out = {}
view = GpuViewSampler()
for mode in ("", "3", "2", "none"):
    os.environ["FABRICSCOPE_STANDIN_COMPUTE_MODE"] = mode
    out[mode] = sorted(view.sample().busy or ())
view.close()
print(json.dumps(out))
"""


def test_pynvmls_own_call_reads_the_mode(tmp_path: Path) -> None:
    """pynvml's nvmlDeviceGetComputeMode (ctypes, as against NVIDIA's library) against the
    stand-in library answering each mode in turn."""
    out = run_against_standin(build_standin(tmp_path), _LIVE)
    assert json.loads(out) == {"": [], "3": [0], "2": [0], "none": []}
