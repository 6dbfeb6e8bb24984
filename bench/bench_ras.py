"""CPU per RAS query: what the agent's RAS child spends to ask a job's RAS service, parse its
answer and track it (agent/ras: wire.query, parse.parse_status, track.JobTracker), side by side
with the peer: the same conversation read to its end and thrown away (what ``ncclras -f json``
or ``nc`` does), in one run, as a ratio.

The answers are served by the stand-in RAS server (tests/ras_standin.py, a real TCP server on
127.0.0.1, in its own process so its CPU is not counted here):

- ``recorded-4-healthy`` / ``recorded-4-stopped``: real NCCL 2.28.9 answers of a 4-rank job
  (tests/fixtures/ras: healthy, and with rank 3 SIGSTOPped, which needs 2.28's missing comma
  repaired);
- ``synthetic-N``: a job of N ranks in NCCL's JSON layout (tests/ras_standin.py): one world
  communicator and one of 8 ranks per node, every rank in both (2N rank entries), counts
  moving between answers.

CPU is the querying thread's own (``time.thread_time``), wall time from connect to the parsed
summary. Run:

    .venv/bin/python bench/bench_ras.py [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.ras.parse import parse_status  # noqa: E402
from agent.ras.track import JobTracker  # noqa: E402
from agent.ras.wire import query  # noqa: E402
from tests.ras_standin import communicator, rank_entry, status_json  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "ras" / "answers.jsonl"

SERVE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.ras_standin import RasStandIn
distinct = [bytes.fromhex(h) for h in json.loads(sys.stdin.readline())]
count = int(sys.stdin.readline())
with RasStandIn([distinct[i % len(distinct)] for i in range(count)]) as s:
    print(s.port, flush=True)
    sys.stdin.read()
"""


def synthetic(n: int, step: int) -> bytes:
    """An n-rank job's answer; every rank's AllReduce count is ``step`` (moving per answer)."""
    world = communicator(
        [
            rank_entry(
                r,
                host=f"10.0.{r // 8 // 250}.{r // 8 % 250 + 1}",
                pid=1000 + r % 8,
                gpu=r % 8,
                allreduce=step,
            )
            for r in range(n)
        ],
        hash_="0x1",
    )
    nodes = [
        communicator(
            [
                rank_entry(
                    i,
                    host=f"10.0.{node // 250}.{node % 250 + 1}",
                    pid=1000 + i,
                    gpu=i,
                    allreduce=step * 2,
                )
                for i in range(8)
            ],
            hash_=f"0x{node + 2:x}",
        )
        for node in range(n // 8)
    ]
    return status_json([world, *nodes])


def raw(port: int) -> int:
    """The peer: the same conversation, the answer read to its end and dropped."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        f = s.makefile("rb")
        for cmd in (b"CLIENT PROTOCOL 2\n", b"TIMEOUT 5\n", b"SET FORMAT json\n"):
            s.sendall(cmd)
            f.readline()
        s.sendall(b"STATUS\n")
        n = 0
        while chunk := f.read1(65536):
            n += len(chunk)
        return n


def run_case(name: str, answers: list[bytes], rounds: int) -> dict[str, object]:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(ROOT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    # the stand-in replays in order: the distinct answers in turn, 2 x rounds of them
    server.stdin.write(json.dumps([a.hex() for a in answers]) + f"\n{2 * rounds}\n")
    server.stdin.flush()
    port = int(server.stdout.readline())
    try:
        ours_cpu, ours_wall, peer_cpu, peer_wall = [], [], [], []
        tracker = JobTracker()
        for _ in range(rounds):
            c0, w0 = time.thread_time(), time.perf_counter()
            got = query("127.0.0.1", port, deadline_seconds=30, max_bytes=64 << 20)
            status = tracker.update(parse_status(got.data), time.monotonic())
            ours_cpu.append(time.thread_time() - c0)
            ours_wall.append(time.perf_counter() - w0)
            assert status.ranks
            c0, w0 = time.thread_time(), time.perf_counter()
            size = raw(port)
            peer_cpu.append(time.thread_time() - c0)
            peer_wall.append(time.perf_counter() - w0)
        med = statistics.median
        return {
            "case": name,
            "answer_bytes": size,
            "rank_entries": sum(
                len(c.ranks) + len(c.missing) for c in parse_status(answers[0]).communicators
            ),
            "ours_cpu_ms": round(med(ours_cpu) * 1e3, 3),
            "peer_cpu_ms": round(med(peer_cpu) * 1e3, 3),
            "cpu_ratio": round(med(ours_cpu) / med(peer_cpu), 1),
            "ours_wall_ms": round(med(ours_wall) * 1e3, 3),
            "peer_wall_ms": round(med(peer_wall) * 1e3, 3),
            "rounds": rounds,
        }
    finally:
        server.stdin.close()
        server.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    records = [json.loads(line) for line in FIXTURE.open()]
    by_tag = {r["tag"]: r["answer"].encode() for r in records if r.get("bytes")}
    cases = [
        ("recorded-4-healthy", [by_tag["healthy-json-status"]], 200),
        ("recorded-4-stopped", [by_tag["stopped+35-json-verbose"]], 200),
        *(
            (f"synthetic-{n}", [synthetic(n, s) for s in range(1, 4)], rounds)
            for n, rounds in ((64, 100), (1024, 20), (8192, 5))
        ),
    ]
    rows = [run_case(*c) for c in cases]
    cpu = platform.processor() or platform.machine()
    machine = f"{platform.node()} ({cpu}), Python {platform.python_version()}"
    print(f"# bench_ras.py on {machine}, {time.strftime('%Y-%m-%d')}")
    print(
        "| answer | bytes | rank entries | agent CPU/query (ms) | peer CPU/query (ms) | ratio "
        "| agent wall (ms) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['case']} | {r['answer_bytes']} | {r['rank_entries']} | {r['ours_cpu_ms']} | "
            f"{r['peer_cpu_ms']} | {r['cpu_ratio']} | {r['ours_wall_ms']} |"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
