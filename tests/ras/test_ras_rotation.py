"""No RAS endpoint is skipped in silence: past 16 endpoints a pass asks the 16 asked longest
ago, every endpoint is asked within ceil(n / 16) passes, and every pass that does not ask one
counts it (``fabricscope_nccl_ras_skipped_passes_total``). Checked on the rotation itself
and on a real agent asking 20 stand-in RAS servers on 127.0.0.1 (tests/ras_standin.py, in a
process of their own): every job gets its series, and the skips add up to the passes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agent.config import DEFAULT_OFF, SAMPLER_NAMES
from agent.ras.sampler import MAX_QUERIED, rotate
from agent.ras.targets import Endpoint
from tests.promharness import free_port

ROOT = Path(__file__).resolve().parents[2]
JOBS = 20

STANDINS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.ras_standin import RasStandIn, job
servers = [RasStandIn([job(2, 100 + i)]) for i in range(int(sys.argv[2]))]
print(json.dumps([s.port for s in servers]), flush=True)
sys.stdin.read()
for s in servers:
    s.close()
"""


def endpoint(i: int) -> Endpoint:
    return Endpoint("127.0.0.1", 1000 + i, "", f"j{i}", "queried", ())


def test_every_endpoint_is_asked_within_ceil_n_over_16_passes() -> None:
    for n in (1, 16, 17, 33, 100):
        wanted = [endpoint(i) for i in range(n)]
        asked_in: dict[str, int] = {}
        rounds = -(-n // MAX_QUERIED)
        for p in range(3 * rounds):
            chosen = rotate(wanted, asked_in)
            assert len(chosen) == min(n, MAX_QUERIED)
            assert [e for e in wanted if e in chosen] == list(chosen)  # plan order kept
            for e in chosen:
                asked_in[e.label] = p
            if p % rounds == rounds - 1:  # every endpoint asked in the last `rounds` passes
                assert all(p - asked_in[e.label] < rounds for e in wanted), (n, p)


def test_a_newcomer_is_asked_in_the_next_pass() -> None:
    wanted = [endpoint(i) for i in range(17)]
    asked_in = {e.label: 5 for e in wanted}
    new = endpoint(99)
    assert new in rotate([*wanted, new], asked_in)


def total(body: str, name: str) -> float:
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def value(body: str, name: str, job: str) -> float | None:
    for line in body.splitlines():
        if line.startswith(name + "{") and f'job_name="{job}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_agent_with_20_endpoints_asks_every_one_and_counts_the_skips(tmp_path: Path) -> None:
    servers = subprocess.Popen(
        [sys.executable, "-c", STANDINS, str(ROOT), str(JOBS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert servers.stdout is not None and servers.stdin is not None
    ports = json.loads(servers.stdout.readline())
    port = free_port()
    log = tmp_path / "agent.log"
    others = [f"--no-sampler.{n}" for n in SAMPLER_NAMES if n != "ras" and n not in DEFAULT_OFF]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", *others),
                *(f"--path.procfs={tmp_path}", f"--web.listen-address=127.0.0.1:{port}"),
                *(f"--ras.endpoint=127.0.0.1:{p}=j{i:02d}" for i, p in enumerate(ports)),
                *("--ras.interval=2s", "--ras.timeout=1500ms", "--ras.gather-timeout=1"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 60
        body = ""
        names = [f"j{i:02d}" for i in range(JOBS)]
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            queries = total(body, "fabricscope_nccl_ras_queries_total")
            if all(value(body, "fabricscope_nccl_ras_up", j) == 1 for j in names) and (
                queries >= 3 * MAX_QUERIED
            ):
                break
            time.sleep(0.2)
        up = {j: value(body, "fabricscope_nccl_ras_up", j) for j in names}
        assert all(v == 1 for v in up.values()), (up, log.read_text()[-3000:])
        skipped = {j: value(body, "fabricscope_nccl_ras_skipped_passes_total", j) for j in names}
        assert all(v is not None for v in skipped.values()), skipped
        total_skips = sum(v or 0 for v in skipped.values())
        queries = total(body, "fabricscope_nccl_ras_queries_total")
        passes = queries / MAX_QUERIED
        # every pass asks 16 and skips the other 4, counted
        assert total_skips == passes * (JOBS - MAX_QUERIED), (total_skips, queries)
        assert max(v or 0 for v in skipped.values()) <= passes / 2 + 1
        logs = log.read_text()
        assert "is asked in turn, not every pass" in logs and "Traceback" not in logs
    finally:
        proc.kill()
        proc.wait()
        servers.stdin.close()
        servers.wait(10)
