#!/usr/bin/env python3
"""The NVLink traffic counters against traffic of a known size, on a GPU machine with two
GPUs or more joined by NVLink::

    python3 scripts/gpu_nvlink_traffic.py [--json OUT.json]

fabricscope's NVML sampler (the agent's own code, live NVML) reads every GPU's
``nvlink_transmitted_bytes`` and ``nvlink_received_bytes`` before and after

A. an all_reduce of ``--mib`` MiB repeated ``--iters`` times over every GPU (torchrun, one rank
   per GPU, ``NCCL_ALGO=Ring NCCL_PROTO=Simple`` so the bytes on the links are the ring's:
   each GPU sends and receives 2 (n-1)/n of the buffer per all_reduce), and
B. ``--copies`` copies of 1 GiB from GPU 0 to GPU 1 in one process (peer access over NVLink:
   GPU 0 transmits, GPU 1 receives, the others nothing).

Each GPU's counted bytes must be within ``--tolerance`` (default 2 %) of the bytes the
traffic moved; exit 1 otherwise, 2 when the machine has fewer than two GPUs or NVML gives no
NVLink traffic counter. Writes nothing into the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.nvml.sampler import NvmlSampler

NO_MULTICAST = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
JOB = """
import os, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
x = torch.ones(int(os.environ["ELEMS"]), device="cuda")
dist.barrier(); torch.cuda.synchronize()
if rank == 0: open(os.environ["READY"], "w").write("1")
while not os.path.exists(os.environ["GO"]): time.sleep(0.02)
dist.barrier(); torch.cuda.synchronize()
for _ in range(int(os.environ["ITERS"])):
    dist.all_reduce(x)
torch.cuda.synchronize(); dist.barrier(); torch.cuda.synchronize()
if rank == 0: open(os.environ["DONE"], "w").write("1")
while not os.path.exists(os.environ["END"]): time.sleep(0.02)
dist.destroy_process_group()
"""
COPY = """
import os, sys, time, torch
a = torch.ones(256 << 20, device="cuda:0"); b = torch.empty(256 << 20, device="cuda:1")
torch.cuda.synchronize(0); torch.cuda.synchronize(1)
open(os.environ["READY"], "w").write("1")
while not os.path.exists(os.environ["GO"]): time.sleep(0.02)
for _ in range(int(os.environ["COPIES"])): b.copy_(a)
torch.cuda.synchronize(0); torch.cuda.synchronize(1)
open(os.environ["DONE"], "w").write("1")
while not os.path.exists(os.environ["END"]): time.sleep(0.02)
"""


def counters(sampler: NvmlSampler) -> dict[int, tuple[int | None, int | None]]:
    snap = sampler.sample()
    return {g.index: (g.nvlink_transmitted_bytes, g.nvlink_received_bytes) for g in snap.gpus}


def wait_for(path: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} did not appear within {seconds:g} s")
        time.sleep(0.05)


def run_traffic(
    argv: list[str], env: dict[str, str], sampler: NvmlSampler, tmp: Path, log: Path
) -> tuple[dict[int, tuple[int | None, int | None]], dict[int, tuple[int | None, int | None]]]:
    """Start ``argv``, read the counters when it is ready, let it move its data, read again."""
    for name in ("ready", "go", "done", "end"):
        (tmp / name).unlink(missing_ok=True)
    flags = {k.upper(): str(tmp / k) for k in ("ready", "go", "done", "end")}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env={**env, **flags}, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(tmp / "ready", 180)
            time.sleep(1.0)
            before = counters(sampler)
            (tmp / "go").write_text("1")
            wait_for(tmp / "done", 300)
            time.sleep(1.0)
            after = counters(sampler)
            (tmp / "end").write_text("1")
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    return before, after


def judge(
    name: str,
    before: dict[int, tuple[int | None, int | None]],
    after: dict[int, tuple[int | None, int | None]],
    expected: dict[int, tuple[int, int]],
    tolerance: float,
) -> tuple[bool, list[dict[str, object]]]:
    ok = True
    rows: list[dict[str, object]] = []
    for gpu, (want_tx, want_rx) in sorted(expected.items()):
        (tx0, rx0), (tx1, rx1) = before[gpu], after[gpu]
        if None in (tx0, rx0, tx1, rx1):
            print(f"{name} GPU {gpu}: no NVLink traffic counter")
            return False, rows
        assert tx0 is not None and tx1 is not None and rx0 is not None and rx1 is not None
        got = (tx1 - tx0, rx1 - rx0)
        for what, g, w in (("transmitted", got[0], want_tx), ("received", got[1], want_rx)):
            err = abs(g - w) / w if w else (0.0 if g < (1 << 24) else float("inf"))
            hit = err <= tolerance if w else g < (1 << 24)  # idle GPUs: under 16 MiB
            ok &= hit
            rows.append(
                {"test": name, "gpu": gpu, "what": what, "counted": g, "expected": w,
                 "error": None if err == float("inf") else round(err, 6), "ok": hit}
            )  # fmt: skip
            print(
                f"{name} GPU {gpu} {what:11}: counted {g / 2**30:9.4f} GiB, expected "
                f"{w / 2**30:9.4f} GiB, {'ok' if hit else 'OFF'}"
                + (f" ({err * 100:.3f} %)" if w else " (idle: under 16 MiB)")
            )
    return ok, rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--json")
    ns = ap.parse_args()
    sampler = NvmlSampler(watch_xid=False, traffic_rotation=1)  # every pass: before and after
    try:
        first = counters(sampler)
        gpus = sorted(first)
        if len(gpus) < 2:
            print("fewer than two GPUs: nothing to move over NVLink")
            return 2
        if any(v is None for pair in first.values() for v in pair):
            print("NVML gives no NVLink traffic counter here (NOT_SUPPORTED?)")
            return 2
        env = {**os.environ, **NO_MULTICAST, "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            logs = Path(ns.json).parent if ns.json else tmp
            (tmp / "job.py").write_text(JOB)
            n = len(gpus)
            elems = ns.mib << 18  # float32
            a0, a1 = run_traffic(
                ["torchrun", "--standalone", f"--nproc_per_node={n}", str(tmp / "job.py")],
                {**env, "ELEMS": str(elems), "ITERS": str(ns.iters)},
                sampler,
                tmp,
                logs / "nvlink_traffic_allreduce.log",
            )
            per_gpu = ns.iters * 2 * (n - 1) * elems * 4 // n
            ok_a, rows_a = judge("all_reduce", a0, a1, dict.fromkeys(gpus, (per_gpu, per_gpu)),
                                 ns.tolerance)  # fmt: skip
            (tmp / "peer_copy.py").write_text(COPY)  # not copy.py: that name shadows the stdlib
            b0, b1 = run_traffic(
                [sys.executable, str(tmp / "peer_copy.py")],
                {**env, "COPIES": str(ns.copies)},
                sampler,
                tmp,
                logs / "nvlink_traffic_copy.log",
            )
            moved = ns.copies << 30
            want = {g: (0, 0) for g in gpus}
            want[gpus[0]] = (moved, 0)
            want[gpus[1]] = (0, moved)
            ok_b, rows_b = judge("copy 0->1", b0, b1, want, ns.tolerance)
    finally:
        sampler.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows_a + rows_b, indent=1) + "\n")
    print("PASS" if ok_a and ok_b else "FAIL")
    return 0 if ok_a and ok_b else 1


if __name__ == "__main__":
    sys.exit(main())
