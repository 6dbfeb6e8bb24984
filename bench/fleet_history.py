"""A fleet's history in a real Prometheus TSDB: N DGX-class nodes over some hours, with the
background a large fleet always has and a few planted hardware faults.

Where the series come from. Every node state is what the real agent exports
(``bench/fleet_states.py``: a DGX H100 fixture tree with recorded H200 NVML answers, one
variant per state: healthy, stopped 32-bit counters, disabled ports, the planted faults).

The agent's own labels and values are kept; only what changes over time is written here:
counters advance (error counters at their background rates, the planted bad cable's symbol
errors, link error recoveries and link downs), XID events add to ``xid_errors_total``
(a series born with its first event, as the agent exports it), a node switches state
(from healthy to ``rate``, ``x8`` or ``lost`` at the fault's onset), a rebooting node
vanishes (``up`` 0, no series) and comes back with its counters reset. Netdev PFC and
pause-storm counters (netlink/ethtool: no fixture replays them), attribution
(``fabricscope_pod_gpu_info``) and training throughput are written with the catalog's
labels, as ``tests/explain_lab.py`` does.

Only the families the shipped rules and the Fleet dashboard read are kept (found by name in
``deploy/rules/*.rules.yaml`` and ``dashboards/boards/fleet.py``), so a 500-node fleet is
about 150,000 series. The history is written as OpenMetrics and turned into blocks with
``promtool tsdb create-blocks-from openmetrics``; the recording rules are then backfilled
with ``promtool tsdb create-blocks-from rules`` against a real Prometheus serving them.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from exporter.metrics import attribution, netdev  # noqa: E402
from tests.promharness import PROMTOOL  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from fleet_states import (  # noqa: E402
    APP_XIDS,
    BAD_CABLE_PORT,
    DISABLED_PORTS,
    ETHERNET,
    GPUS,
    LOST_GPU,
    RAILS,
    RATE_PORT,
    SATURATED_MAX,
    X8_NIC,
    Sample,
    agent_states,
    referenced_families,
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


# --- the samples ---------------------------------------------------------------------------

JOB = "fabricscope"
TOKENS_PER_SECOND = 55803.1245  # the founding story's job (tests/lab/scenarios.py)
#: families of the agent left out of the fleet: the ACS check needs CAP_SYS_ADMIN, which
#: the chart does not grant by default, and pci_device_info is read only beside it
LEFT_OUT = frozenset({"fabricscope_pci_acs_p2p_redirect_enabled", "fabricscope_pci_device_info"})
#: the planted pause storm (modelled): pause frames a second on top of the background, the
#: NIC's pause storm prevention stopping it first after STORM_FIRST, then every STORM_REPEAT
STORM_PAUSE_RATE = 20000.0
STORM_FIRST = 120.0
STORM_REPEAT = 300.0
#: the agent's resident memory by process (child "" is the main one), as measured on an
#: H200 node (bench/results/sizing-h200.json), against the chart's limit (256Mi); the main
#: process grows as bench/soak.py measured it (bench/results/soak-cpu.json: 31.07 MiB a day
#: at 15 times the default passes with a pod churned every 5 s), scaled to the default passes
AGENT_RSS_MIB = {"": 73.2, "nvml": 44.4, "throughput": 29.4}
AGENT_LIMIT_MIB = 256
MAIN_GROWTH_MIB_PER_DAY = 31.07 / 15
#: the DGX H100's GPUs, as nvidia-smi names them, and NCCL's channels between two of them
#: (modelled: one ring per channel)
GPU_BUS_IDS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
               "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")  # fmt: skip
NVLINK_CHANNELS = 16
#: where the rank-0 node asks the job's RAS service (NCCL's default port), and the hung
#: rank's bootstrap address (documentation range)
RAS_ENDPOINT = "127.0.0.1:28028"
RAS_HOST = "192.0.2.2"
RAS_ERROR_KINDS = ("internal_error", "invalid_argument", "invalid_usage", "other",
                   "remote_error", "system_error", "unhandled_cuda_error")  # fmt: skip
#: link downs of the planted bad cable after its onset, in minutes (a flapping link)
BAD_CABLE_DOWNS = (3.0, 17.0, 29.0)


def _labels(pairs: Sequence[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs)


class Writer:
    """OpenMetrics lines for promtool: every series in time order, timestamps in seconds."""

    def __init__(self, path: Path, t0: float, steps: int, step: float) -> None:
        self.fh = path.open("w")
        self.t0 = t0
        self.step = step
        self.stamps = [f" {t0 + i * step:.0f}\n" for i in range(steps)]
        self.samples = 0
        self.series_count = 0

    def series(self, name: str, labels: str, values: Sequence[float | None]) -> None:
        head = f"{name}{{{labels}}} "
        stamps = self.stamps
        lines = [f"{head}{v!r}{stamps[i]}" for i, v in enumerate(values) if v is not None]
        self.samples += len(lines)
        self.series_count += 1 if lines else 0
        self.fh.write("".join(lines))

    def close(self) -> None:
        self.fh.write("# EOF\n")
        self.fh.close()


def _events_before(events: Sequence[float], t: float, since: float) -> int:
    return sum(1 for e in events if since < e <= t)


def write_node(
    w: Writer,
    n: NodePlan,
    states: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]],
    steps: int,
    rng: random.Random,
) -> None:
    step = w.step
    times = [i * step for i in range(steps)]
    state_at = [None if n.is_down(t) else n.state_at(t) for t in times]
    boot_at = [n.boot(t) for t in times]
    inst = (("instance", n.name), ("job", JOB))
    w.series("up", _labels(inst), [0.0 if s is None else 1.0 for s in state_at])
    keys: dict[tuple[str, tuple[tuple[str, str], ...]], None] = {}
    for _, st in n.segments:
        keys.update(dict.fromkeys(states[st]))
    xmit_rate = {dev: rng.uniform(1e3, 1e5) for dev in RAILS + ETHERNET}
    for key in keys:
        name, labels = key
        if n.rail_fw and name == "fabricscope_infiniband_device_info":
            d = dict(labels)
            if d.get("device") in RAILS:
                labels = tuple(sorted({**d, "fw_ver": n.rail_fw}.items()))
        lab = _labels(sorted(labels + inst))
        dev = dict(labels).get("device", "")
        bare = name.removeprefix("fabricscope_infiniband_port_").removesuffix("_total")
        events: list[float] = []
        rate = 0.0
        cable = n.bad_cable if n.bad_cable and n.bad_cable[1] == dev else None
        if name.startswith("fabricscope_infiniband_port_") and name.endswith("_total"):
            if bare == "symbol_errors":
                rate = n.noisy_ports.get(dev, 0.0) / 3600
                events = [a for a, d in n.flaps if d == dev for _ in range(3)]
            elif bare == "link_downed":
                events = [a for a, d in n.flaps if d == dev]
                if cable:
                    events += [cable[0] + m * 60 for m in BAD_CABLE_DOWNS]
            elif bare == "transmit_wait":
                rate = xmit_rate.get(dev, 0.0)
        vals: list[float | None] = []
        for i, t in enumerate(times):
            st = state_at[i]
            s = states[st].get(key) if st is not None else None
            if s is None:
                vals.append(None)
                continue
            if not s.counter:
                vals.append(s.value)
                continue
            boot = boot_at[i]
            v = s.value if boot == 0 else 0.0
            if s.value >= SATURATED_MAX or (bare == "transmit_wait" and s.value >= 2**32 - 1):
                vals.append(s.value)  # stopped by the hardware: it never moves again
                continue
            v += rate * (t - boot) + _events_before(events, t, boot)
            if cable and t > cable[0]:
                since = t - max(cable[0], boot)
                v += {
                    "symbol_errors": 300 / 60,
                    "receive_errors": 40 / 60,
                    "link_error_recovery": 1 / 600,
                }.get(bare, 0.0) * since
            vals.append(float(int(v)))
        w.series(name, lab, vals)
    # XIDs: a series per (GPU, code), from its first event, counting events since the agent
    # started (a reboot restarts the agent: the series are gone until the next event)
    by_series: dict[tuple[str, str], list[float]] = {}
    for at, gpu, code in n.xids:
        by_series.setdefault((gpu, code), []).append(at)
    for (gpu, code), ats in sorted(by_series.items()):
        vals = []
        for i, t in enumerate(times):
            c = _events_before(ats, t, boot_at[i])
            vals.append(float(c) if c and state_at[i] is not None else None)
        w.series(
            "fabricscope_gpu_xid_errors_total",
            _labels(sorted((("gpu", gpu), ("reason", code), *inst))),
            vals,
        )
    # netdev (netlink/ethtool: modelled): PFC pause on the Ethernet ports' lossless class; a
    # pause storm sends pause frames at STORM_PAUSE_RATE until the NIC's storm prevention
    # stops it (one event), again every STORM_REPEAT while the host cannot drain
    storm_at, storm_nd = n.pause_storm or (math.inf, "")
    for nd in ("ens40f0np0", "ens40f1np1", "ens31f0np0", "ens31f1np1"):
        storm = nd == storm_nd
        for direction, r in (("rx", rng.uniform(0, 20)), ("tx", rng.uniform(0, 20))):
            lab = _labels(sorted((("netdev", nd), ("direction", direction), ("queue", "3"), *inst)))
            extra = STORM_PAUSE_RATE if storm and direction == "tx" else 0.0
            w.series(
                netdev.PFC_PAUSE_FRAMES.name,
                lab,
                [
                    None
                    if state_at[i] is None
                    else float(
                        int(r * (t - boot_at[i]) + extra * max(0.0, t - max(storm_at, boot_at[i])))
                    )
                    for i, t in enumerate(times)
                ],
            )
        stops = [storm_at + STORM_FIRST + k * STORM_REPEAT for k in range(steps)] if storm else []
        w.series(
            netdev.PAUSE_STORM_ERRORS.name,
            _labels(sorted((("netdev", nd), *inst))),
            [
                None if s is None else float(_events_before(stops, times[i], boot_at[i]))
                for i, s in enumerate(state_at)
            ],
        )

    # the agent's own memory (AGENT_RSS_MIB), its main process growing with its age, against
    # the chart's limit
    ages = [
        None if state_at[i] is None else (t - boot_at[i] + (n.agent_age if boot_at[i] == 0 else 0))
        for i, t in enumerate(times)
    ]
    for child, mib in AGENT_RSS_MIB.items():
        grow = MAIN_GROWTH_MIB_PER_DAY if not child else 0.0
        w.series(
            "process_resident_memory_bytes",
            _labels(sorted(((("child", child),) if child else ()) + inst)),
            [None if a is None else float(int((mib + grow * a / 86400) * 2**20)) for a in ages],
        )
    w.series(
        "fabricscope_agent_memory_limit_bytes",
        _labels(inst),
        [None if a is None else float(AGENT_LIMIT_MIB * 2**20) for a in ages],
    )

    # kube-state-metrics' cordon flag, when the plan drains nodes
    if n.cordons:
        w.series(
            "kube_node_spec_unschedulable",
            _labels((("instance", "kube-state-metrics:8080"), ("job", "kube-state-metrics"),
                     ("node", n.name))),
            [1.0 if any(a <= t < b for a, b in n.cordons) else 0.0 for t in times],
        )  # fmt: skip
    if not n.job:
        return

    _job_series(
        w, n, job=n.job, pod_name=n.pod, span=(n.job_start, n.job_gone), state_at=state_at, rng=rng
    )
    if n.next_job:
        start, job, pod = n.next_job
        _job_series(
            w, n, job=job, pod_name=pod, span=(start, None), state_at=state_at, rng=rng,
            bypassed=n.nvlink_bypassed,
        )  # fmt: skip


def _job_series(
    w: Writer,
    n: NodePlan,
    *,
    job: str,
    pod_name: str,
    span: tuple[float, float | None],
    state_at: Sequence[str | None],
    rng: random.Random,
    bypassed: bool = False,
) -> None:
    """The job's pod on this node: its 8 GPUs, the channels NCCL set up between them (over
    SHM where ``bypassed``), its throughput as every rank prints it, and, on the job's rank-0
    node, what NCCL's RAS service answers about the job; from ``span[0]`` until ``span[1]``
    (None: the history's end)."""
    step = w.step
    times = [i * step for i in range(len(state_at))]
    inst = (("instance", n.name), ("job", JOB))
    start, gone = span

    def alive(i: int) -> bool:
        if state_at[i] is None or times[i] < start:
            return False
        return gone is None or times[i] < gone

    def printing(i: int) -> bool:
        return alive(i) and (n.hung_at is None or times[i] < n.hung_at)

    pod = (("namespace", "training"), ("pod", pod_name), ("container", "trainer"))
    for g in range(GPUS):
        lab = (
            *pod,
            ("gpu", str(g)),
            ("uuid", f"GPU-{n.name}-{g}"),
            ("pci_bus_id", ""),
            ("method", "podresources"),
        )
        w.series(
            attribution.POD_GPU_INFO.name,
            _labels(sorted(lab + inst)),
            [1.0 if alive(i) else None for i in range(len(times))],
        )
    # NVLink peers: NCCL's ring over the NVSwitch joins GPU g to g+1; P2P unless bypassed
    transport = "SHM/direct/direct" if bypassed else "P2P/CUMEM"
    for g in range(GPUS - 1):
        lab = (
            *pod,
            ("job_name", job),
            ("pci_bus_id", GPU_BUS_IDS[g]),
            ("peer_pci_bus_id", GPU_BUS_IDS[g + 1]),
            ("transport", transport),
        )
        w.series(
            "fabricscope_nccl_nvlink_peer_channels",
            _labels(sorted(lab + inst)),
            [float(NVLINK_CHANNELS) if alive(i) else None for i in range(len(times))],
        )
    if n.ranks:
        _ras_series(w, n, job, [alive(i) for i in range(len(times))], rng)
    tp = (*pod, ("job_name", job), ("format", "composer"))
    tokens: list[float | None] = []
    for i, t in enumerate(times):
        if not alive(i):
            tokens.append(None)
            continue
        if not printing(i):  # hung: the agent keeps exporting the last line's rate
            tokens.append(next((v for v in reversed(tokens) if v is not None), None))
            continue
        ratio = 1.0
        for at, r in n.slowdowns:
            if t >= at:
                ratio = r
        dip = 0.6 if int(w.t0 + t) % 1800 < step else 1.0  # a checkpoint every 30 minutes
        tokens.append(TOKENS_PER_SECOND * ratio * dip * (1 + rng.gauss(0, 0.01)))
    w.series("fabricscope_throughput_tokens_per_second", _labels(sorted(tp + inst)), tokens)
    w.series(
        "fabricscope_throughput_last_parsed_timestamp_seconds",
        _labels(sorted(tp[:-1] + inst)),
        [
            w.t0 + min(t, n.hung_at if n.hung_at is not None else t) - rng.uniform(1, 20)
            if alive(i)
            else None
            for i, t in enumerate(times)
        ],
    )


def _ras_series(w: Writer, n: NodePlan, job: str, alive: list[bool], rng: random.Random) -> None:
    """NCCL's RAS answers about ``job``, asked by its rank-0 node ``n``, with the catalog's
    labels, shaped as a real NCCL 2.28.9 job's answers (tests/fixtures/ras): healthy, every
    rank responsive, counts moving, a communicator now and then mismatched by a collective in
    flight; a rank stopped (``n.hung_at``): the counts stop on every rank, RAS calls it
    unresponsive from the next answer and dead 80 s later."""
    times = [i * w.step for i in range(len(alive))]
    j = (("namespace", "training"), ("job_name", job), ("ras_endpoint", RAS_ENDPOINT))
    inst = (("instance", n.name), ("job", JOB))
    hung = n.hung_at if n.hung_at is not None and n.hung_rank else math.inf

    def series(
        name: str, extra: tuple[tuple[str, str], ...], fn: Callable[[float], float | None]
    ) -> None:
        vals = [fn(t) if alive[i] else None for i, t in enumerate(times)]
        w.series(name, _labels(sorted(j + extra + inst)), vals)

    p = "fabricscope_nccl_ras_"
    series(p + "counts_unchanged_seconds", (), lambda t: max(0.0, t - hung) if t >= hung else 0.0)
    series(
        p + "mismatched_communicators",
        (),
        lambda t: 0.0 if t >= hung else float(rng.random() < 0.5),
    )
    series(p + "ranks", (("state", "responsive"),), lambda t: float(n.ranks - (t >= hung)))
    series(p + "ranks", (("state", "unresponsive"),), lambda t: float(hung <= t < hung + 80))
    series(p + "ranks", (("state", "dead"),), lambda t: float(t >= hung + 80))
    for kind in RAS_ERROR_KINDS:
        series(p + "async_error_ranks", (("kind", kind),), lambda t: 0.0)
    if n.hung_rank:
        rank, gpu = n.hung_rank
        who = (
            ("rank", str(rank)),
            ("host", RAS_HOST),
            ("pid", "5170"),
            ("gpu", str(gpu)),
            ("pci_bus_id", ""),
            ("pod", ""),
        )
        for state, a, b in (("unresponsive", hung, hung + 80), ("dead", hung + 80, math.inf)):
            series(
                p + "rank_info",
                (*who, ("state", state)),
                lambda t, a=a, b=b: 1.0 if a <= t < b else None,
            )


@dataclass(frozen=True, slots=True)
class History:
    tsdb: Path
    start: float
    end: float
    step: float
    plan: Plan
    samples: int
    series: int


def build(
    work: Path,
    nodes: int,
    hours: float,
    step: float,
    *,
    seed: int = 35,
    log: Callable[[str], None] = print,
    fleet: Plan | None = None,
    acs: bool = False,
    chunk: int = 200,
) -> History:
    """The fleet's history backfilled into ``work``/tsdb (raw series only; the recording
    rules are backfilled by the caller): ``fleet``, or the plan of ``nodes`` over ``hours``.
    Written ``chunk`` nodes at a time (one OpenMetrics file, then blocks, each), so the disk
    holds one chunk's text at most; Prometheus merges the overlapping blocks."""
    import time as _time

    t_build = _time.perf_counter()
    keep = referenced_families() - (set() if acs else LEFT_OUT)
    states_list = agent_states(work / "states", keep, acs=acs)
    states = {k: {(s.name, s.labels): s for s in v} for k, v in states_list.items()}
    log(f"agent states rendered in {_time.perf_counter() - t_build:.0f} s")
    p = fleet if fleet is not None else plan(nodes, hours, step, seed)
    steps = int(p.seconds // step) + 1
    # aligned to two hours, so a history of up to two hours is one block
    t0 = math.floor((_time.time() - p.seconds - 3600) / 7200) * 7200
    tsdb = work / "tsdb"
    rng = random.Random(seed)
    samples = series = 0
    for k in range(0, len(p.nodes), chunk):
        om = work / f"fleet-{k}.om"
        w = Writer(om, t0, steps, step)
        for n in p.nodes[k : k + chunk]:
            write_node(w, n, states, steps, rng)
        w.close()
        samples += w.samples
        series += w.series_count
        subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tsdb)],
            check=True,
            capture_output=True,
        )
        om.unlink()
        log(f"{min(k + chunk, len(p.nodes))} of {len(p.nodes)} nodes: {samples:,} samples")
    log(f"history in {_time.perf_counter() - t_build:.0f} s")
    return History(tsdb, t0, t0 + (steps - 1) * step, step, p, samples, series)
