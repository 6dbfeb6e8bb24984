"""The metrics server with basic auth under a wrong-password flood: real sockets, a real
attacking process, in a private network namespace (so one IPv6 /64 can hold several
attacking addresses, and the server can listen on all of them).

Three IPv4 addresses and four addresses of one IPv6 /64, 16 keep-alive connections each,
send wrong passwords as fast as they are answered for ~10 s. Meanwhile a scraper with the
right (cached) password scrapes ``/metrics`` and ``/healthz`` twice a second, each on a new
connection, and a second user logs in for the first time: every one of them must be served.
(Before the auth gate, every cached scrape and every ``/healthz`` got ``503``: each wrong
password ran bcrypt behind one lock on a worker thread and counted against
``--web.max-requests``, which was checked before the cached-credentials path.)
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from exporter.http.authlimit import AuthLimits
from exporter.http.server import MetricsServer, serve
from exporter.http.webconfig import load_web_config
from exporter.metrics.exposition import ExpositionCache, render_text
from exporter.metrics.spec import Families, MetricSpec
from tests.loopnet import inside, private_net

FLOOD = Path(__file__).resolve().parents[1] / "wrongpass.py"
ATTACKERS_V4 = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
#: four addresses of one /64: one client to the limits
ATTACKERS_V6 = ("fd31:0:0:1::2", "fd31:0:0:1::3", "fd31:0:0:1::4", "fd31:0:0:1::5")
CONNECTIONS = 16
SCRAPES, EVERY = 20, 0.5
USER, PASSWORD = "prometheus", "right horse battery"
SECOND_USER, SECOND_PASSWORD = "grafana", "another staple"
#: bcrypt cost 8: ~20-40 ms a check here (the usual 10 is 4x that); enough for the flood to
#: hold every request slot of the old server, cheap enough for a shared CI machine
COST = 8

EVENTS = MetricSpec("fabricscope_test_events_total", "counter", "Test events.", ("device",))


@pytest.fixture
def cache() -> ExpositionCache:
    families = Families()
    for i in range(100):
        families.add(EVENTS, i, f"mlx5_{i}")
    cache = ExpositionCache()
    cache.set_fragment("test", render_text(families))
    return cache


@pytest.fixture
def netns() -> Iterator[str]:
    with private_net(ATTACKERS_V6) as name, inside(name):
        yield name


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def get(port: int, path: str, headers: dict[str, str]) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        r.read()
        return r.status, time.perf_counter() - t0
    finally:
        conn.close()


def served_counts(srv: MetricsServer) -> dict[str, int]:
    """fabricscope_http_connections_closed_total by reason, as /metrics serves it."""
    deadline = time.monotonic() + 5
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        try:
            conn.request("GET", "/metrics", headers=basic(USER, PASSWORD))
            body = conn.getresponse().read().decode()
        finally:
            conn.close()
        found = {
            m.group(1): int(float(m.group(2)))
            for m in re.finditer(
                r'^fabricscope_http_connections_closed_total\{reason="(\w+)"\} (\S+)$', body, re.M
            )
        }
        if found == srv.stats.counts or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_wrong_passwords_from_many_addresses_deny_no_scrape_and_no_healthz(
    tmp_path: Path, cache: ExpositionCache, netns: str
) -> None:
    users = {
        u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=COST)).decode()
        for u, p in ((USER, PASSWORD), (SECOND_USER, SECOND_PASSWORD))
    }
    config = tmp_path / "web.yml"
    config.write_text("basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items()))
    limits = AuthLimits()
    # every address of the namespace (IPv4 and IPv6): it is private to this test
    with serve(cache, ":0", web_config=load_web_config(str(config))) as srv:
        assert get(srv.port, "/metrics", basic(USER, PASSWORD))[0] == 200  # now cached
        duration = SCRAPES * EVERY + 5
        cmd = [sys.executable, str(FLOOD), "--port", str(srv.port), "--duration", str(duration)]
        cmd += ["--connections", str(CONNECTIONS), "--user", USER]
        for source in (*ATTACKERS_V4, *ATTACKERS_V6):
            cmd += ["--source", source]
        flood = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            assert flood.stdout is not None
            assert flood.stdout.readline() == "ready\n", "the flood did not start"
            began = time.monotonic()
            scrapes: list[tuple[int, float]] = []
            healthz: list[tuple[int, float]] = []
            first_login: tuple[int, float] | None = None
            for i in range(SCRAPES):
                time.sleep(max(0.0, began + i * EVERY - time.monotonic()))
                scrapes.append(get(srv.port, "/metrics", basic(USER, PASSWORD)))
                healthz.append(get(srv.port, "/healthz", {}))
                if i == SCRAPES // 2:
                    first_login = get(srv.port, "/metrics", basic(SECOND_USER, SECOND_PASSWORD))
            attacked_for = time.monotonic() - began
            flood.terminate()
            out, _ = flood.communicate(timeout=30)
        finally:
            flood.kill()
            flood.wait()
        served = served_counts(srv)
    result = json.loads(out.strip().splitlines()[-1])
    print("scrapes:", scrapes, "healthz:", healthz, "first login:", first_login, result, served)

    # The legitimate clients were served throughout, promptly.
    assert [s for s, _ in scrapes] == [200] * SCRAPES, scrapes
    assert [s for s, _ in healthz] == [200] * SCRAPES, healthz
    assert first_login is not None and first_login[0] == 200, first_login
    slow = [t for _, t in scrapes + healthz if t > 2.0]
    assert not slow, slow

    # The attack was on: every source kept sending; what was answered was 401 or 429 (the
    # /64's 64 connections, 16 at a time, mostly closed one another while waiting)
    statuses = result["statuses"]
    for source in (*ATTACKERS_V4, *ATTACKERS_V6):
        assert result["sent"].get(source, 0) > 20, (source, result)
        assert set(statuses[source]) <= {"401", "429"}, (source, statuses[source])
    # bcrypt ran for each client at most its burst plus one per interval: the four IPv6
    # addresses of one /64 shared one budget (per address they would have had four)
    allowed = limits.failures_burst + attacked_for / limits.failure_interval + 2
    for source in ATTACKERS_V4:
        assert statuses[source].get("401", 0) <= allowed, (source, statuses[source])
    v6_checked = sum(statuses[s].get("401", 0) for s in ATTACKERS_V6)
    assert v6_checked <= allowed, (v6_checked, allowed)
    # and Prometheus sees it
    assert served["auth_throttled"] > 0, served
    assert served["too_many_requests"] == 0, served
