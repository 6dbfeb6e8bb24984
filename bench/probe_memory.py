"""Where a probe's GPU memory goes, per process, at each stage of a 2-rank NCCL run on a
GPU node: CUDA context, NCCL communicator, then buffers of each size (NVML's per-process
figure, which is what nvidia-smi shows).

    NCCL_NVLS_ENABLE=0 python bench/probe_memory.py
"""

from __future__ import annotations

import os
import sys

import pynvml
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 1 << 20


def used_by_me(gpu: int) -> int:
    h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return int(p.usedGpuMemory or 0) // MiB
    return 0


def rank_main(rank: int, port: int) -> None:
    pynvml.nvmlInit()
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")
    stages = [("cuda context", used_by_me(rank))]
    if rank == 0:
        print(f"{stages[0][1]:6d} MiB  {stages[0][0]}", flush=True)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        device_id=torch.device("cuda", rank),
    )
    t = torch.ones(2, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    stages.append(("+ NCCL communicator, 8-byte all_reduce", used_by_me(rank)))
    for size in (64 * MiB, 256 * MiB):
        a = torch.ones(size // 4, device="cuda")
        b = torch.empty_like(a)
        dist.all_reduce(a)
        req = [dist.isend(a, 1 - rank), dist.irecv(b, 1 - rank)]
        for r in req:
            r.wait()
        torch.cuda.synchronize()
        stages.append(
            (f"+ 2 buffers of {size // MiB} MiB, all_reduce + sendrecv", used_by_me(rank))
        )
        del a, b
        torch.cuda.empty_cache()
        stages.append(("  after freeing them (empty_cache)", used_by_me(rank)))
    if rank == 0:
        for name, mib in stages:
            print(f"{mib:6d} MiB  {name}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29517
    mp.spawn(rank_main, args=(port,), nprocs=2)
