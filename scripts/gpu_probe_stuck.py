"""GPU check of the probe's bounded wait: a stream held far longer than the timeout (a
spinning kernel; a collective whose peer vanished holds it for ever) is given up at the
timeout with a TimeoutError, an error NCCL returns surfaces as an NcclError, and the
communicator is aborted and the process torn down within seconds, instead of blocking
until the launcher's deadline. One rank on one GPU; prints PASS/FAIL lines, exits 1 on a
FAIL.

    python3 scripts/gpu_probe_stuck.py [--timeout 5]
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from agent.probe.measure import collectives
from agent.probe.measure.nccl import attach


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timeout", type=float, default=5.0)
    ns = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, device_id=device
    )
    nccl, why = attach(dist.distributed_c10d._get_default_group(), device)
    if nccl is None:
        print(f"FAIL: no NCCL communicator: {why}")
        return 1
    # a kernel that holds the stream for ~3x the timeout (a collective whose peer vanished
    # holds it for ever): the bounded wait must give up at the timeout, not wait it out
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 2_000_000)
    torch.cuda._sleep(int(khz * 1e3 * ns.timeout * 3))  # type: ignore[no-untyped-call]
    mark = torch.cuda.Event()  # type: ignore[no-untyped-call]
    mark.record()
    began = time.monotonic()
    ok = True
    try:
        collectives.wait_event(mark, ns.timeout)
        print(f"FAIL: the stream was free after {time.monotonic() - began:.2f} s")
        ok = False
    except TimeoutError as exc:
        waited = time.monotonic() - began
        good = ns.timeout <= waited < ns.timeout + 2
        ok &= good
        print(f"{'PASS' if good else 'FAIL'}: gave up after {waited:.2f} s: {exc}")
    # the error path of NCCL's own calls: a peer that is not in the communicator
    buf = torch.zeros(1 << 20, device=device)
    stream = int(torch.cuda.current_stream(device).cuda_stream)
    try:
        nccl.sendrecv(buf.data_ptr(), buf.data_ptr(), 16, to=5, frm=5, stream=stream)
        print("FAIL: a send to rank 5 of 1 was accepted")
        ok = False
    except Exception as exc:
        print(f"PASS: NCCL's refusal surfaces as {type(exc).__name__}: {exc}")
    began = time.monotonic()
    dist.distributed_c10d._get_default_group()._get_backend(device).abort()
    dist.destroy_process_group()
    torch.cuda.synchronize(device)
    took = time.monotonic() - began
    good = took < 30
    ok &= good
    print(
        f"{'PASS' if good else 'FAIL'}: abort, teardown and a device synchronize took {took:.2f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
