"""MIG enumeration on a real GPU machine, read-only: what NVML answers to the MIG calls of
agent/nvml/mig.py, next to what nvidia-smi says, and one NVML sampler pass's MIG records.
Never changes the MIG mode (no call here sets anything).

    python3 scripts/gpu_mig_check.py OUTDIR

Writes OUTDIR/mig_check.txt (the commands and their output, for tests/fixtures) and
OUTDIR/mig_calls.json (the MIG answers as an NVML recording's calls). Exit 1 when the
sampler recorded an issue, or NVML and nvidia-smi disagree on a GPU's MIG mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent.nvml.api import LiveNvml
from agent.nvml.record import RecordingNvml
from agent.nvml.sampler import NvmlSampler


def run(cmd: list[str], out: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    out.append(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}".rstrip() + "\n")
    return proc.stdout


def main() -> int:
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    text: list[str] = []
    run(["nvidia-smi", "-L"], text)
    smi = run(
        [
            "nvidia-smi",
            "--query-gpu=index,uuid,mig.mode.current,mig.mode.pending",
            "--format=csv,noheader",
        ],
        text,
    )
    recorder = RecordingNvml(LiveNvml())
    sampler = NvmlSampler(lambda: recorder, watch_xid=False)
    try:
        snap = sampler.sample()
    finally:
        sampler.close()
    mig_calls = {
        k: v
        for k, v in recorder.recording()["calls"].items()  # type: ignore[union-attr]
        if "Mig" in k or ",mig" in k or "InstanceId" in k
    }
    text.append("$ python3 scripts/gpu_mig_check.py (one NvmlSampler pass, MIG records)")
    text.append(f"driver {snap.driver_version}, {len(snap.gpus)} GPUs")
    text.append(f"mig_modes: {snap.mig_modes!r}")
    text.append(f"mig_devices: {snap.mig_devices!r}")
    text.append(f"issues: {snap.issues!r}")
    text.append("NVML MIG answers: " + json.dumps(mig_calls, sort_keys=True))
    (outdir / "mig_check.txt").write_text("\n".join(text) + "\n")
    (outdir / "mig_calls.json").write_text(json.dumps(mig_calls, indent=1, sort_keys=True))
    print("\n".join(text))
    failed = bool(snap.issues)
    smi_modes = {}
    for line in smi.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            smi_modes[int(parts[0])] = parts[2]
    for mode in snap.mig_modes:
        want = "Enabled" if mode.enabled else "Disabled"
        if smi_modes.get(mode.gpu) != want:
            print(f"FAIL: GPU {mode.gpu}: NVML says {want}, nvidia-smi {smi_modes.get(mode.gpu)}")
            failed = True
    print("gpu_mig_check:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
