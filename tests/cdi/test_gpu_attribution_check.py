"""scripts/gpu_attribution_check.py (run on GPU nodes by scripts/gpu_verify.sh): its parser
against real nvidia-smi -q outputs (tests/fixtures/nvidia-smi, PROVENANCE.md) and its
comparison against the driver's information file recorded on an H200
(tests/fixtures/nvidia-procfs). The two are different lent H200s: the same minor and bus
address, different UUIDs, which the check must call a FAIL."""

from __future__ import annotations

from pathlib import Path

from agent.cdi.nvidia import read_gpu_minors
from agent.core.sysfs import Issues, SysfsReader
from tests.scriptmod import load_script

ROOT = Path(__file__).resolve().parents[2]
SMI = ROOT / "tests" / "fixtures" / "nvidia-smi"
PROC = ROOT / "tests" / "fixtures" / "nvidia-procfs" / "proc"


chk = load_script("gpu_attribution_check")
H200_0, H200_1 = "0000:00:06.0", "0000:00:07.0"


def test_the_facts_of_real_nvidia_smi_outputs() -> None:
    h200 = chk.parse_facts((SMI / "h200x2" / "q.txt").read_text())
    assert [(f.pci_bus_id, f.minor, f.compute_mode, f.runs_processes) for f in h200] == [
        (H200_0, 0, "Default", False),
        (H200_1, 1, "Default", False),
    ]
    assert h200[0].uuid == "GPU-fcb7ca97-bfcc-fefd-ace7-bc505d8b2d51"
    h100 = chk.parse_facts((SMI / "q.h100x8.535.161.08.txt").read_text())
    assert len(h100) == 8 and {f.compute_mode for f in h100} == {"Default"}
    assert sorted(f.minor for f in h100) == list(range(8))
    assert chk.parse_facts("") == ()


def test_the_checks_pass_and_fail_where_they_should() -> None:
    facts = chk.parse_facts((SMI / "h200x2" / "q.txt").read_text())
    minors = {
        g.pci_bus_id: (g.minor, g.uuid)
        for g in read_gpu_minors(Issues(SysfsReader(PROC))).values()
        if g.pci_bus_id
    }
    ours = chk.Ours(
        minors,
        compute_modes={H200_0: 0, H200_1: 3},
        busy={H200_0: False, H200_1: True},
    )
    rows = {(c.check, c.subject): c.status for c in chk.attribution_checks(facts, ours)}
    assert rows == {
        ("procfs device minor", H200_0): "PASS",
        ("procfs uuid", H200_0): "FAIL",  # another H200's information file
        ("compute mode", H200_0): "PASS",
        ("probe busy", H200_0): "PASS",
        ("procfs information", H200_1): "FAIL",  # not in the recorded procfs
        ("compute mode", H200_1): "FAIL",  # Exclusive_Process here, Default in nvidia-smi
        ("probe busy", H200_1): "FAIL",
    }
