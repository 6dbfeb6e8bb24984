"""A fleet's story for its history (``bench/fleet_history.py``): which node is in which
state when (``bench/fleet_states.py``), where the planted faults are, and the background
events (flaps, XIDs, reboots, noisy ports, jobs). Pure: no files, no processes.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_states import (
    APP_XIDS,
    BAD_CABLE_PORT,
    DISABLED_PORTS,
    GPUS,
    LOST_GPU,
    RAILS,
    RATE_PORT,
    X8_NIC,
)

# --- the fleet: who is in which state when, and what happens -------------------------------


@dataclass(frozen=True, slots=True)
class Fault:
    """A planted fault: ``kind``, where (``node``, and the port/GPU/PCI function in the
    label the alerts carry), from ``at`` (seconds into the history)."""

    kind: str  # bad_cable | degraded_port | nic_x8 | lost_gpu
    node: str
    labels: tuple[tuple[str, str], ...]
    at: float
    description: str


@dataclass(slots=True)
class NodePlan:
    name: str
    #: (from, state): the node's state from that second on
    segments: list[tuple[float, str]]
    #: (from, to): rebooting, no agent (``up`` 0)
    down: list[tuple[float, float]] = field(default_factory=list)
    #: (at, device): a single link flap
    flaps: list[tuple[float, str]] = field(default_factory=list)
    #: (at, gpu, code): an XID event
    xids: list[tuple[float, str, str]] = field(default_factory=list)
    bad_cable: tuple[float, str] | None = None
    job: str = ""
    pod: str = ""
    #: (from, ratio): the job's throughput relative to normal
    slowdowns: list[tuple[float, float]] = field(default_factory=list)
    job_gone: float | None = None  # the job's pods ended at (seconds)
    noisy_ports: dict[str, float] = field(default_factory=dict)  # device -> symbol errors/h
    #: device -> symbol errors/h the switch end of its cable counts (the ibpeer sampler's
    #: fabricscope_infiniband_peer_port_symbol_errors_total)
    peer_noisy_ports: dict[str, float] = field(default_factory=dict)
    job_start: float = 0.0  # the job's pods started at (seconds; job churn)
    hung_at: float | None = None  # a rank hung: its log stops, its pods keep their GPUs
    next_job: tuple[float, str, str] | None = None  # (from, job, pod): the next job here
    #: (from, to): cordoned (kube-state-metrics' kube_node_spec_unschedulable 1)
    cordons: list[tuple[float, float]] = field(default_factory=list)
    #: the ranks of the job this node asks NCCL's RAS service about (its rank-0 node), or 0
    ranks: int = 0
    #: (rank, gpu): the rank that stops at ``hung_at``, in the job this node asks RAS about
    hung_rank: tuple[int, int] | None = None
    #: NCCL of the next job here moves data between NVLinked GPUs over SHM, not P2P
    nvlink_bypassed: bool = False
    #: (from, netdev): the host stops draining its receive queues; the NIC sends PFC pause
    #: frames until its pause storm prevention stops it
    pause_storm: tuple[float, str] | None = None
    #: the compute rails' firmware, where it differs from the fixture's
    rail_fw: str | None = None
    #: how long the agent had run when the history starts (seconds; a reboot restarts it)
    agent_age: float = 0.0

    def state_at(self, t: float) -> str:
        state = self.segments[0][1]
        for at, s in self.segments:
            if t >= at:
                state = s
        return state

    def is_down(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.down)

    def boot(self, t: float) -> float:
        """When the running agent and the counters started: 0 or the end of a reboot."""
        return max((b for a, b in self.down if b <= t), default=0.0)


@dataclass(slots=True)
class Plan:
    nodes: list[NodePlan]
    faults: list[Fault]
    seconds: float
    step: float
    #: what the background holds, as counts (for the report)
    background: dict[str, int]


def _node(i: int) -> str:
    return f"node-{i:03d}"


def plan(nodes: int, hours: float, step: float, seed: int = 35, job_size: int = 50) -> Plan:
    """The fleet's story. Faults start in the last third; background events anywhere.
    Training jobs of ``job_size`` nodes each."""
    rng = random.Random(seed)
    seconds = hours * 3600
    out = [NodePlan(_node(i), [(0.0, "healthy")]) for i in range(nodes)]
    # about 60 % of nodes have rails whose 32-bit port_xmit_wait stopped long ago
    saturated = 0
    for n in out:
        r = rng.random()
        if r < 0.6:
            n.segments = [
                (0.0, rng.choice(("saturated-1", "saturated-1", "saturated-2", "saturated-4")))
            ]
            saturated += 1
    # faults, on distinct nodes, none of them the disabled one (node 1)
    picks = rng.sample(range(2, nodes), 6)
    f_at = seconds * 2 / 3
    faults = [
        Fault(
            "bad_cable",
            _node(picks[0]),
            (("device", BAD_CABLE_PORT), ("port", "1")),
            f_at,
            "a marginal cable: symbol errors, link error recoveries, a link down every 10-20 min",
        ),
        Fault(
            "degraded_port",
            _node(picks[1]),
            (("device", RATE_PORT), ("port", "1")),
            f_at + 300,
            f"rail {RATE_PORT} retrained at 200 Gb/s (2X NDR), up, no error counted",
        ),
        Fault(
            "nic_x8",
            _node(picks[2]),
            (("pci_bus_id", X8_NIC[1]),),
            f_at + 600,
            f"the ConnectX-7 of rail {X8_NIC[0]} retrained at PCIe x8",
        ),
        Fault(
            "lost_gpu",
            _node(picks[3]),
            (("gpu", LOST_GPU),),
            f_at + 900,
            f"GPU {LOST_GPU} fell off the bus (XID 79, NVML GPU_IS_LOST)",
        ),
    ]
    by_name = {n.name: n for n in out}
    for f in faults:
        n = by_name[f.node]
        base = n.segments[0][1]
        if f.kind == "bad_cable":
            n.bad_cable = (f.at, BAD_CABLE_PORT)
        else:
            state = {"degraded_port": "rate", "nic_x8": "x8", "lost_gpu": "lost"}[f.kind]
            n.segments = [(0.0, base if base == "healthy" else "healthy"), (f.at, state)]
        if f.kind == "lost_gpu":
            n.xids.append((f.at, LOST_GPU, "79"))
    out[1].segments = [(0.0, "disabled")]  # 0.1 % of the fleet's ports, administratively off
    # background: single flaps (one an hour), application XIDs (a few an hour), reboots
    flaps = max(1, round(hours))
    for _ in range(flaps):
        n = out[rng.choice(picks[4:] + list(range(2, nodes)))]
        n.flaps.append((rng.uniform(0, seconds - 60), rng.choice(RAILS)))
    app_xids = 0
    t = rng.expovariate(4 / 3600)
    while t < seconds:
        n = out[rng.randrange(nodes)]
        gpu = str(rng.randrange(GPUS))
        code = rng.choices(APP_XIDS, (35, 35, 15, 15))[0]
        n.xids.append((t, gpu, code))
        app_xids += 1
        if code in ("13", "31") and rng.random() < 0.5:  # the channel's cleanup follows
            n.xids.append((t + step, gpu, "45"))
            app_xids += 1
        t += rng.expovariate(4 / 3600)
    reboots = 0
    quiet = [i for i in range(2, nodes) if i not in picks[:4]]
    for i in rng.sample(quiet, min(2, len(quiet))):
        n = out[i]
        a = rng.uniform(600, seconds - 1200)
        n.down.append((a, a + 8 * 60))  # eight minutes from shutdown to the agent's first pass
        if n.segments[0][1].startswith("saturated"):
            n.segments.append((a + 8 * 60, "healthy"))  # counters reset by the reboot
        reboots += 1
    # a tenth of the ports count a few symbol errors an hour, below the alert's 10
    noisy = 0
    for n in out:
        for dev in RAILS:
            if rng.random() < 0.1:
                n.noisy_ports[dev] = rng.uniform(0.5, 4)
                noisy += 1
    # jobs: 50 nodes each, every rank printing tokens/s; a fault slows its job
    for i, n in enumerate(out):
        job = f"job-{i // job_size:02d}"
        n.job, n.pod = job, f"{job}-{i % job_size}"
        if i % job_size == 0:  # the job's rank-0 node asks its RAS service
            n.ranks = min(job_size, nodes - i) * GPUS
    slow = {"bad_cable": 0.7, "degraded_port": 0.75, "nic_x8": 0.8}
    for f in faults:
        job = by_name[f.node].job
        for n in out:
            if n.job != job:
                continue
            if f.kind in slow:
                n.slowdowns.append((f.at, slow[f.kind]))
            else:  # the job failed with its GPU: its pods are gone two minutes later
                n.job_gone = f.at + 120
    return Plan(
        out,
        faults,
        seconds,
        step,
        {
            "nodes with saturated 32-bit counters": saturated,
            "administratively disabled ports": len(DISABLED_PORTS),
            "single link flaps": flaps,
            "application XIDs": app_xids,
            "node reboots (8 min)": reboots,
            "ports counting a few symbol errors an hour": noisy,
            f"training jobs ({job_size} nodes, every rank printing tokens/s)": math.ceil(
                nodes / job_size
            ),
        },
    )
