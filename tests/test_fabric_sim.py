"""``fabricscope explain`` names the switch, on a simulated fat tree.

The fabric: ibsim serving a two-tier fat tree (``tests/ibsim_fabric.py``): 4 leaves, 2
spines, 8 hosts with two single-port HCAs each (``mlx5_0``, ``mlx5_1``), both HCAs of host
``2l-1`` and ``2l`` under leaf ``l`` (leaf ports 1-4), each leaf cabled to each spine (ports
5 and 6); OpenSM assigns the LIDs; the real infiniband-diags reach it through libumad2sim.

One agent per host, the real one in process (its InfiniBand and ibpeer samplers built by
``agent.samplers.build_specs`` and run through ``AgentApp``, kept across steps as a running
agent keeps them): the host's own counters from a sysfs tree this test writes, the far ends
of its cables and its share of its leaf's uplinks through the simulator. Every 15 s step
(simulated time) each agent renders its exposition once; the run is backfilled into a real
Prometheus (``promtool tsdb create-blocks-from openmetrics``), and ``explain`` asks it about
a job on all 8 hosts, as an operator would on bare metal (``--nodes``, ``--change-at``).

The simulator carries no data traffic: the switch ports' counters are set through ibsim's
console (``PerformanceSet``), the hosts' own counters (data moving, xmit_wait) are written
to their sysfs trees. Planted after a healthy first part, at once, each on its own leaf:

(a) leaf1: symbol errors and transmit discards on its 4 host-facing ports (switch end only:
    the hosts' own counters stay clean);
(b) leaf2: both uplinks count symbol errors and xmit_wait (throttled), and its 2 hosts' ports
    congest (their own xmit_wait rises);
(c) leaf3: one cable (host5's mlx5_0, leaf port 1) counts symbol and receive errors at the
    switch end;
(d) leaf4: nothing beyond the background every part of the run has (a trickle of symbol
    errors at the switch end of host7's mlx5_0 and at host8's own mlx5_1).

explain must name leaf1 and leaf2 (as switches), host5's cable (as that cable, not leaf3),
and nothing on leaf4 or the spines; over the healthy part alone, nothing.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.config import AgentConfig, IbPeerSettings, Paths, Sampling
from agent.core.sysfs import SysfsReader
from agent.samplers import Latest, build_specs
from exporter.app import AgentApp
from exporter.explain.checks import THRESHOLD
from exporter.explain.client import ClientSettings, PrometheusClient
from exporter.explain.discover import JobSpec
from exporter.explain.report import Report, explain
from tests.ibsim_fabric import FatTree, fat_tree, set_counter, write_host
from tests.ibsim_lab import IbsimLab, missing_tools
from tests.lab.backfill import openmetrics_lines
from tests.promharness import PROMTOOL
from tests.promharness import start_prometheus as _start_prometheus

HOSTS = tuple(f"host{i}" for i in range(1, 9))
DEVICES = ("mlx5_0", "mlx5_1")
STEP = 15.0
#: healthy steps (120 s: explain's shortest window), then faulty ones
HEALTHY = 9
FAULTY = 6
LEAF_GUIDS = {f"leaf{i}": f"0x{0x200000 + i - 1:016x}" for i in range(1, 5)}
#: 4-byte words each port sends and receives per step (~53 MB/s): a job moving data
WORDS = 200_000_000


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    start: float
    change: float
    end: float
    tree: FatTree


class Planter:
    """The counters a step sets: switch ports through ibsim's console (absolute values, as
    the PMA holds them), hosts' through their sysfs trees."""

    def __init__(self, lab: IbsimLab, roots: dict[str, Path]) -> None:
        self.lab = lab
        self.roots = roots
        self.switch: dict[tuple[str, int, str], int] = defaultdict(int)
        self.host: dict[tuple[str, str, str], int] = defaultdict(int)

    def switch_add(self, node: str, port: int, field: str, by: int) -> None:
        key = (node, port, field)
        self.switch[key] += by
        self.lab.command(
            f'PerformanceSet "{node}"[{port}] PortCounters.{field}={self.switch[key]}',
            "has been set",
        )

    def host_add(self, host: str, device: str, name: str, by: int) -> None:
        key = (host, device, name)
        self.host[key] += by
        set_counter(self.roots[host], device, name, self.host[key])

    def step(self, i: int) -> None:
        faulty = i >= HEALTHY
        for host in HOSTS:
            for dev in DEVICES:
                for name in ("port_xmit_data", "port_rcv_data"):
                    self.host_add(host, dev, name, WORDS)
                for name in ("port_xmit_packets", "port_rcv_packets"):
                    self.host_add(host, dev, name, WORDS // 1024)
        # the background, in both parts: a trickle nobody should be blamed for
        self.switch_add("leaf4", 1, "SymbolErrorCounter", 1)
        if i % 2:
            self.host_add("host8", "mlx5_1", "symbol_error", 1)
        if not faulty:
            return
        for port in (1, 2, 3, 4):  # (a) leaf1's host-facing ports, switch end
            self.switch_add("leaf1", port, "SymbolErrorCounter", 6)
            self.switch_add("leaf1", port, "PortXmitDiscards", 30)
        for port in (5, 6):  # (b) leaf2's uplinks
            self.switch_add("leaf2", port, "SymbolErrorCounter", 4)
            self.switch_add("leaf2", port, "PortXmitWait", 50_000_000)
        for host in ("host3", "host4"):  # ... and its hosts congest
            for dev in DEVICES:
                self.host_add(host, dev, "port_xmit_wait", WORDS // 2)
        self.switch_add("leaf3", 1, "SymbolErrorCounter", 5)  # (c) one cable
        self.switch_add("leaf3", 1, "PortRcvErrors", 3)


def _agent(root: Path) -> AgentApp:
    config = AgentConfig(
        paths=Paths(str(root / "sys"), str(root / "no-procfs")),
        # a pass of eight agents sharing one simulator on a loaded 2-core machine takes
        # seconds: generous timeouts, the passes are driven by the steps anyway
        sampling=Sampling(frozenset({"infiniband", "ibpeer"}), 60.0, 60.0),
        ibpeer=IbPeerSettings(command_prefix=(str(root / "ibsim-wrap"),), interval_seconds=60.0),
    )
    latest = Latest()
    specs = build_specs(config, SysfsReader(config.paths.sysfs), latest=latest, run_probes=False)
    return AgentApp(specs, latest, wall_clock=lambda: _Now.t)


class _Now:
    t = 0.0


def _backfill(lines: list[str], work: Path) -> Path:
    om = work / "fabric.om.txt"
    om.write_text("".join(lines) + "# EOF\n")
    tsdb = work / "tsdb"
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return tsdb


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    missing = missing_tools()
    assert not missing, f"install ibsim-utils infiniband-diags opensm: {missing}"
    work = tmp_path_factory.mktemp("fabric")
    tree = fat_tree(HOSTS, DEVICES, leaves=4, spines=2)
    lab = IbsimLab(work, tree.net)
    old = os.environ.get("IBSIM_SOCKNAME")
    os.environ["IBSIM_SOCKNAME"] = lab.sockname
    try:
        roots = {h: write_host(work / h, h, DEVICES) for h in HOSTS}
        apps = {h: _agent(roots[h]) for h in HOSTS}
        planter = Planter(lab, roots)
        steps = HEALTHY + FAULTY
        end = (time.time() // STEP) * STEP - STEP
        start = end - (steps - 1) * STEP
        lines: list[str] = []
        with ThreadPoolExecutor(4) as pool:
            for i in range(steps):
                _Now.t = start + i * STEP
                planter.step(i)
                bodies = list(pool.map(lambda h: apps[h].run_once(), HOSTS))
                for host, body in zip(HOSTS, bodies, strict=True):
                    lines += openmetrics_lines(body, host, _Now.t)
        tsdb = _backfill(lines, work)
    finally:
        lab.close()
        if old is None:
            os.environ.pop("IBSIM_SOCKNAME", None)
        else:
            os.environ["IBSIM_SOCKNAME"] = old
    with _start_prometheus(work / "prometheus", [], tsdb_path=tsdb) as prom:
        yield Served(prom.url, start, start + HEALTHY * STEP, end, tree)


def _explain(served: Served, start: float, end: float, change: float) -> Report:
    client = PrometheusClient(ClientSettings(served.url))
    job = JobSpec("fabric", nodes=HOSTS)
    return explain(client, job, start, end, change_at=change)


@pytest.fixture(scope="module")
def faulty(fabric: Served) -> Report:
    return _explain(fabric, fabric.start, fabric.end, fabric.change)


def test_the_agents_map_the_fabric(fabric: Served) -> None:
    """Every host port's leaf, and every leaf uplink's spine, as the agents exported them."""
    client = PrometheusClient(ClientSettings(fabric.url))
    window = int(fabric.end - fabric.start)
    info = client.query(
        f'last_over_time(fabricscope_infiniband_peer_info{{node_type="switch"}}[{window}s])',
        fabric.end,
    )
    seen = {
        (s.labels["instance"], s.labels["device"]): (
            s.labels["peer_description"],
            s.labels["peer_port"],
        )
        for s in info
    }
    assert seen == {key: (leaf, str(port)) for key, (leaf, port) in fabric.tree.leaf_of.items()}
    links = client.query(
        f"last_over_time(fabricscope_infiniband_switch_link_info[{window}s])", fabric.end
    )
    uplinks = {
        (s.labels["switch_description"], int(s.labels["switch_port"])): (
            s.labels["peer_description"],
            int(s.labels["peer_port"]),
        )
        for s in links
    }
    want = {(lf, k): far for lf, ups in fabric.tree.uplinks.items() for k, far in ups.items()}
    assert uplinks == want  # each uplink read by one of its leaf's hosts: none missing
    readers = defaultdict(set)
    for s in links:
        readers[(s.labels["switch_guid"], s.labels["switch_port"])].add(s.labels["instance"])
    assert all(len(r) == 1 for r in readers.values()), readers


def test_explain_names_the_leaves_and_the_cable(faulty: Report) -> None:
    causes = faulty.causes
    assert causes, "nothing stood out"
    switches = {f.device: f for f in causes if f.cause == "switch"}
    leaf1 = f"leaf1 ({LEAF_GUIDS['leaf1']})"
    leaf2 = f"leaf2 ({LEAF_GUIDS['leaf2']})"
    assert set(switches) == {leaf1, leaf2}, [(f.cause, f.device) for f in causes]
    # (a): the errors and the discards of all four ports, the hosts' own counters clean
    ev1 = "\n".join(switches[leaf1].evidence)
    assert "link errors on 4 of the job's 4 ports under it (host1, host2)" in ev1
    assert "drops on 4 of the job's 4 ports under it (host1, host2)" in ev1
    assert "symbol errors at the switch end of the cable" in ev1
    # (b): the uplinks and the congestion of its hosts
    ev2 = "\n".join(switches[leaf2].evidence)
    assert "2 of its uplinks show faults" in ev2
    assert "congestion on 4 of the job's 4 ports under it (host3, host4)" in ev2
    assert "uplink leaf2 port 5 -> spine1 port 2" in ev2
    # (c): the cable, not its leaf
    cable = [f for f in causes if f.instance == "host5"]
    assert [f.cause for f in cable] == ["ib_link"], [(f.cause, f.device) for f in causes]
    assert cable[0].device == "host5 mlx5_0/1, cable to leaf3 port 1"
    assert any("at the switch end of the cable" in e for e in cable[0].evidence)
    # the named switches' ports are their evidence, not findings of their own; leaf4's
    # background and the spines stand out nowhere
    named = {f.instance for f in causes if f.instance}
    assert named == {"host5"}, [(f.cause, f.device) for f in causes]
    assert not [f for f in causes if "leaf4" in f.device or "spine" in f.device]
    assert causes[0].cause == "switch"


def test_explain_finds_nothing_in_the_healthy_part(fabric: Served) -> None:
    healthy = _explain(fabric, fabric.start, fabric.change - STEP, fabric.start + 4 * STEP)
    assert healthy.causes == [], [(f.cause, f.device, f.score) for f in healthy.causes]
    # the background was there, and below the threshold
    assert max(c.worst for c in healthy.checked) < THRESHOLD
