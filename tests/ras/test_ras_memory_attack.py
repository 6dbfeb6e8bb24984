"""A job's RAS answer cannot take the agent's memory: a real agent asks two real TCP servers on
127.0.0.1 (tests/ras_standin.py, in a process of their own): a healthy 4-rank job, and a
hostile one that answers every STATUS with a valid status padded to just under the answer
cap (16 MiB, the default) with the shape that decodes into the most memory per byte
(``{},``: 24 times its size decoded, which took the RAS child to 445-466 MiB before its
answers were bounded). Over 6 passes the hostile job is refused before decoding and counted
(``reason="oversized"``), the healthy job's series are in every scrape, the RAS child is
never restarted; it runs under :data:`CEILING_BYTES`, the memory ceiling the kernel holds
it to (``RLIMIT_DATA``, docs/install.md#security), and its peak resident memory (``VmHWM``)
stays under it; so does the worst answer constructed that prices under the budget, which is
decoded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.core.ceiling import child_ceiling
from agent.ras.sampler import CEILING_PER_ANSWER_BYTE
from tests.procwatch import children, data_limit, peak_rss
from tests.ras.rasagent import start_ras_agent, value

ROOT = Path(__file__).resolve().parents[2]
ANSWER_CAP = 16 << 20
#: the RAS child's memory ceiling (docs/install.md#security), which the kernel holds it to
#: (RLIMIT_DATA): without a limit, 48 MiB and 14 times the answer cap (272 MiB), or 256 MiB
CEILING_BYTES = child_ceiling("ras", None, extra=CEILING_PER_ANSWER_BYTE * ANSWER_CAP)

STANDINS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.ras_standin import RasStandIn, job
cap, filler = int(sys.argv[2]), sys.argv[3].encode()
head = (b'{"nccl_version": "2.28.9", "communicators": [], '
        b'"ras": {"collection_time_sec": 0.1, "timeouts_count": 0}, "x": [')
hostile = head + filler * ((cap - 4096 - len(head)) // len(filler)) + b"0]}"
servers = {
    "good": RasStandIn([job(4, 100), job(4, 101), job(4, 102)]),
    "hostile": RasStandIn([hostile]),
}
print(json.dumps({n: s.port for n, s in servers.items()}), flush=True)
sys.stdin.read()
for s in servers.values():
    s.close()
"""


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def run_agent(tmp_path: Path, filler: bytes) -> Iterator[Agent]:
    servers = subprocess.Popen(
        [sys.executable, "-c", STANDINS, str(ROOT), str(ANSWER_CAP), filler.decode()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert servers.stdout is not None
    ports = json.loads(servers.stdout.readline())
    proc, port, log = start_ras_agent(tmp_path, ports, ANSWER_CAP)
    try:
        yield Agent(proc, port, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert servers.stdin is not None
        servers.stdin.close()
        servers.wait(10)


#: (filler, refused): the attack that took the child over 445 MiB (prices at 61 times its
#: size: refused before decoding), and the worst answer constructed that prices under the
#: budget (a float and 3 spaces: decodes into 4.6 times its size, a valid status with an
#: extra key, so it is decoded and answers)
FILLERS = {"empty objects": (b"{},", True), "spaced floats": (b"1.5,   ", False)}


@pytest.mark.parametrize("shape", sorted(FILLERS))
def test_a_hostile_answer_leaves_the_child_under_its_ceiling(tmp_path: Path, shape: str) -> None:
    filler, refused = FILLERS[shape]
    for agent in run_agent(tmp_path, filler):
        body, good_scrapes, child_peak, limited = watch(agent, refused)
        hostile = value(body, "fabricscope_nccl_ras_up", "hostile")
        oversized = value(
            body, "fabricscope_nccl_ras_query_errors_total", "hostile", reason="oversized"
        )
        print(f"{shape}: RAS child peak {child_peak >> 20} MiB, {good_scrapes} scrapes")
        if refused:
            assert hostile == 0 and oversized is not None and oversized >= PASSES
        else:
            assert hostile == 1 and oversized == 0
        assert 'fabricscope_sampler_child_restarts_total{sampler="ras"} 0.0' in body
        assert child_peak > 0, "the RAS child was never seen"
        assert limited, "the RAS child was never seen under its memory ceiling"
        assert child_peak < CEILING_BYTES, f"the RAS child peaked at {child_peak >> 20} MiB"
        logs = agent.logs()
        assert "Traceback" not in logs
        lines = [ln for ln in logs.splitlines() if ": oversized (" in ln]
        assert len(lines) == (1 if refused else 0), logs[-3000:]
        assert filler * 2 not in logs.encode()


#: passes the hostile job is asked (one every 2 s)
PASSES = 6


def watch(agent: Agent, refused: bool) -> tuple[str, int, int, bool]:
    """Scrapes every 0.25 s until the hostile job was asked :data:`PASSES` times (60 s at
    most): the healthy job's series must be in every scrape once they first appeared. The
    last body, the scrapes with the healthy job, the RAS child's peak resident bytes, whether
    it was seen held to its ceiling."""
    deadline = time.monotonic() + 60
    good = 0
    child_peak = 0
    limited = False
    body = ""
    t0 = time.monotonic()
    while time.monotonic() < deadline:
        assert agent.proc.poll() is None, agent.logs()[-3000:]
        try:
            body = agent.scrape()
        except OSError:
            time.sleep(0.1)
            continue
        for pid in children(agent.proc.pid):
            child_peak = max(child_peak, peak_rss(pid))
            limit = data_limit(pid)
            assert limit in (None, CEILING_BYTES), limit  # None: a child not started yet
            limited = limited or limit == CEILING_BYTES
        if value(body, "fabricscope_nccl_ras_up", "good") is None:
            assert good == 0, "the healthy job's series went missing from a scrape"
            time.sleep(0.1)
            continue
        good += 1
        assert value(body, "fabricscope_nccl_ras_up", "good") == 1, body[-2000:]
        assert value(body, "fabricscope_nccl_ras_ranks", "good", state="responsive") == 4
        if refused:
            done = (
                value(
                    body, "fabricscope_nccl_ras_query_errors_total", "hostile", reason="oversized"
                )
                or 0
            ) >= PASSES
        else:
            done = time.monotonic() - t0 > 2 * PASSES + 2
        if done:
            break
        time.sleep(0.25)
    return body, good, child_peak, limited
