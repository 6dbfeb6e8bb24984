"""A ``/healthz`` flood cannot get the agent restarted: a real agent serves metrics and a
health listener (``--web.health-listen-address``) on loopback; 40 source addresses
(127.0.1.1-40) x 16 keep-alive connections send ``GET /healthz`` back to back on one port
(tests/healthflood.py, a process of its own) while a kubelet-like prober from 127.0.0.1
probes ``/healthz`` on both ports with the chart's liveness timeout (5 s). Every probe must
answer 200 (before, 89 of 99 answered 503: at most 40 ``/healthz`` were answered at once
for all clients together), and the health listener's counters are on ``/metrics``."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.config import DEFAULT_OFF, SAMPLER_NAMES
from tests.promharness import free_port

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [f"127.0.1.{i}" for i in range(1, 41)]
#: the chart's liveness probe timeout
PROBE_TIMEOUT = 5.0


def probe(port: int) -> int:
    """One kubelet-like probe: a new connection, ``GET /healthz``, the status (0: failed)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        conn.request("GET", "/healthz", headers={"User-Agent": "kube-probe/1.31"})
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("target", ["health", "metrics"])
def test_a_healthz_flood_from_40_addresses_fails_no_probe(tmp_path: Path, target: str) -> None:
    port, health = free_port(), free_port()
    others = [f"--no-sampler.{n}" for n in SAMPLER_NAMES if n not in DEFAULT_OFF]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "exporter.cli", "agent", *others),
                f"--path.procfs={tmp_path}",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--web.health-listen-address=127.0.0.1:{health}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
        )
    flood = None
    try:
        deadline = time.monotonic() + 60
        while probe(health) != 200 or probe(port) != 200:
            assert agent.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        flood = subprocess.Popen(
            [
                *(sys.executable, str(ROOT / "tests" / "healthflood.py")),
                f"--port={health if target == 'health' else port}",
                *(f"--source={s}" for s in SOURCES),
                "--connections=16",
                "--duration=30",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "ready"
        statuses = []
        seconds = []
        t_end = time.monotonic() + 8
        while time.monotonic() < t_end:
            for p in (health, port):
                t0 = time.monotonic()
                statuses.append(probe(p))
                seconds.append(round(time.monotonic() - t0, 2))
            time.sleep(0.2)
        flood.terminate()
        summary = flood.communicate(timeout=30)[0]
        assert agent.poll() is None
        body = metrics(port)
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
            flood.wait()
        agent.kill()
        agent.wait()
    # the flood was real: thousands of /healthz answered while the probes ran
    answered = sum(json.loads(summary)["answers"].values())
    assert answered > 2000, summary
    failed = [s for s in statuses if s != 200]
    assert not failed, f"{len(failed)} of {len(statuses)} probes failed: {statuses} {seconds}"
    # the health listener's limits are counted on /metrics, next to the metrics server's
    assert 'fabricscope_http_health_connections_closed_total{reason="refused"}' in body
    assert 'fabricscope_http_connections_closed_total{reason="too_many_requests"} 0.0' in body
