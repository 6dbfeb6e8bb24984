"""What the kubelet's pod-resources client costs between its calls, side by side.

Two client processes call ``List`` on one stand-in kubelet (a real gRPC server on a unix
socket, ``bench_sizing.kubelet``) every ``--every`` seconds for ``--duration`` seconds, at the
same time: one keeps a channel open between calls (the client before 2026-11-30), one opens a
channel for each call and closes it (``agent.kubernetes.podresources.PodResourcesClient``).
Each process's threads' CPU is read from ``/proc/self/task`` before and after, by thread name
so gRPC's own threads (``event_engine``, ``grpc_global_tim``) are told from Python's. The
figure is millicores over the window, each and as a ratio.

    python bench/grpc_idle.py --duration 300 --json bench/results/grpc-idle.json

``--growth CALLS``: does a channel per call leave anything behind? The per-call client calls
``List`` back to back ``CALLS`` times in a process of its own (the stand-in kubelet is in
this one), its RSS and anonymous memory sampled
``--samples`` times, and fits them as the soak fits time (``bench/soak.py``'s ``fit``), each
call placed ``--every`` seconds after the last (the sampling interval), the first tenth not
fitted:

    python bench/grpc_idle.py --growth 40000 --json bench/results/grpc-growth.json
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
    from bench_sizing import by_thread_name, thread_cpu

    before, start = thread_cpu(os.getpid()), time.monotonic()
    calls = 0
    while time.monotonic() - start < duration:
        time.sleep(every)
        call()
        calls += 1
    after, seconds = thread_cpu(os.getpid()), time.monotonic() - start
    threads = by_thread_name(before, after, seconds)
    return {
        "shape": shape,
        "calls": calls,
        "seconds": round(seconds, 1),
        "millicores": round(sum(threads.values()), 2),
        "millicores_by_thread": threads,
    }


def _about(ns: argparse.Namespace) -> dict[str, object]:
    import grpc

    return {
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, load {os.getloadavg()[0]:.1f}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "grpcio": grpc.__version__,
        "every_s": ns.every,
    }


def growth(sock: str, calls: int, samples: int, every: float) -> dict[str, object]:
    """The per-call client's memory over ``calls`` back-to-back calls, fitted per call."""
    from soak import fit, usage

    from agent.kubernetes.podresources import PodResourcesClient

    lister = PodResourcesClient(sock)
    step = calls // samples
    points: list[tuple[int, int, int]] = []  # calls, RSS KiB, anonymous KiB
    t0, c0 = time.monotonic(), time.process_time()
    for n in range(1, calls + 1):
        lister.list()
        if n % step == 0:
            rss, _, _, anon = usage(os.getpid())
            points.append((n, rss // 1024, anon // 1024))
    cpu = time.process_time() - c0
    first = calls // 10
    fitted = [p for p in points if p[0] > first]
    slopes = {
        "rss": fit([[(n * every, rss * 1024.0) for n, rss, _ in fitted]]),
        "anonymous": fit([[(n * every, anon * 1024.0) for n, _, anon in fitted]]),
    }
    return {
        "calls": calls,
        "wall_seconds": round(time.monotonic() - t0, 1),
        "cpu_ms_per_call": round(cpu / calls * 1000, 3),
        "each_call_placed_seconds_apart": every,
        "fitted_from_call": first,
        "calls_fitted_in_days": round((calls - first) * every / 86400, 1),
        "kib": {"first_sample": points[0][1:], "last_sample": points[-1][1:]},
        "growth": {k: f.as_dict(1.0) for k, f in slopes.items()},
        "samples": points,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=300.0, help="seconds measured")
    ap.add_argument("--every", type=float, default=15.0, help="seconds between calls")
    ap.add_argument("--json")
    ap.add_argument("--growth", type=int, default=0, metavar="CALLS")
    ap.add_argument("--samples", type=int, default=50, help="with --growth")
    ap.add_argument("--client", choices=("kept", "per-call"), help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.client and ns.growth:
        print(json.dumps(growth(ns.socket, ns.growth, ns.samples, ns.every)))
        return 0
    if ns.client:
        print(json.dumps(client(ns.client, ns.socket, ns.duration, ns.every)))
        return 0

    from bench_sizing import kubelet
    from jsonout import emit

    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fabricscope-grpc-")))
        sock = work / "kubelet.sock"
        stack.enter_context(kubelet(sock, [f"GPU-{i}" for i in range(8)], 8))
        if ns.growth:
            if ns.samples < 10 or ns.growth < 10 * ns.samples:
                ap.error("--growth needs --samples >= 10 and CALLS >= 10 x --samples")
            got = subprocess.run(
                [
                    *(sys.executable, __file__, "--client", "per-call", "--socket", str(sock)),
                    *("--growth", str(ns.growth), "--samples", str(ns.samples)),
                    *("--every", str(ns.every)),
                ],
                stdout=subprocess.PIPE,
                text=True,
                check=False,
            )
            if got.returncode != 0:
                print(f"grpc_idle: the client exited {got.returncode}", file=sys.stderr)
                return 1
            emit({**_about(ns), **json.loads(got.stdout)}, ns.json)
            return 0
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
        **_about(ns),
        "duration_s": ns.duration,
        "kept": runs["kept"],
        "per_call": runs["per-call"],
        "ratio_per_call_to_kept": round(per_call / kept, 3) if kept else None,
    }
    emit(result, ns.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
