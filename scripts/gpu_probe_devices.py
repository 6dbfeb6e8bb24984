"""Live check of the probe's GPU view on a GPU machine (run by ``scripts/gpu_verify.sh``).

The probe asks NVML which GPUs there are and which run compute processes through a child
process (:func:`agent.probe.run.devices.isolated_gpu_view`); this compares its answers with
``nvidia-smi`` on the same machine, live against live:

1. discovery names every GPU ``nvidia-smi -L`` lists (NCCL backend);
2. the busy set equals the GPUs ``nvidia-smi --query-compute-apps`` shows busy;
3. a torch process that creates a CUDA context on GPU 0 makes GPU 0 busy within 20 s, and
   idle again within 20 s of its exit;
4. this process never loads ``libnvidia-ml`` (the child does).

Prints one PASS/FAIL line per check; exit status 1 if any failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.probe.run.devices import NvmlBusyGpus, discover_slots, isolated_gpu_view

HOLD_GPU0 = (
    "import sys, time, torch; x = torch.ones(1, device='cuda:0'); "
    "print('ready', flush=True); sys.stdin.read()"
)


def smi(*args: str) -> list[str]:
    out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def smi_busy() -> frozenset[int]:
    """GPU indices with a compute process, by nvidia-smi (bus id -> index)."""
    rows = smi("--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    index = {bus.lower(): int(i) for i, bus in (row.split(", ") for row in rows)}
    busy = smi("--query-compute-apps=gpu_bus_id", "--format=csv,noheader")
    return frozenset(index[b.lower()] for b in busy if b.lower() in index)


def main() -> int:
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
        failed += not ok

    gpus = len([line for line in smi("-L") if line.startswith("GPU ")])
    view = isolated_gpu_view()
    try:
        backend, slots = discover_slots("auto", 2, view=view)
        check(
            backend == "nccl" and [s.label for s in slots] == list(range(gpus)),
            f"discovery: {backend} on {[s.label for s in slots]}; nvidia-smi lists {gpus} GPUs",
        )
        busy = NvmlBusyGpus(view)
        now, theirs = busy(), smi_busy()
        check(now == theirs, f"busy before: probe view {now}, nvidia-smi {set(theirs)}")
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_GPU0],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdin is not None
        ready = holder.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        while (answer := busy()) is None or 0 not in answer:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check(
            ready and answer is not None and 0 in answer and 0 in smi_busy(),
            f"a CUDA context on GPU 0 (pid {holder.pid}): probe view {answer}, "
            f"nvidia-smi {set(smi_busy())}",
        )
        holder.stdin.close()
        holder.wait(30)
        deadline = time.monotonic() + 20
        while (answer := busy()) is None or 0 in answer:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check(answer is not None and 0 not in answer, f"after it exited: probe view {answer}")
        with open("/proc/self/maps") as maps:
            here = "libnvidia-ml" in maps.read()
        child = view.pid
        with open(f"/proc/{child}/maps") as maps:
            there = "libnvidia-ml" in maps.read()
        check(not here and there, f"libnvidia-ml loaded here: {here}, in child {child}: {there}")
    finally:
        view.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
