"""A lab cluster: a scenario's nodes, their kubelets, and the clock that advances them."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.lab import dra, kubelet
from tests.lab.node import LabNode, gpu_uuid
from tests.lab.scenarios import Scenario


@dataclass(frozen=True, slots=True)
class Timeline:
    """``steps`` instants ``step`` seconds apart ending at ``end`` (unix seconds); the
    cause starts at step ``fault_step``."""

    end: float
    step: float
    steps: int
    fault_step: int

    @property
    def start(self) -> float:
        return self.end - (self.steps - 1) * self.step

    def at(self, i: int) -> float:
        return self.start + i * self.step

    @property
    def fault_start(self) -> float:
        return self.at(self.fault_step)


def timeline(scenario: Scenario, hours: float, step: float, end: float | None = None) -> Timeline:
    """Ends at the last whole ``step`` before ``end`` (default: now)."""
    if step <= 0 or hours <= 0:
        raise ValueError("hours and step must be positive")
    now = time.time() if end is None else end
    steps = int(hours * 3600 / step) + 1
    last = (now // step) * step
    return Timeline(last, step, steps, int(steps * scenario.start_fraction))


class Cluster:
    """The nodes of ``scenario`` under ``workdir``, each with its kubelet serving."""

    def __init__(
        self,
        scenario: Scenario,
        workdir: Path,
        cache_dir: Path | None = None,
        only: Sequence[int] | None = None,
    ) -> None:
        self.scenario = scenario
        self.workdir = workdir
        cache = cache_dir or workdir / "cache"
        indices = range(scenario.nodes) if only is None else only
        self.nodes = [LabNode(scenario, i, workdir / f"node-{i:02d}", cache) for i in indices]
        self._servers: list[grpc.Server] = []
        self._sockets = Path(tempfile.mkdtemp(prefix="fslab-"))  # unix socket paths are short

    def __enter__(self) -> Cluster:
        for node in self.nodes:
            node.socket = self._sockets / f"{node.name}.sock"
            claims = None
            if self.scenario.allocation == "dra":
                dra.write(node)
                claims = dra.claims(node)
            lister = kubelet.Lister(
                node.pod,
                [gpu_uuid(node.name, g) for g in range(8)],
                node.cpu_ids(wrong_numa=False),
                claims,
            )
            node.lister = lister
            self._servers.append(kubelet.serve(node.socket, lister))
        return self

    def __exit__(self, *_: object) -> None:
        for server in self._servers:
            server.stop(grace=None)
        shutil.rmtree(self._sockets, ignore_errors=True)

    def advance(self, tl: Timeline, i: int) -> None:
        """Advance every node to step ``i`` of ``tl``."""
        fault_age = (i - tl.fault_step) * tl.step if i >= tl.fault_step else None
        for node in self.nodes:
            node.t0 = tl.start
            node.advance(i, tl.at(i) - tl.start, tl.step, fault_age)
            if (
                node.cause is not None
                and node.cause.kind == "wrong_numa"
                and fault_age is not None
                and node.lister is not None
            ):
                node.lister.cpu_ids = node.cpu_ids(wrong_numa=True)


def make_scratch(prefix: str = "fslab-") -> Path:
    """A new temporary directory for node trees, on tmpfs when there is one: a step rewrites
    a few hundred small files per node (6 us each on tmpfs, 130 us on this disk). The
    caller removes it."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


@contextmanager
def scratch_dir(prefix: str = "fslab-") -> Iterator[Path]:
    """:func:`make_scratch`, removed at the end of the block."""
    path = make_scratch(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
