"""Whatever a pod writes into its log never stalls the agent: a real agent process, real
files, a real scraper, real signals.

The agent (``fabricscope agent``, throughput sampler isolated in its child process, pods of
every namespace) reads a kubelet-layout pod log tree in a temporary directory. Its pod
watch talks to an API-server stand-in (pytest-httpserver serving ``/api/v1/pods`` lists in
the API's JSON shape, through a kubeconfig: no API server runs here), which gives one pod
the catastrophic annotation regex ``^(?:a+)+(?P<tokens_per_second>\\d+)$`` and another a
regex RE2 refuses (a backreference). While a good pod logs one throughput line every
0.1 s, the hostile pods write the 60,000-digit line that froze the agent for 3 minutes
(issue 19), lines built to blow up the catastrophic regex under a backtracking engine, and
megabytes of 16 KiB lines of digits that use up their CPU budget, and one line of 48 MiB
(3,072 partial CRI records the runtime would join). A scraper takes 20 scrapes over 10 s:
every one must answer 200 within 250 ms, and the good pod's series must keep moving; the
throughput child runs under its memory ceiling (its share of the chart's 512 MiB limit,
``RLIMIT_DATA``) and its resident memory stays below it. Then SIGTERM, in the middle of the
attack, must end the agent within 5 s.
"""

from __future__ import annotations

import json
import os
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
from pytest_httpserver import HTTPServer

from agent.core.ceiling import child_ceiling
from tests.agentrun import fabricscope
from tests.procwatch import children, data_limit, peak_rss
from tests.promharness import free_port

ROOT = Path(__file__).resolve().parents[2]
GOOD_UID = "0b8a7c1e-aaaa-4c43-8d6c-6a3a8f2f11aa"
DIGITS_UID = "0b8a7c1e-bbbb-4c43-8d6c-6a3a8f2f11aa"
REGEX_UID = "0b8a7c1e-cccc-4c43-8d6c-6a3a8f2f11aa"
BACKREF_UID = "0b8a7c1e-dddd-4c43-8d6c-6a3a8f2f11aa"
CATASTROPHIC = r"^(?:a+)+(?P<tokens_per_second>\d+)$"
BACKREF = r"(\d+) (?P<tokens_per_second>\1)"
TS = "2026-11-25T10:00:00.000000000Z"


def pod(uid: str, name: str, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "tenant", "annotations": annotations},
        "spec": {"nodeName": "node0"},
        "status": {"phase": "Running"},
    }


PODS = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {"resourceVersion": "100"},
    "items": [
        pod(GOOD_UID, "good-0", {}),
        pod(DIGITS_UID, "digits-0", {}),
        pod(REGEX_UID, "regex-0", {"fabricscope.io/throughput-regex": CATASTROPHIC}),
        pod(BACKREF_UID, "backref-0", {"fabricscope.io/throughput-regex": BACKREF}),
    ],
}


def handle(request: object) -> object:
    from werkzeug import Request, Response

    assert isinstance(request, Request)
    if request.args.get("watch") == "true":
        time.sleep(0.5)  # a watch that timed out with nothing new: the client resumes
        return Response("", mimetype="application/json")
    return Response(json.dumps(PODS), mimetype="application/json")


def log_of(root: Path, name: str, uid: str) -> Path:
    d = root / f"tenant_{name}_{uid}" / "trainer"
    d.mkdir(parents=True, exist_ok=True)
    return d / "0.log"


def cri(msg: str) -> str:
    return f"{TS} stdout F {msg}\n"


#: the good pod's writer (a line every 0.1 s) and the attacker, in one process
WRITERS = r"""
import sys, threading, time
good, digits, regex, backref, ts = sys.argv[1:6]
cri = lambda msg: f"{ts} stdout F {msg}\n"

def good_writer():
    n = 0
    with open(good, "a", buffering=1) as f:
        while True:
            n += 1
            f.write(cri(f"\t Train throughput/tokens_per_sec: {n}.5"))
            time.sleep(0.1)

threading.Thread(target=good_writer, daemon=True).start()
the_line = cri("iter 1: loss x, time " + "1" * 60_000)  # froze the agent for 3 minutes
dense = cri("iter 1: loss x, time " + "7" * 16_000) * 64  # 1 MiB within the parse window
evil = cri("a" * 40 + "!") * 1000  # 2**40 steps each under a backtracking engine
with open(digits, "a") as d:  # one 48 MiB line, in partial records
    d.write(f"{ts} stdout P {'9' * 16_384}\n" * 3072 + cri(" tokens_per_sec: 1"))
with open(digits, "a") as d, open(regex, "a") as r, open(backref, "a") as b:
    while True:
        d.write(the_line + dense)
        r.write(evil)
        b.write(cri("12 12"))
        for f in (d, r, b):
            f.flush()
        time.sleep(0.2)
"""


@dataclass
class Agent:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def scrape(self, timeout: float = 5.0) -> tuple[int, float, str]:
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read().decode()
            return resp.status, time.monotonic() - t0, body

    def logs(self) -> str:
        return self.log.read_text(errors="replace")


def value(body: str, series: str) -> float | None:
    m = re.search(rf"^{re.escape(series)} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


GOOD_SERIES = (
    'fabricscope_throughput_tokens_per_second{container="trainer",format="composer",'
    'job_name="",namespace="tenant",pod="good-0"}'
)


def errors(body: str, reason: str) -> float:
    v = value(body, f'fabricscope_throughput_errors_total{{reason="{reason}"}}')
    return -1.0 if v is None else v


#: the memory limit the chart gives the agent (deploy/helm/fabricscope/values.yaml)
POD_LIMIT = 512 << 20


@pytest.fixture
def agent(tmp_path: Path, httpserver: HTTPServer) -> Iterator[Agent]:
    httpserver.expect_request("/api/v1/pods", method="GET").respond_with_handler(handle)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": httpserver.url_for("/")}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    pods = tmp_path / "pods"
    for name, uid in (
        ("good-0", GOOD_UID),
        ("digits-0", DIGITS_UID),
        ("regex-0", REGEX_UID),
        ("backref-0", BACKREF_UID),
    ):
        log_of(pods, name, uid).write_text(cri("\t Train throughput/tokens_per_sec: 0.5"))
    port = free_port()
    log = tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", f"--path.sysfs={tmp_path}"),
                *(f"--path.procfs={tmp_path}", f"--path.pod-logs={pods}"),
                *(f"--web.listen-address=127.0.0.1:{port}", "--sampling.interval=1"),
                *("--sampling.timeout=1", "--throughput.pods=all"),
                *("--no-sampler.nvml", "--no-sampler.netdev", "--no-sampler.workload"),
                *("--no-sampler.infiniband", "--no-sampler.pci"),
                *("--kubernetes.node-name=node0", f"--kubelet.pod-resources-socket={tmp_path}/x"),
                "--throughput.stream-cpu-budget=0.02",
                f"--agent.memory-limit={POD_LIMIT}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    running = Agent(proc, port, log)
    try:
        deadline = time.monotonic() + 60  # a loaded CI machine: the pod watch's first list
        while True:
            assert proc.poll() is None, running.logs()
            try:
                body = running.scrape()[2]
                # the good pod's series, and the pod index has reached the child process
                if value(body, GOOD_SERIES) is not None and errors(body, "bad_regex") >= 1:
                    break
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, running.logs()[-3000:]
            time.sleep(0.1)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_hostile_pod_never_stalls_scrapes_or_shutdown(agent: Agent, tmp_path: Path) -> None:
    pods = tmp_path / "pods"
    good = log_of(pods, "good-0", GOOD_UID)
    digits = log_of(pods, "digits-0", DIGITS_UID)
    regex = log_of(pods, "regex-0", REGEX_UID)
    backref = log_of(pods, "backref-0", BACKREF_UID)
    # the writers run in their own process: the scraper's timings are the agent's alone
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITERS, str(good), str(digits), str(regex), str(backref), TS]
    )
    try:
        latencies: list[float] = []
        goods: list[float] = []
        ceiling = child_ceiling("throughput", POD_LIMIT)
        (child,) = children(agent.proc.pid)
        assert data_limit(child) == ceiling, "the throughput child has no memory ceiling"
        peak = 0
        t0 = time.monotonic()
        for i in range(20):
            time.sleep(max(0.0, t0 + i * 0.5 - time.monotonic()))
            peak = max([peak, *(peak_rss(pid) for pid in children(agent.proc.pid))])
            status, seconds, body = agent.scrape()
            assert status == 200
            latencies.append(seconds)
            v = value(body, GOOD_SERIES)
            if v is not None:
                goods.append(v)
        assert max(latencies) < 0.25, f"scrape latencies {latencies}"
        # the good pod's series kept flowing through the attack
        assert len(goods) >= 15 and goods[-1] > goods[0] + 20, goods
        assert errors(body, "too_long_to_parse") > 0
        assert errors(body, "cpu_budget") > 0
        assert errors(body, "bad_regex") == 1
        assert 'fabricscope_sampler_errors_total{reason="timeout",sampler="throughput"} 0.0' in body
        assert 'fabricscope_sampler_errors_total{reason="hung",sampler="throughput"} 0.0' in body
        assert (
            'fabricscope_sampler_errors_total{reason="memory_ceiling",sampler="throughput"} 0.0'
            in body
        )
        assert 0 < peak < ceiling, f"the throughput child peaked at {peak >> 20} MiB"
        print(f"throughput child: peak RSS {peak >> 20} MiB, ceiling {ceiling >> 20} MiB")
        # SIGHUP is not a silent death (the issue: exit 129, nothing logged)
        agent.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while "received SIGHUP: ignored" not in agent.logs():
            assert time.monotonic() < deadline, agent.logs()[-3000:]
            time.sleep(0.05)
        assert agent.scrape()[0] == 200 and agent.proc.poll() is None
        # SIGTERM in the middle of the attack: gone within 5 s, cleanly
        t_term = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(5) == 0, agent.logs()[-3000:]
        assert time.monotonic() - t_term < 5
    finally:
        writer.kill()
        writer.wait()
    logs = agent.logs()
    assert "Traceback" not in logs
    # one line naming the pod and the annotation; the tenant's text never in the log
    refused = [ln for ln in logs.splitlines() if "not usable" in ln]
    assert len(refused) == 1, logs[-3000:]
    assert "tenant/backref-0" in refused[0] and "fabricscope.io/throughput-regex" in refused[0]
    assert "linear-time (RE2)" in refused[0]
    assert "1" * 100 not in logs and "a" * 40 not in logs


def test_help_says_what_sighup_does() -> None:
    out = fabricscope(["agent", "--help"]).stdout
    assert "SIGHUP is ignored, with a log line" in " ".join(out.split())
