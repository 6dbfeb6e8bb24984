"""The fabric lab: a simulated fat tree with one real agent per host, backfilled into a real
Prometheus (``tests/explain/test_fabric_sim.py``; the boards' previews: ``dashboards/preview.py
fabric``).

The fabric: ibsim serving a two-tier fat tree (``tests/ibsim_fabric.py``): 4 leaves, 2
spines, 8 hosts with two single-port HCAs each (``mlx5_0``, ``mlx5_1``), both HCAs of host
``2l-1`` and ``2l`` under leaf ``l`` (leaf ports 1-4), each leaf cabled to each spine (ports
5 and 6); OpenSM assigns the LIDs; the real infiniband-diags reach it through libumad2sim.

One agent per host, the real one in process (its InfiniBand and ibpeer samplers built by
``agent.samplers.build_specs`` and run through ``AgentApp``, the ibpeer sampler in its
supervised child, kept across steps as a running agent keeps them): the host's own counters
from a sysfs tree this lab writes, the far ends of its cables and its share of its leaf's
uplinks through the simulator. Every step
(simulated time) each agent renders its exposition once, at the default detail; the run is
backfilled (``promtool tsdb create-blocks-from openmetrics``) and served.

The simulator carries no data traffic: the switch ports' counters are set through ibsim's
console (``PerformanceSet``), the hosts' own counters (data moving, xmit_wait) are written
to their sysfs trees. After ``healthy`` steps, at once, each on its own leaf:

(a) leaf1: symbol errors and transmit discards on its 4 host-facing ports (switch end only:
    the hosts' own counters stay clean);
(b) leaf2: both uplinks count symbol errors and xmit_wait (throttled), and its 2 hosts' ports
    congest (their own xmit_wait rises);
(c) leaf3: one cable (host5's mlx5_0, leaf port 1) counts symbol and receive errors at the
    switch end;
(d) leaf4: nothing beyond the background every part of the run has (a trickle of symbol
    errors at the switch end of host7's mlx5_0 and at host8's own mlx5_1).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.config import AgentConfig, IbPeerSettings, Paths, Sampling
from agent.core.sysfs import SysfsReader
from agent.samplers import Latest, build_specs
from exporter.app import AgentApp
from tests.ibsim_fabric import FatTree, fat_tree, set_counter, write_host
from tests.ibsim_lab import IbsimLab, missing_tools
from tests.lab.backfill import FLEET_RULES, openmetrics_lines
from tests.promharness import backfill_recording_rules, openmetrics_blocks
from tests.promharness import start_prometheus as _start_prometheus

HOSTS = tuple(f"host{i}" for i in range(1, 9))
DEVICES = ("mlx5_0", "mlx5_1")
#: the spine fabric (``spine_run``): 3 leaves of 3, 2 and 1 hosts, 3 spines
SPINE_HOSTS = tuple(f"host{i}" for i in range(1, 7))
SPINE_PER_LEAF = (3, 2, 1)
SPINES = 3
#: 4-byte words each port sends and receives per second (~53 MB/s): a job moving data
WORDS_PER_SECOND = 13_333_333


@dataclass(frozen=True, slots=True)
class Served:
    """A fabric run a real Prometheus serves at ``url``; times in unix seconds (``change``:
    the first faulty step)."""

    url: str
    start: float
    change: float
    end: float
    step: float
    tree: FatTree


class Planter:
    """The counters a step sets: switch ports through ibsim's console (absolute values, as
    the PMA holds them), hosts' through their sysfs trees."""

    def __init__(self, lab: IbsimLab, roots: dict[str, Path], step: float) -> None:
        self.lab = lab
        self.roots = roots
        self.hosts = tuple(roots)
        self.scale = step / 15.0  # the rates below are per 15 s
        self.switch: dict[tuple[str, int, str], int] = defaultdict(int)
        self.host: dict[tuple[str, str, str], int] = defaultdict(int)
        self.words = int(WORDS_PER_SECOND * step)

    def switch_add(self, node: str, port: int, field: str, by: float) -> None:
        key = (node, port, field)
        self.switch[key] += int(by * self.scale)
        self.lab.command(
            f'PerformanceSet "{node}"[{port}] PortCounters.{field}={self.switch[key]}',
            "has been set",
        )

    def host_add(self, host: str, device: str, name: str, by: int) -> None:
        key = (host, device, name)
        self.host[key] += by
        set_counter(self.roots[host], device, name, self.host[key])

    def traffic(self) -> None:
        """Every host's data moving, every step."""
        for host in self.hosts:
            for dev in DEVICES:
                for name in ("port_xmit_data", "port_rcv_data"):
                    self.host_add(host, dev, name, self.words)
                for name in ("port_xmit_packets", "port_rcv_packets"):
                    self.host_add(host, dev, name, self.words // 1024)

    def step(self, i: int, faulty: bool) -> None:
        self.traffic()
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
                self.host_add(host, dev, "port_xmit_wait", self.words // 2)
        self.switch_add("leaf3", 1, "SymbolErrorCounter", 5)  # (c) one cable
        self.switch_add("leaf3", 1, "PortRcvErrors", 3)

    def spine_step(self, i: int, faulty: bool) -> None:
        """The spine fabric: a background trickle on a host cable of each of leaf1 and
        leaf3 and on leaf2's uplink to spine1 (leaf end); once faulty, spine2's ports to
        leaf1 and leaf3 (its own end of those two uplinks) count symbol errors."""
        self.traffic()
        if i % 2:
            self.switch_add("leaf1", 2, "SymbolErrorCounter", 1)
            self.switch_add("leaf2", 5, "SymbolErrorCounter", 1)
        if i % 3 == 1:
            self.host_add("host6", "mlx5_1", "symbol_error", 1)
        if not faulty:
            return
        for port in (1, 3):  # spine2's port k is cabled to leaf k
            self.switch_add("spine2", port, "SymbolErrorCounter", 5)


class _Now:
    t = 0.0


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


def _backfill(lines: list[str], work: Path) -> Path:
    om = work / "fabric.om.txt"
    tsdb = openmetrics_blocks(lines, om, work / "tsdb", timeout=300)
    om.unlink()
    return tsdb


@contextmanager
def fabric_run(
    work: Path, *, healthy: int, faulty: int, step: float, spine: bool = False
) -> Iterator[Served]:
    """Play ``healthy`` then ``faulty`` steps of ``step`` seconds ending now, backfill them
    and serve them from a real Prometheus until the context ends. ``spine``: the spine
    fabric (3 leaves of 3, 2 and 1 hosts under 3 spines, :meth:`Planter.spine_step`)
    instead of the 4 x 2 tree of the module docstring."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"install ibsim-utils infiniband-diags opensm: {missing}")
    hosts = SPINE_HOSTS if spine else HOSTS
    if spine:
        tree = fat_tree(hosts, DEVICES, leaves=3, spines=SPINES, per_leaf=SPINE_PER_LEAF)
    else:
        tree = fat_tree(hosts, DEVICES, leaves=4, spines=2)
    lab = IbsimLab(work, tree.net)
    old = os.environ.get("IBSIM_SOCKNAME")
    os.environ["IBSIM_SOCKNAME"] = lab.sockname
    apps: dict[str, AgentApp] = {}
    try:
        roots = {h: write_host(work / h, h, DEVICES) for h in hosts}
        apps.update((h, _agent(roots[h])) for h in hosts)
        planter = Planter(lab, roots, step)
        steps = healthy + faulty
        end = (time.time() // step) * step - step
        start = end - (steps - 1) * step
        lines: list[str] = []
        with ThreadPoolExecutor(4) as pool:
            for i in range(steps):
                _Now.t = start + i * step
                (planter.spine_step if spine else planter.step)(i, i >= healthy)
                bodies = list(pool.map(lambda h: apps[h].run_once(), hosts))
                for host, body in zip(hosts, bodies, strict=True):
                    lines += openmetrics_lines(body, host, _Now.t)
        tsdb = _backfill(lines, work)
    finally:
        for app in apps.values():
            app.runner.stop()  # each agent's ibpeer child, as a stopping agent ends it
        lab.close()
        if old is None:
            os.environ.pop("IBSIM_SOCKNAME", None)
        else:
            os.environ["IBSIM_SOCKNAME"] = old
    # the Fleet dashboard reads the per-node series these rules record every minute
    backfill_recording_rules(tsdb, [FLEET_RULES], start, end)
    with _start_prometheus(work / "prometheus", [], tsdb_path=tsdb) as prom:
        yield Served(prom.url, start, start + healthy * step, end, step, tree)
