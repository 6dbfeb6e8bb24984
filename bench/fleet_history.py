"""A fleet's history in a real Prometheus TSDB: N DGX-class nodes over some hours, with the
background a large fleet always has and a few planted hardware faults.

Where the series come from. Every node state is what the real agent exports
(``bench/fleet_states.py``: a DGX H100 fixture tree with recorded H200 NVML answers, one
variant per state: healthy, stopped 32-bit counters, disabled ports, the planted faults);
which node is in which state when, and what happens to it, is ``bench/fleet_plan.py``'s.

The agent's own labels and values are kept; only what changes over time is written here:
counters advance (error counters at their background rates, the planted bad cable's symbol
errors, link error recoveries and link downs), XID events add to ``xid_errors_total``
(a series born with its first event, as the agent exports it), a node switches state
(from healthy to ``rate``, ``x8`` or ``lost`` at the fault's onset), a rebooting node
vanishes (``up`` 0, no series) and comes back with its counters reset. Netdev PFC and
pause-storm counters (netlink/ethtool: no fixture replays them), attribution
(``fabricscope_pod_gpu_info``) and training throughput are written with the catalog's
labels, as ``tests/explain_lab.py`` does; so are the NCCL probe's series
(``bench/fleet_probe.py``) and what the agent reads from the jobs' NCCL logs
(``bench/fleet_nccl.py``), each module saying where its values come from.

Only the families the shipped rules and the Fleet dashboard read are kept (found by name in
``deploy/rules/*.rules.yaml`` and ``dashboards/boards/fleet.py``), so a 500-node fleet is
about 150,000 series. The history is written as OpenMetrics and turned into blocks with
``promtool tsdb create-blocks-from openmetrics``; the recording rules are then backfilled
with ``promtool tsdb create-blocks-from rules`` against a real Prometheus serving them.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.core.ceiling import plan as memory_plan  # noqa: E402
from agent.nvml.findings import generation_degraded_under_load  # noqa: E402
from agent.nvml.snapshot import ComputeProcess, NvmlGpu, PcieLink  # noqa: E402
from exporter.metrics import attribution, netdev  # noqa: E402
from tests.promharness import PROMTOOL  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import fleet_nccl  # noqa: E402
import fleet_probe  # noqa: E402
from bench_ceilings import chart_limit  # noqa: E402
from fleet_plan import Fault, NodePlan, Plan, plan  # noqa: E402
from fleet_states import (  # noqa: E402
    APP_XIDS,
    ETHERNET,
    GPUS,
    LOST_GPU,
    NVML_RECORDING,
    RAILS,
    SATURATED_MAX,
    Sample,
    agent_states,
    referenced_families,
)

__all__ = ["APP_XIDS", "GPUS", "RAILS", "Fault", "History", "NodePlan", "Plan", "build", "plan"]

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
#: H200 node by scripts/gpu_sizing.sh (SIZING), against the chart's memory limit; the main
#: process grows as bench/soak.py measured it (MAIN_GROWTH_MIB_PER_DAY)
SIZING = ROOT / "bench" / "results" / "sizing-h200-solo.json"
_ROLES = {"main": "", "nvml child": "nvml", "throughput child": "throughput"}
AGENT_RSS_MIB = {
    _ROLES[p["role"]]: float(p["rss_mib"]) for p in json.loads(SIZING.read_text())["processes"]
}
AGENT_LIMIT_MIB = chart_limit() // 2**20
#: how far the children's memory ceilings and the main process's need exceed that limit,
#: as the agent works it out at start (0: the limit holds them)
AGENT_OVERCOMMIT = memory_plan(AGENT_LIMIT_MIB * 2**20, (c for c in AGENT_RSS_MIB if c)).over
MAIN_GROWTH_MIB_PER_DAY = 31.07 / 15
#: the DGX H100's GPUs, as nvidia-smi names them, and NCCL's channels between two of them
#: (modelled: one ring per channel)
GPU_BUS_IDS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
               "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")  # fmt: skip
NVLINK_CHANNELS = 16
#: the agent's PCIe generation check while the job's processes run on a GPU (absent while
#: it runs none, as on the idle recorded H200s): the recorded GPU 0's current and highest
#: generation (5 and 5) as the agent judges them, GPU 0 standing for every GPU as in
#: fleet_states (modelled: a busy healthy H200 keeps the Gen5 link it idles at)
_PCIE_GEN = {
    k.split("(")[0]: v["value"]
    for k, v in json.loads(NVML_RECORDING.read_text())["calls"].items()
    if k.endswith("PcieLinkGeneration(0)")
}
BUSY_PCIE_GENERATION_DEGRADED = float(
    generation_degraded_under_load(
        NvmlGpu(
            0,
            pcie=PcieLink(
                current_generation=_PCIE_GEN["nvmlDeviceGetCurrPcieLinkGeneration"],
                max_generation=_PCIE_GEN["nvmlDeviceGetMaxPcieLinkGeneration"],
            ),
            compute_processes=(ComputeProcess(pid=1, used_memory_bytes=None),),
        )
    )
)
#: where the rank-0 node asks the job's RAS service (NCCL's default port), and the hung
#: rank's bootstrap address (documentation range)
RAS_ENDPOINT = "127.0.0.1:28028"
RAS_HOST = "192.0.2.2"
RAS_ERROR_KINDS = ("internal_error", "invalid_argument", "invalid_usage", "other",
                   "remote_error", "system_error", "unhandled_cuda_error")  # fmt: skip
#: PortCounters' SymbolErrorCounter (16 bits), where the hardware stops it
SYMBOL_ERROR_MAX = 65535
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
    *,
    probe: Sequence[fleet_probe.PairRun] = (),
    faulty: bool = False,
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
    _peer_errors(w, n, states, state_at)
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
    w.series(
        "fabricscope_agent_memory_overcommit_bytes",
        _labels(inst),
        [None if a is None else float(AGENT_OVERCOMMIT) for a in ages],
    )

    # the workload sampler's GPUDirect RDMA path, the probe at the chart's defaults
    up = [s is not None for s in state_at]
    fleet_nccl.write_gpudirect(w.series, inst, up)
    probe_rng = random.Random(f"{n.name}-probe")  # its own: the rest is drawn as before
    fleet_probe.write_probe(
        w.series, n, probe, times=times, up=up, boots=boot_at, rng=probe_rng, faulty=faulty
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


def _peer_errors(
    w: Writer,
    n: NodePlan,
    states: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]],
    state_at: Sequence[str | None],
) -> None:
    """What the switch end of each of the node's cables counts, as the ibpeer sampler
    exports it (labelled as its fabricscope_infiniband_peer_info; a counter born with its
    first error, as below full detail): symbol errors at the port's drawn rate
    (``n.peer_noisy_ports``), and the planted bad cable's at the rate its node end counts
    them (modelled: a marginal cable damages both directions). The switch's counter is not
    reset by the node's reboot; PortCounters' 16-bit counter stops at 65535."""
    step = w.step
    inst = (("instance", n.name), ("job", JOB))
    rates = dict(n.peer_noisy_ports)
    cable = n.bad_cable
    if cable:
        rates.setdefault(cable[1], 0.0)
    for dev, per_hour in sorted(rates.items()):
        peer: dict[str, tuple[tuple[str, str], ...]] = {}
        for st in {s for s in state_at if s is not None}:
            for name, labels in states[st]:
                d = dict(labels)
                if name == "fabricscope_infiniband_peer_info" and d.get("device") == dev:
                    peer[st] = tuple(
                        (k, d[k]) for k in ("device", "peer_guid", "peer_port", "port")
                    )
        vals: list[float | None] = []
        for i, st in enumerate(state_at):
            t = i * step
            v = per_hour * t / 3600
            if cable and cable[1] == dev and t > cable[0]:
                v += 300 / 60 * (t - cable[0])
            vals.append(
                float(min(int(v), SYMBOL_ERROR_MAX))
                if st is not None and st in peer and v >= 1
                else None
            )
        labels = next(iter(peer.values()), None)
        if labels is not None:
            w.series(
                "fabricscope_infiniband_peer_port_symbol_errors_total",
                _labels(sorted(labels + inst)),
                vals,
            )


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
        w.series(
            "fabricscope_gpu_pcie_link_generation_degraded",
            _labels(sorted((("gpu", str(g)), *inst))),
            [
                BUSY_PCIE_GENERATION_DEGRADED
                if alive(i) and not (state_at[i] == "lost" and str(g) == LOST_GPU)
                else None  # a lost GPU answers no generation
                for i in range(len(times))
            ],
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
    fleet_nccl.write_job_nccl(
        w.series, (*pod, ("job_name", job), *inst), RAILS, GPUS,
        [alive(i) for i in range(len(times))], bypassed=bypassed,
    )  # fmt: skip
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
    pairs = fleet_probe.pair_rounds(p, seed)
    faulty = {f.node for f in p.faults}
    samples = series = 0
    for k in range(0, len(p.nodes), chunk):
        om = work / f"fleet-{k}.om"
        w = Writer(om, t0, steps, step)
        for n in p.nodes[k : k + chunk]:
            write_node(w, n, states, steps, rng, probe=pairs[n.name], faulty=n.name in faulty)
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
