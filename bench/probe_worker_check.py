import json, time, sys
from agent.probe.worker import run_local
from agent.probe.records import WorkerSpec, to_json
for k in ("all_reduce", "sendrecv", "latency"):
    t0 = time.monotonic()
    recs = run_local(WorkerSpec(kind=k, rank=0, world_size=2, master_addr="127.0.0.1", master_port=0, backend="nccl"), 2)
    print(f"== {k}: {time.monotonic()-t0:.1f}s wall", flush=True)
    for r in recs:
        print(to_json(r), flush=True)
