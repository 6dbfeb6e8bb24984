"""What the kubelet's pod-resources client costs between its calls, side by side.

Two client processes call ``List`` on one stand-in kubelet (a real gRPC server on a unix
socket, ``bench_sizing.kubelet``) every ``--every`` seconds for ``--duration`` seconds, at the
same time: one keeps a channel open between calls (the client before 2026-11-30), one opens a
channel for each call and closes it (``agent.kubernetes.podresources.PodResourcesClient``).
Each process's threads' CPU is read from ``/proc/self/task`` before and after, by thread name,
so gRPC's own threads (``event_engine``, ``grpc_global_tim``) are told from Python's. The
figure is millicores over the window, each and as a ratio.

    python bench/grpc_idle.py --duration 300 --json bench/results/grpc-idle.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TICKS = os.sysconf("SC_CLK_TCK")


def thread_ticks() -> dict[tuple[str, str], int]:
    """CPU ticks (user + system) of each of this process's threads, keyed by (tid, name)."""
    out: dict[tuple[str, str], int] = {}
    base = Path(f"/proc/{os.getpid()}/task")
    for task in base.iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended between the listing and the read
            continue
        out[(task.name, name)] = int(fields[11]) + int(fields[12])
    return out


def client(shape: str, sock: str, duration: float, every: float) -> dict[str, object]:
    """One client process's run: ``shape`` is ``kept`` or ``per-call``."""
    import grpc

    from agent.kubernetes import podresources_pb2 as pb
    from agent.kubernetes.podresources import _LIST, PodResourcesClient

    if shape == "per-call":
        lister = PodResourcesClient(sock)

        def call() -> None:
            lister.list()

    else:
        channel = grpc.insecure_channel("unix://" + sock)
        kept = channel.unary_unary(
            _LIST,
            request_serializer=pb.ListPodResourcesRequest.SerializeToString,
            response_deserializer=pb.ListPodResourcesResponse.FromString,
        )

        def call() -> None:
            kept(pb.ListPodResourcesRequest(), timeout=2.0)

    call()  # the first call starts gRPC's threads in both shapes
    time.sleep(2.0)
    before, start = thread_ticks(), time.monotonic()
    calls = 0
    while time.monotonic() - start < duration:
        time.sleep(every)
        call()
        calls += 1
    after, seconds = thread_ticks(), time.monotonic() - start
    by_name: dict[str, int] = {}
    for key, ticks in after.items():
        by_name[key[1]] = by_name.get(key[1], 0) + ticks - before.get(key, 0)
    total = sum(by_name.values())
    return {
        "shape": shape,
        "calls": calls,
        "seconds": round(seconds, 1),
        "millicores": round(total / TICKS / seconds * 1000, 2),
        "millicores_by_thread": {
            name: round(t / TICKS / seconds * 1000, 2) for name, t in sorted(by_name.items()) if t
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds measured")
    ap.add_argument("--every", type=float, default=15.0, help="seconds between calls")
    ap.add_argument("--json")
    ap.add_argument("--client", choices=("kept", "per-call"), help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.client:
        print(json.dumps(client(ns.client, ns.socket, ns.duration, ns.every)))
        return 0

    from bench_sizing import kubelet
    from jsonout import emit

    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fabricscope-grpc-")))
        sock = work / "kubelet.sock"
        stack.enter_context(kubelet(sock, [f"GPU-{i}" for i in range(8)], 8))
        procs = {
            shape: subprocess.Popen(
                [
                    *(sys.executable, __file__, "--client", shape, "--socket", str(sock)),
                    *("--duration", str(ns.duration), "--every", str(ns.every)),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for shape in ("kept", "per-call")
        }
        runs = {}
        for shape, proc in procs.items():
            out, _ = proc.communicate(timeout=ns.duration + 120)
            if proc.returncode != 0:
                print(f"grpc_idle: the {shape} client exited {proc.returncode}", file=sys.stderr)
                return 1
            runs[shape] = json.loads(out)
    kept, per_call = runs["kept"]["millicores"], runs["per-call"]["millicores"]
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, load {os.getloadavg()[0]:.1f}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "grpcio": __import__("grpc").__version__,
        "every_s": ns.every,
        "duration_s": ns.duration,
        "kept": runs["kept"],
        "per_call": runs["per-call"],
        "ratio_per_call_to_kept": round(per_call / kept, 3) if kept else None,
    }
    emit(result, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
