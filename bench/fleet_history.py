"""A fleet's history in a real Prometheus TSDB: N DGX-class nodes over some hours, with the
background a large fleet always has and a few planted hardware faults.

Where the series come from. Every node state is what the real agent (``agent --once``)
exports for a variant of the DGX H100 fixture tree (``tests/fixtures/dgx-h100``: 8
ConnectX-7 compute rails, set to InfiniBand as on an InfiniBand compute fabric, and 4
ConnectX-6 Dx Ethernet ports) with the recorded 2x H200 NVML answers
(``tests/fixtures/nvml``) whose per-GPU series are repeated for 8 GPUs:

==================  ===========================================================================
``healthy``         the tree as captured
``saturated-K``     K compute rails' 32-bit ``port_xmit_wait`` at 2^32-1, where the hardware
                    stops it (what every congested ConnectX-7 port reaches within seconds)
``disabled``        6 ports administratively disabled (``1: DOWN``, ``3: Disabled``): 0.1 % of
                    a 500-node fleet's 6,000 ports, on one node
``rate``            a rail retrained at ``200 Gb/sec (2X NDR)`` (the planted degraded port)
``x8``              a rail's ConnectX-7 retrained at PCIe x8 (the planted NIC at x8)
``lost``            GPU 1 answers GPU_IS_LOST, after XID 79 (the planted lost GPU)
==================  ===========================================================================

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

import json
import math
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.snapshot import NVML_RECORDING as IN_SNAPSHOT  # noqa: E402
from agent.snapshot import capture  # noqa: E402
from exporter.metrics import attribution, netdev  # noqa: E402
from tests.promharness import PROMTOOL  # noqa: E402

DGX = ROOT / "tests" / "fixtures" / "dgx-h100" / "sys"
NVML_RECORDING = ROOT / "tests" / "fixtures" / "nvml" / "h200x2.recording.json"
RULES = ROOT / "deploy" / "rules"
FLEET_BOARD = ROOT / "dashboards" / "boards" / "fleet.py"

#: the eight ConnectX-7 compute rails of the DGX tree (InfiniBand here) and the four
#: ConnectX-6 Dx Ethernet ports
RAILS = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")
ETHERNET = ("mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8")
GPUS = 8
SATURATED_MAX = 4294967295  # 2^32 - 1: a 32-bit PMA counter the hardware stopped
#: the 0.1 % of a 500-node fleet's ports, all on one node
DISABLED_PORTS = ("mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8", "mlx5_10", "mlx5_11")
RATE_PORT = "mlx5_5"  # the planted degraded port (2X NDR)
X8_NIC = ("mlx5_3", "0000:3c:00.0")  # the planted NIC at PCIe x8: device, PCI function
LOST_GPU = "1"
BAD_CABLE_PORT = "mlx5_4"

#: NVIDIA's application XIDs that jobs cause every day (deploy/rules/hardware.rules.yaml)
APP_XIDS = ("13", "31", "43", "45")


# --- the agent's series for each node state ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    counter: bool


def referenced_families() -> set[str]:
    """Metric names the shipped rules and the Fleet dashboard read."""
    text = "".join(p.read_text() for p in sorted(RULES.glob("*.rules.yaml")))
    text += FLEET_BOARD.read_text()
    return set(re.findall(r"\bfabricscope_[a-z0-9_]+", text)) | {"fabricscope_build_info"}


def _write(tree: Path, rel: str, text: str) -> None:
    (tree / rel).write_text(text)


def _pci(tree: Path, bdf: str) -> Path:
    return (tree / "bus" / "pci" / "devices" / bdf).resolve()


def _healthy(tree: Path) -> None:
    """Undo the fixture's five documented faults (its PROVENANCE.md): a fleet node is healthy
    unless this history makes it otherwise. The ACS redirect (fault 3) is left: its series
    need CAP_SYS_ADMIN (``capabilities.acs``), which the chart does not grant by default,
    so the fleet has none (:func:`agent_states` drops them)."""
    nic = _pci(tree, "0000:5e:00.0")  # fault 1: mlx5_5's NUMA node rewritten to 1
    (nic / "numa_node").write_text("0\n")
    (nic / "local_cpulist").write_text("0-79\n")
    for bdf in ("0000:37:01.0", "0000:38:00.0"):  # fault 2: the switch uplink at x8
        (_pci(tree, bdf) / "current_link_width").write_text("16\n")
    port = "class/infiniband/mlx5_11/ports/1"  # fault 4: mlx5_11 DOWN
    _write(tree, f"{port}/state", "4: ACTIVE\n")
    _write(tree, f"{port}/phys_state", "5: LinkUp\n")
    _write(tree, f"{port}/rate", "400 Gb/sec (4X NDR)\n")
    # fault 5, mlx5_6's saturated counters (a real dump): mlx5_0's values, as on every
    # other port of the fixture; the saturated-4 state keeps the dump
    src = tree / "class/infiniband/mlx5_0/ports/1/counters"
    for f in src.iterdir():
        _write(tree, f"class/infiniband/mlx5_6/ports/1/counters/{f.name}", f.read_text())


def _variant_tree(base: Path, name: str) -> Path:
    """The DGX tree for ``name`` (rails set to InfiniBand, as on an InfiniBand fabric)."""
    tree = base / name / "sys"
    shutil.copytree(DGX, tree, symlinks=True)
    dump = {
        f.name: f.read_text() for f in (tree / "class/infiniband/mlx5_6/ports/1/counters").iterdir()
    }
    _healthy(tree)
    for dev in RAILS:
        _write(tree, f"class/infiniband/{dev}/ports/1/link_layer", "InfiniBand\n")
    if name.startswith("saturated-"):
        for dev in RAILS[: int(name.split("-")[1])]:
            _write(
                tree,
                f"class/infiniband/{dev}/ports/1/counters/port_xmit_wait",
                f"{SATURATED_MAX}\n",
            )
        if name == "saturated-4":  # the real dump: four counters of four widths stopped
            for f, text in dump.items():
                _write(tree, f"class/infiniband/mlx5_6/ports/1/counters/{f}", text)
    elif name == "disabled":
        for dev in DISABLED_PORTS:
            _write(tree, f"class/infiniband/{dev}/ports/1/state", "1: DOWN\n")
            _write(tree, f"class/infiniband/{dev}/ports/1/phys_state", "3: Disabled\n")
    elif name == "rate":
        _write(tree, f"class/infiniband/{RATE_PORT}/ports/1/rate", "200 Gb/sec (2X NDR)\n")
    elif name == "x8":
        (_pci(tree, X8_NIC[1]) / "current_link_width").write_text("8\n")
    return tree


def _recording(base: Path, name: str) -> Path:
    """The NVML recording for ``name``: as recorded, or GPU 1 lost after XID 79."""
    data = json.loads(NVML_RECORDING.read_text())
    if name == "lost":
        identity = ("UUID", "Name", "PciInfo", "Index", "Serial", "MinorNumber", "Handle")
        for key in data["calls"]:
            fn, _, args = key.partition("(")
            if args.split(",")[0].rstrip(")") == LOST_GPU and not any(i in fn for i in identity):
                data["calls"][key] = {"error": "GPU_IS_LOST", "code": 15}
        data["events"] = [{"gpu": int(LOST_GPU), "xid": 79}]
    path = base / name / "nvml.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def _agent_once(args: Sequence[str]) -> str:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", "agent", "--once", "--log.level=error", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        cwd=ROOT,
    ).stdout


def _parse(text: str, keep: set[str]) -> list[Sample]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in keep or s.name.endswith(("_created",)):
                continue
            out.append(
                Sample(
                    s.name, tuple(sorted(s.labels.items())), float(s.value), fam.type == "counter"
                )
            )
    return out


def _eight_gpus(samples: list[Sample]) -> list[Sample]:
    """The recorded node has 2 GPUs; a DGX has 8: GPU 0's series stand for GPUs 2-7."""
    out = list(samples)
    for s in samples:
        labels = dict(s.labels)
        if labels.get("gpu") != "0":
            continue
        for g in range(2, GPUS):
            clone = dict(labels, gpu=str(g))
            if "uuid" in clone:
                clone["uuid"] = clone["uuid"][:-1] + str(g)
            out.append(Sample(s.name, tuple(sorted(clone.items())), s.value, s.counter))
    return out


STATES = ("healthy", "saturated-1", "saturated-2", "saturated-4", "disabled", "rate", "x8", "lost")


def agent_states(work: Path, keep: set[str], *, acs: bool = False) -> dict[str, list[Sample]]:
    """Each node state's series, from the real agent (two runs a state: sysfs, NVML); with
    ``acs``, the ACS series of a fleet that grants ``capabilities.acs`` (the tree's bridges
    with the redirect on, as the fixture was captured: a BIOS default every node shares)."""
    common = [
        "--no-sampler.attribution",
        "--no-sampler.workload",
        "--no-sampler.netdev",
        "--kubelet.pod-resources-socket=",
        "--collector.detail=default",
    ]

    def run(name: str) -> list[Sample]:
        tree = _variant_tree(work, name)
        rec = _recording(work, name)
        snap = work / name / "nvml.tar.gz"
        (work / name / "empty").mkdir(exist_ok=True)
        capture(str(work / name / "empty"), [], str(snap), extra={IN_SNAPSHOT: rec.read_bytes()})
        sysfs = _agent_once(["--path.sysfs", str(tree), "--no-sampler.nvml", *common])
        nvml = _agent_once(
            ["--snapshot", str(snap), "--no-sampler.infiniband", "--no-sampler.pci", *common]
        )
        out = _parse(sysfs, keep) + _eight_gpus(_parse(nvml, keep))
        return [x for x in out if acs or x.name != "fabricscope_pci_acs_p2p_redirect_enabled"]

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(STATES, pool.map(run, STATES), strict=True))


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
    # netdev (netlink/ethtool: modelled): PFC pause on the Ethernet ports' lossless class
    for nd in ("ens40f0np0", "ens40f1np1", "ens31f0np0", "ens31f1np1"):
        for direction, r in (("rx", rng.uniform(0, 20)), ("tx", rng.uniform(0, 20))):
            lab = _labels(sorted((("netdev", nd), ("direction", direction), ("queue", "3"), *inst)))
            w.series(
                netdev.PFC_PAUSE_FRAMES.name,
                lab,
                [
                    None if state_at[i] is None else float(int(r * (t - boot_at[i])))
                    for i, t in enumerate(times)
                ],
            )
        w.series(
            netdev.PAUSE_STORM_ERRORS.name,
            _labels(sorted((("netdev", nd), *inst))),
            [None if s is None else 0.0 for s in state_at],
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
        _job_series(w, n, job=job, pod_name=pod, span=(start, None), state_at=state_at, rng=rng)


def _job_series(
    w: Writer,
    n: NodePlan,
    *,
    job: str,
    pod_name: str,
    span: tuple[float, float | None],
    state_at: Sequence[str | None],
    rng: random.Random,
) -> None:
    """The job's pod on this node: its 8 GPUs, and its throughput as every rank prints it,
    from ``span[0]`` until ``span[1]`` (None: the history's end)."""
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
