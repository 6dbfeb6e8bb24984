"""Runs the probe worker once per kind with NCCL over the local GPUs (2 ranks) and prints
one record per line, with each kind's wall time: the quick GPU check of the worker.

    NCCL_NVLS_ENABLE=0 python bench/probe_worker_check.py
"""

from __future__ import annotations

import time

from agent.probe.measure.launch import run_local
from agent.probe.measure.records import WorkerSpec, to_json

for kind in ("all_reduce", "sendrecv", "latency"):
    t0 = time.monotonic()
    spec = WorkerSpec(
        kind=kind, rank=0, world_size=2, master_addr="127.0.0.1", master_port=0, backend="nccl"
    )
    records = run_local(spec, 2)
    print(f"== {kind}: {time.monotonic() - t0:.1f}s wall", flush=True)
    for r in records:
        print(to_json(r), flush=True)
