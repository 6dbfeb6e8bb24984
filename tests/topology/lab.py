"""The topology lab: an ibsim fabric of any :class:`~tests.topology.nets.Tree`, one real agent
per host (its InfiniBand and ibpeer samplers, as ``tests/fabric_lab.py`` builds them), each
agent's exposition backfilled into a real Prometheus with the host as ``instance`` and
``job="fabricscope"`` (what the chart's relabeling gives), phase by phase.

A phase is one pass of every agent, fresh (a new agent reads the topology on its first
pass), after the fabric has been changed through ibsim's console (``Unlink`` a cable) and
OpenSM has swept it; a host whose port a phase takes down gets its sysfs port state DOWN, as
the kernel would show it. Phases are stamped :data:`GAP` seconds apart, ending a minute ago,
so an instant query at one phase's time sees that phase's series only (Prometheus looks back
5 minutes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.config import AgentConfig, IbPeerSettings, Paths, Sampling
from agent.core.sysfs import SysfsReader
from agent.samplers import Latest, build_specs
from exporter.app import AgentApp
from tests.ibsim_fabric import write_host
from tests.ibsim_lab import IbsimLab, missing_tools
from tests.lab.backfill import openmetrics_lines
from tests.promharness import openmetrics_blocks
from tests.promharness import start_prometheus as _start_prometheus
from tests.topology.nets import Tree, net_text

GAP = 600.0

#: a phase's change to the fabric: given the lab and the hosts' roots
Change = Callable[[IbsimLab, dict[str, Path]], None]


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    #: each phase's timestamp, in order
    times: tuple[float, ...]
    #: each phase's expositions, by host
    bodies: tuple[dict[str, bytes], ...]


def _agent(root: Path, spine_links: bool) -> AgentApp:
    config = AgentConfig(
        paths=Paths(str(root / "sys"), str(root / "no-procfs")),
        sampling=Sampling(frozenset({"infiniband", "ibpeer"}), 60.0, 60.0),
        ibpeer=IbPeerSettings(
            command_prefix=(str(root / "ibsim-wrap"),),
            interval_seconds=60.0,
            spine_links=spine_links,
        ),
    )
    latest = Latest()
    specs = build_specs(
        config, SysfsReader(config.paths.sysfs), latest=latest, run_probes=False, once=True
    )
    return AgentApp(specs, latest)


def _pass(roots: dict[str, Path], spine_links: bool) -> dict[str, bytes]:
    """Each host's exposition from one pass of a fresh agent as ``fabricscope agent --once``
    runs it: the neighbours, every leaf's port table and the uplinks it reads in that pass (a
    serving agent spreads them over its first passes and exports the same series)."""
    apps = {h: _agent(r, spine_links) for h, r in roots.items()}

    def run(host: str) -> bytes:
        return apps[host].run_once()

    try:
        with ThreadPoolExecutor(4) as pool:
            bodies = list(pool.map(run, sorted(roots)))
        return dict(zip(sorted(roots), bodies, strict=True))
    finally:
        for app in apps.values():
            app.runner.stop()


def port_down(root: Path, device: str) -> None:
    """The host's port as the kernel shows a cable gone: DOWN, polling."""
    port = root / "sys/class/infiniband" / device / "ports/1"
    (port / "state").write_text("1: DOWN\n")
    (port / "phys_state").write_text("2: Polling\n")


@contextmanager
def topology_run(
    work: Path,
    tree: Tree,
    changes: Sequence[Change | None],
    *,
    spine_links: bool = False,
    extra: Mapping[str, bytes] | None = None,
) -> Iterator[Served]:
    """One phase per entry of ``changes`` (``None``: the fabric as it is), served; the agents
    read the spines' tables too with ``spine_links`` (``--ibpeer.spine-links``). ``extra``:
    exposition text a host's agent exports beside its InfiniBand series in every phase (its
    NVML series, rendered by the exporter from a replayed pass)."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"install ibsim-utils infiniband-diags opensm: {missing}")
    lab = IbsimLab(work, net_text(tree))
    old = os.environ.get("IBSIM_SOCKNAME")
    os.environ["IBSIM_SOCKNAME"] = lab.sockname
    end = time.time() - 60.0
    times = tuple(end - GAP * (len(changes) - 1 - i) for i in range(len(changes)))
    lines: list[str] = []
    bodies: list[dict[str, bytes]] = []
    try:
        roots = {h: write_host(work / h, h, sorted(devs)) for h, devs in tree.hosts.items()}
        for change, t in zip(changes, times, strict=True):
            if change is not None:
                change(lab, roots)
                lab.run_opensm()
            bodies.append(
                {h: b + (extra or {}).get(h, b"") for h, b in _pass(roots, spine_links).items()}
            )
            for host, body in bodies[-1].items():
                lines += openmetrics_lines(body, host, t)
    finally:
        lab.close()
        if old is None:
            os.environ.pop("IBSIM_SOCKNAME", None)
        else:
            os.environ["IBSIM_SOCKNAME"] = old
    tsdb = openmetrics_blocks(lines, work / "topology.om.txt", work / "tsdb", timeout=120)
    with _start_prometheus(work / "prometheus", [], tsdb_path=tsdb) as prom:
        yield Served(prom.url, times, tuple(bodies))
