"""Where torch.distributed's GPU time per operation goes, on one GPU (one rank, NCCL
sending to itself: a copy through NCCL's p2p kernel): the same sendrecv timed six ways, each
a block of ``--ops`` operations between two CUDA events, median of ``--repeats`` blocks.

- ``graph+wait``: one CUDA graph of ops, each ``batch_isend_irecv`` then ``work.wait()``;
- ``graph+end``: one CUDA graph of ops, every op issued, the works waited at the end;
- ``graph+sync``: each op a send and a receive in torch's private coalescing manager
  without async ops (does that run on the current stream, as a synchronous collective
  does since torch 2.8?);
- ``eager+wait`` / ``eager+end`` / ``eager+sync``: the same without the graph.

Against ``sendrecv_perf -g 1`` (nccl-tests' out-of-place column) that says whether a gap is
the timing method, torch's per-op stream join, or NCCL under capture. What it showed on one
H200 (torch's CPU cost per call, 37-80 us eagerly; 5-20 us of joins in a graph) is why the
probe calls NCCL itself (agent/probe/measure/nccl.py); ``FABRICSCOPE_PROBE_TORCH_DATAPLANE=1``
makes the probe time torch's calls again for comparison.

    NCCL_NVLS_ENABLE=0 python bench/probe_graph_variants.py [--sizes 8K,1M,64M]
"""

from __future__ import annotations

import argparse
import socket
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _block(fn: Callable[[], None]) -> float:
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) * 1000.0  # us


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8K,64K,1M,8M,64M")
    p.add_argument("--ops", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    ns = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        device_id=torch.device("cuda", 0),
    )
    nccl = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    print(f"torch {torch.__version__} nccl {nccl} ops/block {ns.ops}")
    heads = ("graph+wait", "graph+end", "graph+sync", "eager+wait", "eager+end", "eager+sync")
    print(f"{'size':>8} " + " ".join(f"{h:>11}" for h in heads) + "  (us per op)")
    for size in (_size(t) for t in ns.sizes.split(",")):
        send = torch.ones(size // 4, device="cuda")
        recv = torch.zeros(size // 4, device="cuda")
        ops = [dist.P2POp(dist.isend, send, 0), dist.P2POp(dist.irecv, recv, 0)]

        def each_wait(ops: list[dist.P2POp] = ops) -> None:
            for _ in range(ns.ops):
                for w in dist.batch_isend_irecv(ops):
                    w.wait()

        def end_wait(ops: list[dist.P2POp] = ops) -> None:
            works = []
            for _ in range(ns.ops):
                works += dist.batch_isend_irecv(ops)
            for w in works:
                w.wait()

        def coalesced_sync(send: torch.Tensor = send, recv: torch.Tensor = recv) -> None:
            # torch's private coalescing manager without async ops: does the batch then
            # run on the current stream, as a synchronous collective does since torch 2.8?
            for _ in range(ns.ops):
                with _coalescing_manager(None, torch.device("cuda", 0), async_ops=False):
                    dist.isend(send, 0)
                    dist.irecv(recv, 0)

        row = []
        for fn in (each_wait, end_wait, coalesced_sync):
            fn()  # warm-up, and NCCL's connection to itself
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):
                fn()
            g.replay()
            row.append(statistics.median(_block(g.replay) for _ in range(ns.repeats)) / ns.ops)
            del g
        for fn in (each_wait, end_wait, coalesced_sync):
            row.append(statistics.median(_block(fn) for _ in range(ns.repeats)) / ns.ops)
        assert bool((recv == 1).all())
        print(f"{size:>8} " + " ".join(f"{v:>11.2f}" for v in row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
