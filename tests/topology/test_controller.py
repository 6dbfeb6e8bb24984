"""The label controller: the hold-down (pure), then the whole loop against the scenario's real
Prometheus (ibsim, real agents) and a stand-in API server's nodes endpoint
(``tests/topology/nodes_api.py``): labels applied only after the hold-down, a flap that
returns within it applying nothing, a node that left the map unlabelled, a Prometheus that
lost the series unlabelling nobody, every refusal counted; and the command itself."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.topology import render, source
from exporter.topology.controller import Controller, labels_reader
from exporter.topology.hold import HoldDown
from exporter.topology.kubeapi import KubeSettings
from exporter.topology.kubeapi import NodesApi as Client
from exporter.topology.model import FabricMap
from tests.kubeapi import clear_proxies
from tests.promharness import PROMTOOL, free_port
from tests.topology.lab import Served
from tests.topology.nodes_api import NodesApi
from tests.topology.scenario import SCENARIO

KEYS = render.LabelKeys()
T0, T1 = KEYS.key(0), KEYS.key(1)
OTHER = {"kubernetes.io/os": "linux", "example.com/rack": "r7"}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)


# --- the hold-down, pure ----------------------------------------------------------------


def test_a_change_waits_out_the_hold_down() -> None:
    hold = HoldDown(600)
    want = {"n1": {T0: "a"}}
    have: dict[str, Mapping[str, str]] = {"n1": {}}
    assert hold.step(0, want, have) == []
    assert hold.step(599, want, have) == []
    (change,) = hold.step(600, want, have)
    assert change.labels == {T0: "a"} and change.remove == ()


def test_a_flap_back_within_the_hold_down_changes_nothing() -> None:
    hold = HoldDown(600)
    have = {"n1": {T0: "a"}}
    assert hold.step(0, {"n1": {T0: "b"}}, have) == []
    assert hold.step(300, {"n1": {T0: "a"}}, have) == []  # back: the pending change is gone
    assert hold.pending == {}
    assert hold.step(400, {"n1": {T0: "b"}}, have) == []  # again: the clock starts again
    assert hold.step(900, {"n1": {T0: "b"}}, have) == []
    assert len(hold.step(1000, {"n1": {T0: "b"}}, have)) == 1


def test_a_new_desire_restarts_the_clock_and_unknown_nodes_are_ignored() -> None:
    hold = HoldDown(600)
    have = {"n1": {T0: "a", T1: "x"}}
    hold.step(0, {"n1": {T0: "b", T1: "x"}, "ghost": {T0: "z"}}, have)
    hold.step(500, {"n1": {T0: "c", T1: "x"}}, have)
    assert hold.step(700, {"n1": {T0: "c", T1: "x"}}, have) == []
    assert hold.step(1100, {}, have) == []  # gone from the map: held since 1100
    (gone,) = hold.step(1700, {}, have)
    assert gone.removal and gone.remove == (T0, T1)
    assert "ghost" not in hold.pending


# --- the loop, against the real map and the stand-in API --------------------------------


class Phase:
    """The map as Prometheus held it at one of the scenario's phases (``selector`` may
    match nothing: a Prometheus that lost the agents' series)."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.phase = 0
        self.selector = 'job="fabricscope"'
        self.url = served.url

    def read(self) -> FabricMap:
        client = PrometheusClient(ClientSettings(self.url, timeout=5))
        at = self.served.times[self.phase]
        return source.read(client, at, selector=self.selector).fmap


def _setup(
    served: Served, httpserver: HTTPServer, *, page: int = 500
) -> tuple[Phase, NodesApi, Controller]:
    api = NodesApi({h: dict(OTHER) for h in [*SCENARIO.hosts, "cpu1"]}, page=page)
    httpserver.expect_request("/api/v1/nodes").respond_with_handler(api.handle)
    for name in api.labels:
        httpserver.expect_request(f"/api/v1/nodes/{name}").respond_with_handler(api.handle)
    phase = Phase(served)
    ctl = Controller(
        labels_reader(phase.read, KEYS),
        Client(KubeSettings(httpserver.url_for("").rstrip("/"))),
        KEYS,
        HoldDown(600),
        max_removals=0.2,
    )
    return phase, api, ctl


def ours(api: NodesApi) -> dict[str, dict[str, str]]:
    return {n: {k: v for k, v in lb.items() if k in KEYS.keys} for n, lb in api.labels.items()}


def test_the_controller_applies_the_map_after_the_hold_down(
    scenario: Served, httpserver: HTTPServer
) -> None:
    phase, api, ctl = _setup(scenario, httpserver, page=3)  # the list comes in 3 pages
    assert ctl.run_pass(0) == []
    assert ctl.counters.pending == 7 and ctl.counters.placed == 7
    assert api.patches == []
    applied = ctl.run_pass(600)
    assert len(applied) == 7 and ctl.counters.changes == {"set": 7, "removed": 0}
    want = render.node_labels(phase.read(), KEYS)
    assert ours(api) == {**want, "cpu1": {}}
    # only our keys were sent, as a merge patch; the nodes' other labels are untouched
    for _name, ctype, body in api.patches:
        assert ctype == "application/merge-patch+json"
        assert set(body) == {"metadata"} and set(body["metadata"]) == {"labels"}
        assert set(body["metadata"]["labels"]) <= set(KEYS.keys)
    assert all(lb.items() >= OTHER.items() for lb in api.labels.values())
    assert ctl.run_pass(660) == []  # nothing left to do

    # a flap: the map changes (an uplink down, a leaf cut off, a leaf gone) and comes back
    # within the hold-down
    phase.phase = 1
    assert ctl.run_pass(700) == []
    # h4 gone; h5, h6 isolated; r1 on two planes; h1-h3 unmoved (lf1 kept sp1)
    assert ctl.counters.pending == 4
    phase.phase = 0
    assert ctl.run_pass(800) == []
    assert ctl.counters.pending == 0
    phase.phase = 1
    ctl.run_pass(900)
    assert ctl.run_pass(1400) == []
    n = len(api.patches)
    applied = ctl.run_pass(1500)  # held since 900
    assert {c.node for c in applied} == {"h4", "h5", "h6", "r1"}
    assert len(api.patches) == n + 4
    assert ours(api)["h4"] == {} and api.labels["h4"].items() >= OTHER.items()
    assert ours(api)["h5"][T1].startswith("isolated-")
    assert ctl.counters.changes == {"set": 10, "removed": 1}

    # Prometheus lost the agents' series: every node would lose its labels; none does
    phase.selector = 'job="nothing"'
    ctl.run_pass(2000)
    ctl.run_pass(2600)
    assert ctl.counters.removals_refused == 1
    assert all(ours(api)[h] for h in SCENARIO.hosts if h != "h4")

    # Prometheus unreachable: the pass fails, counted, nothing changes
    phase.url = "http://127.0.0.1:9"
    before = ours(api)
    assert ctl.run_pass(3300) == []
    assert ctl.counters.passes["map_error"] == 1 and ours(api) == before


def test_a_refused_patch_is_counted_and_retried(scenario: Served, httpserver: HTTPServer) -> None:
    _phase, api, ctl = _setup(scenario, httpserver)
    api.forbid_patch = True
    ctl.run_pass(0)
    assert ctl.run_pass(600) == []
    assert ctl.counters.patch_errors == 7 and ours(api)["h1"] == {}
    api.forbid_patch = False
    assert len(ctl.run_pass(660)) == 7  # still due: applied on the next pass
    assert ours(api)["h1"]


def _scrape(url: str, deadline: float) -> str:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body: str = resp.read().decode()
            if "fabricscope_topology_label_changes_total" in body and ('change="set"} 6.0' in body):
                return body
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"the controller's /metrics never showed its changes at {url}")
        time.sleep(0.2)


def test_the_running_controller_serves_its_counters_and_stops_on_sigterm(
    scenario: Served, httpserver: HTTPServer, tmp_path: Path
) -> None:
    """The loop as the Deployment runs it: every second, no hold-down, its own /metrics
    (lint-clean for promtool), SIGTERM ends it with status 0."""
    api = NodesApi({h: dict(OTHER) for h in SCENARIO.hosts})
    httpserver.expect_request("/api/v1/nodes").respond_with_handler(api.handle)
    for name in api.labels:
        httpserver.expect_request(f"/api/v1/nodes/{name}").respond_with_handler(api.handle)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "topology-controller",
            "--prometheus.url",
            scenario.url,
            "--kubernetes.api-url",
            httpserver.url_for("").rstrip("/"),
            "--kubernetes.token-file",
            "",
            "--interval",
            "1s",
            "--hold-down",
            "0",
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = _scrape(f"http://127.0.0.1:{port}/metrics", time.monotonic() + 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert 'fabricscope_topology_label_changes_total{change="removed"} 0.0' in body
    assert "fabricscope_topology_nodes_placed 6.0" in body  # h4's leaf is gone at "now"
    assert "fabricscope_topology_nodes_pending 0.0" in body
    assert re.search(r'fabricscope_topology_passes_total\{result="ok"\} [1-9]', body)
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(body)
    lint = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=body, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert err.count("fabric labels set") == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--label.prefix", "Bad/"], "--label.prefix"),
        (["--web.listen-address", "nowhere"], "is not [HOST]:PORT"),
        (["--max-removals", "2"], "--max-removals is a fraction"),
    ],
)
def test_bad_flags_are_one_line_and_status_2(args: list[str], message: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "topology-controller",
            "--prometheus.url",
            "http://127.0.0.1:9",
            "--kubernetes.api-url",
            "http://127.0.0.1:9",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_map_of_names_the_cluster_lacks_changes_nothing_and_says_why(
    httpserver: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Series whose instance is the scrape address, not the node's name: nothing matches."""
    api = NodesApi({"h1": dict(OTHER)})
    httpserver.expect_request("/api/v1/nodes").respond_with_handler(api.handle)
    ctl = Controller(
        lambda: {"10.0.0.1:10118": {T0: "0x1", T1: "0x2"}},
        Client(KubeSettings(httpserver.url_for("").rstrip("/"))),
        KEYS,
        HoldDown(0),
    )
    assert ctl.run_pass(0) == [] and ctl.run_pass(1) == []
    assert ctl.counters.placed == 0 and api.patches == []
    warnings = [
        r.getMessage() for r in caplog.records if "is a node of the cluster" in r.getMessage()
    ]
    assert len(warnings) == 1 and "10.0.0.1:10118" in warnings[0]
