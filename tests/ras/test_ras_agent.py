"""Whatever a job's RAS port answers never stalls the agent: a real agent process asks real
TCP servers on 127.0.0.1 (tests/ras_standin.py, in a process of their own so the scraper's
timings are the agent's alone): one speaking NCCL's protocol with a job whose rank 2 stops
answering, and one each of every hostile behaviour (silent, slow, endless, huge, malformed
JSON, another protocol version, not RAS at all, no JSON, reset mid-answer). A scraper takes
scrapes for 10 s: every one must answer 200 within 250 ms, the good job's series must name
the stopped rank, each hostile endpoint must be down with its reason counted, the agent logs
no traceback and none of the servers' bytes, and SIGTERM ends it within 5 s."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agentrun import fabricscope
from tests.ras.rasagent import start_ras_agent, value

ROOT = Path(__file__).resolve().parents[2]

#: (job name, behaviour, the reason its queries fail; None: answers)
SERVERS = (
    ("good", "good", None),
    ("silent", "silent", "timeout"),
    ("slow", "slow", "timeout"),
    ("endless", "endless", "too_large"),
    ("huge", "huge", "too_large"),
    ("malformed", "malformed", "malformed"),
    ("v3", "wrong_protocol", "protocol"),
    ("http", "not_ras", "protocol"),
    ("old", "no_json", "unsupported"),
    ("reset", "reset", "reset"),
)

STANDINS = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from tests.ras_standin import RasStandIn, job
servers = {}
for name, behaviour in json.loads(sys.argv[2]):
    if behaviour == "malformed":
        servers[name] = RasStandIn([b'{"nccl_version": "2.28.9", "communicators": [' * 50])
    elif behaviour == "good":
        servers[name] = RasStandIn(
            [job(4, 100), job(4, 101), job(4, 102, stopped=[2])]
        )
    else:
        servers[name] = RasStandIn([job(4, 1)], behaviour=behaviour, delay=0.2)
print(json.dumps({n: s.port for n, s in servers.items()}), flush=True)
sys.stdin.read()  # until the test closes it
for s in servers.values():
    s.close()
"""


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    ports: dict[str, int]

    def scrape(self) -> tuple[int, float, str]:
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            body = r.read().decode()
            return r.status, time.monotonic() - t0, body

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    servers = subprocess.Popen(
        [sys.executable, "-c", STANDINS, str(ROOT), json.dumps([s[:2] for s in SERVERS])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert servers.stdout is not None
    ports = json.loads(servers.stdout.readline())
    proc, port, log = start_ras_agent(
        tmp_path, {name: ports[name] for name, _, _ in SERVERS}, 4 << 20
    )
    running = Agent(proc, port, log, ports)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, running.logs()
            try:
                if value(running.scrape()[2], "fabricscope_nccl_ras_up", "good") == 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, running.logs()[-3000:]
            time.sleep(0.1)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert servers.stdin is not None
        servers.stdin.close()
        servers.wait(10)


def test_hostile_ras_ports_never_stall_scrapes_or_shutdown(agent: Agent) -> None:
    latencies: list[float] = []
    t0 = time.monotonic()
    body = ""
    for i in range(20):
        time.sleep(max(0.0, t0 + i * 0.5 - time.monotonic()))
        status, seconds, body = agent.scrape()
        assert status == 200
        latencies.append(seconds)
    assert max(latencies) < 0.25, f"scrape latencies {latencies}"
    # the good job: its rank 2 stopped answering, named with its pid and GPU
    assert value(body, "fabricscope_nccl_ras_up", "good") == 1
    assert value(body, "fabricscope_nccl_ras_ranks", "good", state="unresponsive") == 1
    assert value(body, "fabricscope_nccl_ras_ranks", "good", state="responsive") == 3
    named = [ln for ln in body.splitlines() if ln.startswith("fabricscope_nccl_ras_rank_info{")]
    assert len(named) == 1
    assert all(f in named[0] for f in ('rank="2"', 'state="unresponsive"', 'pid="1002"', 'gpu="2"'))
    for name, _, reason in SERVERS[1:]:
        assert value(body, "fabricscope_nccl_ras_up", name) == 0, name
        failed = value(body, "fabricscope_nccl_ras_query_errors_total", name, reason=reason)
        assert failed is not None and failed >= 1, (name, reason)
        assert value(body, "fabricscope_nccl_ras_ranks", name, state="responsive") is None
    for reason in ("hung", "crashed", "timeout", "exception"):
        assert f'fabricscope_sampler_errors_total{{reason="{reason}",sampler="ras"}} 0.0' in body
    t_term = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(5) == 0, agent.logs()[-3000:]
    assert time.monotonic() - t_term < 5
    logs = agent.logs()
    assert "Traceback" not in logs
    # one warning per endpoint going down, never the servers' bytes
    for name, _, reason in SERVERS[1:]:
        lines = [ln for ln in logs.splitlines() if f":{agent.ports[name]}: {reason}" in ln]
        assert len(lines) == 1, (name, logs[-3000:])
    assert "HTTP/1.1" not in logs and "SERVER PROTOCOL 3" not in logs
    assert not re.search(r"rank.: 0, .host", logs)


def test_help_names_the_ras_flags() -> None:
    out = fabricscope(["agent", "--help"]).stdout
    for flag in ("--ras.interval", "--ras.endpoint", "--ras.leader", "--ras.max-answer-bytes"):
        assert flag in out
