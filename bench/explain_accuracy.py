"""``fabricscope explain`` measured as fault-localisation papers measure it: many injected
faults of many kinds, randomly placed, near the noise floor, over jobs of 64 to 1,024 nodes;
top-1 accuracy, recall, localisation, false causes on healthy windows and seconds per answer,
per class, with every miss listed.

Where the series come from: every node carries what the real agent (``agent --once``)
exports for the DGX H100 fixture tree and the recorded 2x H200 NVML answers (the template of
``tests/explain_lab.py``: 12 RDMA ports, PCI links, 2 GPUs with 18 NVLinks each); the series
no fixture replays (netdev PFC, pod attribution, NUMA placement, NCCL channels and RAS, the
ibpeer sampler's cable ends and uplinks, throughput) are written with the catalog's names and
labels. Each case is one job in its own slot of one TSDB (``promtool tsdb create-blocks-from
openmetrics``, one run per case), served by a real Prometheus; explain runs in process on
each case's window with nothing but the job and the window, as an SRE would run it.

A case (``make_case``, everything drawn from ``random.Random(seed)``):

* the job: ``nodes`` nodes (64 to 1,024) under leaves of uneven size (each node's eight
  compute ports under one leaf), every leaf cabled once to each of 2 to 8 spines;
* the background every case has: symbol-error trickles (Poisson, 0-0.5/min) on a few
  percent of ports at both cable ends and on some uplinks, a steady xmit_wait share,
  PFC and CNP chatter, throughput noise with checkpoint dips, and in a third of cases a
  gap of several minutes in one or two nodes' data;
* the fault (none for ``healthy``; two of different classes on different nodes for
  ``two_faults``), starting at the change, on a random node, port, GPU, leaf or spine, its
  magnitude drawn from 1.5 to 8 times its check's significance (log-uniform): near the
  noise floor, not far above it;
* the job's throughput falls 8-35 % at the change (not for ``healthy`` and ``numa``).

Scoring, per case: **top-1**: the first finding that stands out is a planted cause, on
the planted device; **recall**: the planted causes standing out anywhere, on their device,
over all planted causes; **localisation**: of the cases whose first finding has the planted
cause, those naming the planted device; **false causes**: healthy cases with any finding
standing out; seconds per answer: explain's own time in process (the Prometheus on the
same machine).

    python bench/explain_accuracy.py [--seed 1] [--cases 105] [--sizes 64,128,256,1024]
        [--workdir DIR] [--json out.json] [--markdown out.md] [--classes a,b]
        [--min-top1 0.9 --max-false 0.1]  (exit 1 below them: CI's slice)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from exporter.explain.client import ClientSettings, PrometheusClient  # noqa: E402
from exporter.explain.discover import JobSpec  # noqa: E402
from exporter.explain.report import ExplainError, Report, explain  # noqa: E402
from tests import explain_lab  # noqa: E402

NAMESPACE = "training"
JOB = "llm"
STEP = 60.0
WINDOW = 1440.0  # 24 minutes
SLOT = 3 * 3600.0  # one case per 3 hours of the TSDB (staleness and ranges never overlap)
CX7 = explain_lab.CX7
GOOD_TPS = explain_lab.GOOD_TPS

#: the classes and the cause explain must name for each
CLASSES: dict[str, str] = {
    "port_errors": "ib_link",
    "cable_far_end": "ib_link",
    "leaf": "switch",
    "spine": "switch",
    "ib_congestion": "ib_congestion",
    "roce_congestion": "roce_congestion",
    "nvlink_errors": "nvlink",
    "nvlink_bypass": "nccl_nvlink",
    "nic_pcie": "pcie",
    "gpu_pcie": "pcie",
    "numa": "misplacement",
    "nccl_socket": "nccl_transport",
    "hung_rank": "nccl_rank",
    "healthy": "",
    "two_faults": "",
}
SINGLE = [c for c in CLASSES if c not in ("healthy", "two_faults")]


@dataclass(frozen=True, slots=True)
class Fault:
    cls: str
    cause: str
    node: int  # -1: a switch fault
    device: str  # what the finding's device must contain (with the node's name)
    magnitude: float  # multiples of its check's significance
    detail: tuple[tuple[str, str], ...] = ()

    def get(self, k: str) -> str:
        return dict(self.detail).get(k, "")


@dataclass(slots=True)
class Case:
    idx: int
    cls: str
    nodes: int
    faults: list[Fault]
    leaves: list[list[int]]  # node indices per leaf
    spines: int
    drop: float  # throughput's relative drop at the change
    change: float  # seconds into the window
    gaps: list[tuple[int, float, float]]  # (node, from, to) seconds into the window
    trickles: dict[tuple[int, str], float]  # (node, device) -> errors/s, local end
    far_trickles: dict[tuple[int, str], float]  # at the switch end
    uplink_trickles: dict[tuple[int, int], float]  # (leaf, spine) -> errors/s
    seed: int = 0
    start: float = 0.0

    def leaf_of(self, node: int) -> int:
        for i, members in enumerate(self.leaves):
            if node in members:
                return i
        raise KeyError(node)


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def pod_name(i: int) -> str:
    return f"{JOB}-{i}"


def leaf_guid(i: int) -> str:
    return f"0x{0xB00000 + i:016x}"


def spine_guid(i: int) -> str:
    return f"0x{0xC00000 + i:016x}"


def _loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _fault(rng: random.Random, cls: str, case: Case, avoid: set[int]) -> Fault:
    """One fault of ``cls`` on a random place of ``case`` (not on the nodes in ``avoid``)."""
    free = [i for i in range(case.nodes) if i not in avoid]
    node = rng.choice(free)
    mag = _loguniform(rng, 1.5, 8.0)
    cause = CLASSES[cls]
    inst = node_name(node)
    if cls in ("port_errors", "cable_far_end", "ib_congestion", "roce_congestion"):
        dev = rng.choice(CX7)
        return Fault(cls, cause, node, f"{inst} {dev}/1", mag, (("dev", dev),))
    if cls == "leaf":
        big = [i for i, m in enumerate(case.leaves) if len(m) >= 3 and not set(m) & avoid]
        lf = rng.choice(big or [case.leaf_of(node)])
        return Fault(cls, cause, -1, f"leaf{lf + 1} ", mag, (("leaf", str(lf)),))
    if cls == "spine":
        sp = rng.randrange(case.spines)
        # a failing spine errs on its links to 2 or 3 leaves, or to 5-30 % of a large
        # fabric's leaves: two erring uplinks among 70 leaves are, to any test, as likely
        # two cables (docs/explain.md, "what it cannot tell apart")
        share = math.ceil(len(case.leaves) * rng.uniform(0.05, 0.3))
        k = min(len(case.leaves), max(rng.choice((2, 2, 3)), share))
        hit = rng.sample(range(len(case.leaves)), k=k)
        return Fault(
            cls,
            cause,
            -1,
            f"spine{sp + 1} ",
            mag,
            (("spine", str(sp)), ("leaves", ",".join(map(str, hit)))),
        )
    if cls in ("nvlink_errors", "gpu_pcie", "hung_rank"):
        gpu = rng.choice(("0", "1"))
        return Fault(cls, cause, node, f"{inst} GPU {gpu}", mag, (("gpu", gpu),))
    if cls == "nic_pcie":
        dev = rng.choice(CX7)
        return Fault(cls, cause, node, inst, mag, (("dev", dev), ("kind", rng.choice("ws"))))
    if cls in ("numa", "nvlink_bypass", "nccl_socket"):
        return Fault(cls, cause, node, pod_name(node) + " ", mag)
    raise ValueError(cls)


def make_case(seed: int, idx: int, cls: str, nodes: int) -> Case:
    rng = random.Random(f"{seed}-{idx}-{cls}-{nodes}")
    leaves: list[list[int]] = []
    i = 0
    while i < nodes:
        n = min(nodes - i, rng.randint(4, 24))
        leaves.append(list(range(i, i + n)))
        i += n
    spines = rng.randint(2, 8)
    case = Case(
        idx,
        cls,
        nodes,
        [],
        leaves,
        spines,
        drop=rng.uniform(0.08, 0.35),
        change=WINDOW * rng.uniform(0.45, 0.7),
        gaps=[],
        trickles={},
        far_trickles={},
        uplink_trickles={},
        seed=seed,
    )
    for _ in range(max(1, nodes * 8 // 40)):
        case.trickles[(rng.randrange(nodes), rng.choice(CX7))] = rng.uniform(0, 0.5) / 60
        case.far_trickles[(rng.randrange(nodes), rng.choice(CX7))] = rng.uniform(0, 0.5) / 60
    for _ in range(max(1, len(leaves) * spines // 10)):
        key = (rng.randrange(len(leaves)), rng.randrange(spines))
        case.uplink_trickles[key] = rng.uniform(0, 0.5) / 60
    if rng.random() < 1 / 3:
        for _ in range(rng.choice((1, 2))):
            at = rng.uniform(0.1, 0.85) * WINDOW
            case.gaps.append((rng.randrange(nodes), at, at + rng.uniform(3, 8) * STEP))
    if cls == "healthy":
        case.drop = 0.0
    elif cls == "two_faults":
        a, b = rng.sample(SINGLE, 2)
        first = _fault(rng, a, case, set())
        taken = {first.node} | (set(case.leaves[int(first.get("leaf"))]) if a == "leaf" else set())
        case.faults = [first, _fault(rng, b, case, taken)]
    else:
        case.faults = [_fault(rng, cls, case, set())]
    if cls == "numa":  # a misplaced job is slow from its start: no drop in the window
        case.drop = 0.0
    return case


# --- series ------------------------------------------------------------------------------


@dataclass(slots=True)
class S:
    """One series: its exposition head, kind, start value and how it moves: ``inc(t)`` per
    step (counters, may draw Poisson counts) or ``val(t)`` (gauges); ``alive(t)``."""

    family: str
    kind: str
    head: str
    value: float = 0.0
    inc: Callable[[float], float] | None = None
    val: Callable[[float], float] | None = None
    alive: Callable[[float], bool] | None = None


def _lab(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{explain_lab._escape(v)}"' for k, v in sorted(labels.items()))


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, round(rng.gauss(lam, math.sqrt(lam))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def node_series(
    case: Case,
    node: int,
    template: list[tuple[str, str, str, dict[str, str], float]],
    rng: random.Random,
) -> list[S]:
    """Every series of one node of ``case``."""
    inst = node_name(node)
    pod = pod_name(node)
    ch = case.change
    after = lambda t: t >= ch  # noqa: E731
    mine = [f for f in case.faults if f.node == node]
    kinds = {f.cls: f for f in mine}
    gaps = [(a, b) for n, a, b in case.gaps if n == node]
    up = (lambda t: not any(a <= t < b for a, b in gaps)) if gaps else None
    drop = case.drop
    tp = lambda t: 1.0 - drop if after(t) else 1.0  # noqa: E731
    out: list[S] = []

    def add(family: str, kind: str, name: str, labels: dict[str, str], **kw: object) -> None:
        labels = dict(labels, instance=inst)
        out.append(S(family, kind, f"{name}{{{_lab(labels)}}} ", **kw))  # type: ignore[arg-type]

    def counts(rate: Callable[[float], float]) -> Callable[[float], float]:
        return lambda t: _poisson(rng, rate(t) * STEP)

    gpu_uuid: dict[str, str] = {}
    netdevs: dict[str, str] = {}
    for name, family, kind, raw, value in template:
        labels = dict(raw)
        dev, gpu = labels.get("device", ""), labels.get("gpu", "")
        if name == "fabricscope_gpu_info":
            gpu_uuid[gpu] = labels.get("uuid", "")
        if name == "fabricscope_infiniband_port_info" and labels.get("netdev"):
            netdevs[labels["netdev"]] = dev
        bare = name.removeprefix("fabricscope_infiniband_port_").removesuffix("_total")
        kw: dict[str, object] = {"value": value}
        if kind == "counter":
            rate: Callable[[float], float] = lambda t: 0.0  # noqa: E731
            if name.startswith("fabricscope_infiniband_port_"):
                data = 40e9 if dev in CX7 else 2e9
                if bare in ("transmitted_bytes", "received_bytes"):
                    rate = lambda t, d=data: d * tp(t) * rng.uniform(0.97, 1.03)  # noqa: E731
                elif bare == "transmit_wait":
                    base = 0.01
                    f = kinds.get("ib_congestion")
                    hit = f is not None and f.get("dev") == dev
                    bad = base + (f.magnitude * 0.05 if f is not None and hit else 0.0)
                    share = lambda t, b=bad, h=hit, o=base: b if h and after(t) else o  # noqa: E731
                    # wait ticks per second for that share of (ticks + 4-byte words)
                    rate = lambda t, d=data, s=share: d / 4 * s(t) / (1 - s(t))  # noqa: E731
                elif bare == "symbol_errors":
                    trickle = case.trickles.get((node, dev), 0.0)
                    f = kinds.get("port_errors")
                    extra = f.magnitude / 60 if f is not None and f.get("dev") == dev else 0.0
                    rate = lambda t, tr=trickle, e=extra: tr + (e if after(t) else 0.0)  # noqa: E731
                    kw["inc"] = counts(rate)
                    add(family, kind, name, labels, **kw)
                    continue
                elif bare in ("cnp_sent", "ecn_marked_roce_packets"):
                    f = kinds.get("roce_congestion")
                    hit = f is not None and f.get("dev") == dev
                    bad = 100.0 * (f.magnitude if f is not None else 0) * 1.5
                    rate = lambda t, h=hit, b=bad: b if h and after(t) else 5.0  # noqa: E731
                elif bare == "cnp_handled":
                    rate = lambda t: 5.0  # noqa: E731
            elif name == "fabricscope_gpu_nvlink_errors_total":
                f = kinds.get("nvlink_errors")
                hit = f is not None and f.get("gpu") == gpu and labels.get("reason") == "replay"
                bad = (f.magnitude if f is not None else 0) / 60
                kw["inc"] = counts(lambda t, h=hit, b=bad: b if h and after(t) else 0.0)
                add(family, kind, name, labels, **kw)
                continue
            kw["inc"] = lambda t, r=rate: r(t) * STEP
        elif name == "fabricscope_gpu_pcie_current_link_width":
            f = kinds.get("gpu_pcie")
            if f is not None and f.get("gpu") == gpu:
                kw["val"] = lambda t, v=value: v / 2 if after(t) else v
        elif name in ("fabricscope_pci_link_width", "fabricscope_pci_link_width_degraded"):
            f = kinds.get("nic_pcie")
            if (
                f is not None
                and f.get("kind") == "w"
                and labels.get("pci_bus_id") == _bus(template, f.get("dev"))
            ):
                new = 8.0 if name.endswith("width") else 1.0
                kw["val"] = lambda t, v=value, n=new: n if after(t) else v
        add(family, kind, name, labels, **kw)
    # a NIC's PCIe speed: the agent's gauges at the default detail (speed, degraded flag)
    f = kinds.get("nic_pcie")
    for dev in CX7:
        bus = _bus(template, dev)
        slow = f is not None and f.get("kind") == "s" and f.get("dev") == dev
        add(
            "fabricscope_pci_link_speed_transfers_per_second",
            "gauge",
            "fabricscope_pci_link_speed_transfers_per_second",
            {"pci_bus_id": bus},
            val=lambda t, s=slow: 16e9 if s and after(t) else 32e9,
        )
    # the cables' far ends (the ibpeer sampler): each compute port under the node's leaf
    lf = case.leaf_of(node)
    slot = case.leaves[lf].index(node)
    leaf_bad = next((f for f in case.faults if f.cls == "leaf" and f.get("leaf") == str(lf)), None)
    for k, dev in enumerate(CX7):
        lport = str(slot * len(CX7) + k + 1)
        ident = {"device": dev, "port": "1"}
        add(
            "fabricscope_infiniband_peer_info",
            "gauge",
            "fabricscope_infiniband_peer_info",
            dict(
                ident,
                peer_guid=leaf_guid(lf),
                peer_port=lport,
                node_type="switch",
                lid=str(100 + lf),
                peer_description=f"leaf{lf + 1}",
            ),
            value=1.0,
        )
        far = kinds.get("cable_far_end")
        extra = 0.0
        if far is not None and far.get("dev") == dev:
            extra = far.magnitude / 60
        if leaf_bad is not None:
            extra = max(extra, leaf_bad.magnitude / 60)
        trickle = case.far_trickles.get((node, dev), 0.0)
        if extra or trickle:
            for counter in ("symbol_errors", "receive_errors"):
                r = trickle if counter == "symbol_errors" else 0.0
                e = extra if counter == "symbol_errors" else extra / 4
                name = f"fabricscope_infiniband_peer_port_{counter}_total"
                add(
                    name.removesuffix("_total"),
                    "counter",
                    name,
                    dict(ident, peer_guid=leaf_guid(lf), peer_port=lport),
                    inc=counts(lambda t, r=r, e=e: r + (e if after(t) else 0.0)),
                )
    # the uplinks of the node's leaf, read by its first node
    if slot == 0:
        down = len(case.leaves[lf]) * len(CX7)
        spine_bad = next((f for f in case.faults if f.cls == "spine"), None)
        for sp in range(case.spines):
            near = (leaf_guid(lf), str(down + sp + 1))
            far_end = (spine_guid(sp), str(lf + 1))
            add(
                "fabricscope_infiniband_switch_link_info",
                "gauge",
                "fabricscope_infiniband_switch_link_info",
                {
                    "switch_guid": near[0],
                    "switch_port": near[1],
                    "switch_description": f"leaf{lf + 1}",
                    "peer_guid": far_end[0],
                    "peer_port": far_end[1],
                    "peer_description": f"spine{sp + 1}",
                },
                value=1.0,
            )
            trickle = case.uplink_trickles.get((lf, sp), 0.0)
            bad = 0.0
            if (
                spine_bad is not None
                and spine_bad.get("spine") == str(sp)
                and str(lf) in spine_bad.get("leaves").split(",")
            ):
                bad = spine_bad.magnitude / 60
            for end, r, e in ((near, trickle, 0.0), (far_end, 0.0, bad)):
                if r or e:
                    name = "fabricscope_infiniband_switch_port_symbol_errors_total"
                    add(
                        name.removesuffix("_total"),
                        "counter",
                        name,
                        {"switch_guid": end[0], "switch_port": end[1]},
                        inc=counts(lambda t, r=r, e=e: r + (e if after(t) else 0.0)),
                    )
    # netdev PFC of the RoCE ports
    for nd, dev in sorted(netdevs.items()):
        f = kinds.get("roce_congestion")
        hit = f is not None and f.get("dev") == dev
        share = 0.01 * (f.magnitude if f is not None else 0) * 1.5
        for direction in ("rx", "tx"):
            add(
                "fabricscope_netdev_pfc_pause_duration_seconds",
                "counter",
                "fabricscope_netdev_pfc_pause_duration_seconds_total",
                {"netdev": nd, "direction": direction, "queue": "3"},
                inc=lambda t, h=hit and direction == "tx", s=share: (
                    (s if h and after(t) else 0.0005) * STEP
                ),
            )
    # attribution, placement, NCCL
    jl = {"namespace": NAMESPACE, "pod": pod, "container": "trainer"}
    numa = kinds.get("numa")
    for gpu, uuid in sorted(gpu_uuid.items()):
        add(
            "fabricscope_pod_gpu_info",
            "gauge",
            "fabricscope_pod_gpu_info",
            dict(
                jl,
                gpu=gpu,
                uuid=uuid,
                pci_bus_id=f"0000:{0x19 + int(gpu):02x}:00.0",
                method="podresources",
            ),
            value=1.0,
        )
        for metric in (
            "fabricscope_workload_cpu_gpu_numa_mismatch_ratio",
            "fabricscope_workload_cpu_nic_numa_mismatch_ratio",
        ):
            add(metric, "gauge", metric, dict(jl, gpu=gpu), value=1.0 if numa else 0.0)
    for dev in CX7:
        add(
            "fabricscope_pod_rdma_info",
            "gauge",
            "fabricscope_pod_rdma_info",
            dict(jl, resource="rdma/ib", device_id=dev, device=dev, pci_bus_id=""),
            value=1.0,
        )
    nj = dict(jl, job_name=JOB)
    pair = {"pci_bus_id": "0000:19:00.0", "peer_pci_bus_id": "0000:1a:00.0"}

    def transport(metric: str, value: float, labels: dict[str, str], moved: bool, to: str) -> None:
        """NCCL's channels on the transport in ``labels``; ``moved``: on ``to`` from the
        change on (the fault planted on this node)."""
        before = (lambda t: not after(t)) if moved else None
        add(metric, "gauge", metric, labels, value=value, alive=before)
        if moved:
            moved_to = dict(labels, transport=to, **({"gdr": "0"} if "gdr" in labels else {}))
            add(metric, "gauge", metric, moved_to, value=value, alive=after)

    ib = dict(nj, transport="NET/IB", gdr="1")
    transport("fabricscope_nccl_channels", 64.0, ib, "nccl_socket" in kinds, "NET/Socket")
    pair = dict(nj, pci_bus_id="0000:19:00.0", peer_pci_bus_id="0000:1a:00.0")
    nvl = dict(pair, transport="P2P/CUMEM")
    transport("fabricscope_nccl_nvlink_peer_channels", 8.0, nvl, "nvlink_bypass" in kinds, "SHM")
    address = f"10.{node // 250}.{node % 250}.1"
    add(
        "fabricscope_nccl_ras_node_address_info",
        "gauge",
        "fabricscope_nccl_ras_node_address_info",
        {"host": address, "netdev": "eth0"},
        value=1.0,
    )
    if node == 0:
        for f in case.faults:
            if f.cls != "hung_rank":
                continue
            add(
                "fabricscope_nccl_ras_rank_info",
                "gauge",
                "fabricscope_nccl_ras_rank_info",
                {
                    "namespace": NAMESPACE,
                    "job_name": JOB,
                    "ras_endpoint": "127.0.0.1:28028",
                    "rank": str(2 * f.node + int(f.get("gpu"))),
                    "state": "unresponsive",
                    "host": f"10.{f.node // 250}.{f.node % 250}.1",
                    "pid": "5170",
                    "gpu": f.get("gpu"),
                    "pci_bus_id": "",
                    "pod": "",
                },
                value=1.0,
                alive=after,
            )
    base_tps = GOOD_TPS * (0.92 if numa else 1.0)

    def tokens(t: float) -> float:
        dip = 0.6 if int(t) % 1800 < 60 else 1.0  # a checkpoint every 30 min
        return base_tps * tp(t) * dip * (1 + rng.gauss(0, 0.01))

    add(
        "fabricscope_throughput_tokens_per_second",
        "gauge",
        "fabricscope_throughput_tokens_per_second",
        dict(nj, format="composer"),
        val=tokens,
    )
    if up is not None:
        for s in out:
            s.alive = lambda t, a=s.alive: up(t) and (a is None or a(t))  # type: ignore[misc]
    return out


def _bus(template: list[tuple[str, str, str, dict[str, str], float]], dev: str) -> str:
    for name, _, _, labels, _ in template:
        if name == "fabricscope_infiniband_device_info" and labels.get("device") == dev:
            return labels.get("pci_bus_id", "")
    return ""


def write_case(case: Case, template: list, path: Path, t0: float) -> None:  # type: ignore[type-arg]
    """The case's OpenMetrics: families together (OpenMetrics wants it), series by series."""
    rng = random.Random(f"series-{case.seed}-{case.idx}")
    by_family: dict[str, list[S]] = defaultdict(list)
    for node in range(case.nodes):
        for s in node_series(case, node, template, rng):
            by_family[s.family].append(s)
    steps = int(WINDOW // STEP) + 1
    with path.open("w") as fh:
        for family, group in sorted(by_family.items()):
            fh.write(f"# TYPE {family} {group[0].kind}\n")
            for s in group:
                v = s.value
                rows = []
                for i in range(steps):
                    t = i * STEP
                    if s.inc is not None:
                        if i:
                            v += s.inc(t)
                    elif s.val is not None:
                        v = s.val(t)
                    if s.alive is None or s.alive(t):
                        rows.append(f"{s.head}{v!r} {t0 + t:.3f}\n")
                fh.writelines(rows)
        fh.write("# EOF\n")


# --- running and scoring ---------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    case: Case
    seconds: float
    cpu: float  # explain's own CPU seconds (its threads included)
    top: list[tuple[str, str, float]]  # (cause, device, score) of the findings standing out
    error: str = ""
    top1: bool = False
    cause_top1: bool = False
    found: list[bool] = field(default_factory=list)


def matches(f: Fault, cause: str, device: str) -> bool:
    if cause != f.cause:
        return False
    if f.cls == "nic_pcie":  # "node-0003 0000:3c:00.0 (nic mlx5_3)"
        return device.startswith(f.device + " ") and f"{f.get('dev')})" in device
    return device.startswith(f.device)


def score(
    case: Case, report: Report | None, seconds: float, cpu: float, error: str = ""
) -> Outcome:
    top = [] if report is None else [(f.cause, f.device, f.score) for f in report.causes]
    out = Outcome(case, seconds, cpu, top, error)
    if not case.faults:
        out.top1 = not top and not error
        out.cause_top1 = out.top1
        return out
    if top:
        out.top1 = any(matches(f, top[0][0], top[0][1]) for f in case.faults)
        out.cause_top1 = any(top[0][0] == f.cause for f in case.faults)
    out.found = [any(matches(f, c, d) for c, d, _ in top) for f in case.faults]
    return out


def cases_for(seed: int, count: int, sizes: list[int], classes: list[str]) -> list[Case]:
    """``count`` cases over ``classes`` in turn; sizes drawn so the largest come up rarely
    (each size about half as often as the one below it)."""
    rng = random.Random(seed)
    weights = [0.5**k for k in range(len(sizes))]
    out = []
    for i in range(count):
        cls = classes[i % len(classes)]
        nodes = rng.choices(sizes, weights)[0]
        out.append(make_case(seed, i, cls, nodes))
    return out


Template = list[tuple[str, str, str, dict[str, str], float]]


def load_template(path: str) -> Template:
    """The agent's series of one node: from ``path`` (written by ``--dump-template``, for a
    machine without the agent's tools), else from two real ``agent --once`` runs."""
    if path:
        return [tuple(x) for x in json.loads(Path(path).read_text())]  # type: ignore[misc]
    return explain_lab.agent_template()


def build_case(job: tuple[Case, Template, str, str]) -> str:
    """One case into the shared TSDB directory (its own OpenMetrics file, one promtool run:
    blocks of different cases never overlap); returns a line for the log."""
    case, template, work, promtool = job
    om = Path(work) / f"case-{case.idx}.om"
    t = time.monotonic()
    write_case(case, template, om, case.start)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(Path(work) / "tsdb")],
        capture_output=True,
        text=True,
        check=False,
    )
    om.unlink()
    if done.returncode:
        raise RuntimeError(f"promtool failed on case {case.idx}: {done.stderr[-800:]}")
    return f"built case {case.idx} {case.cls} {case.nodes} nodes in {time.monotonic() - t:.0f}s"


@contextmanager
def serve(work: Path, prometheus: str) -> Iterator[str]:
    """A real Prometheus serving ``work``/tsdb (no scrapes), until the context ends."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (work / "prometheus.yml").write_text("global:\n  scrape_interval: 1m\n")
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            "--storage.tsdb.retention.time=10y",
            f"--web.listen-address=127.0.0.1:{port}",
            "--query.max-samples=200000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"prometheus did not start: {(work / 'prometheus.log').read_text()[-800:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run(args: argparse.Namespace) -> list[Outcome]:
    classes = args.classes.split(",") if args.classes else list(CLASSES)
    sizes = [int(x) for x in args.sizes.split(",")]
    cases = cases_for(args.seed, args.cases, sizes, classes)
    if args.largest:  # the timing case: the last case at the largest size
        cases[-1] = make_case(args.seed, len(cases) - 1, cases[-1].cls, max(sizes))
    template = load_template(args.template)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fs-explain-acc-"))
    shutil.rmtree(work / "tsdb", ignore_errors=True)
    (work / "tsdb").mkdir(parents=True)
    now = math.floor(time.time() / 3600) * 3600 - 3600
    t0 = now - SLOT * len(cases)
    built = time.monotonic()
    for case in cases:
        case.start = t0 + case.idx * SLOT
    jobs = [(c, template, str(work), args.promtool) for c in cases]
    # the largest first, so the pool ends together
    jobs.sort(key=lambda j: -j[0].nodes)
    with ProcessPoolExecutor(max(1, args.workers)) as pool:
        for line in pool.map(build_case, jobs):
            print(line, file=sys.stderr)
    print(f"built {len(cases)} cases in {time.monotonic() - built:.0f}s", file=sys.stderr)
    outcomes = []
    with serve(work, args.prometheus) as url:
        client = PrometheusClient(ClientSettings(url, timeout=120.0))
        for case in cases:
            t, c = time.monotonic(), time.process_time()
            report, error = None, ""
            try:
                report = explain(client, JobSpec(JOB), case.start, case.start + WINDOW)
            except ExplainError as e:
                error = str(e)
            o = score(case, report, time.monotonic() - t, time.process_time() - c, error)
            outcomes.append(o)
            mark = "ok  " if o.top1 else "MISS"
            line = (
                f"{mark} {case.idx:3d} {case.cls:16s} {case.nodes:5d} {o.seconds:6.2f}s "
                f"(cpu {o.cpu:5.2f}s) {o.top[:1]}"
            )
            print(line, file=sys.stderr)
            if args.log:  # one line per answer as it comes: a bounded run keeps what it did
                with open(args.log, "a") as fh:
                    fh.write(line + "\n")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return outcomes


def summary(outcomes: list[Outcome]) -> dict[str, object]:
    per: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        per[o.case.cls].append(o)

    def figures(os_: list[Outcome]) -> dict[str, float]:
        faulty = [o for o in os_ if o.case.faults]
        healthy = [o for o in os_ if not o.case.faults]
        planted = sum(len(o.found) for o in faulty)
        with_cause = [o for o in faulty if o.cause_top1]
        return {
            "cases": len(os_),
            "top1": sum(o.top1 for o in os_) / len(os_) if os_ else 0.0,
            "recall": sum(sum(o.found) for o in faulty) / planted if planted else float("nan"),
            "localisation": (
                sum(o.top1 for o in with_cause) / len(with_cause) if with_cause else float("nan")
            ),
            "false_causes": (
                sum(not o.top1 for o in healthy) / len(healthy) if healthy else float("nan")
            ),
            "seconds_median": sorted(o.seconds for o in os_)[len(os_) // 2] if os_ else 0.0,
            "seconds_max": max((o.seconds for o in os_), default=0.0),
            "cpu_seconds_median": sorted(o.cpu for o in os_)[len(os_) // 2] if os_ else 0.0,
            "cpu_seconds_max": max((o.cpu for o in os_), default=0.0),
        }

    by_size: dict[int, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_size[o.case.nodes].append(o)
    healthy = [o for o in outcomes if not o.case.faults]
    false = sum(not o.top1 for o in healthy)
    return {
        "all": figures(outcomes),
        "classes": {c: figures(v) for c, v in sorted(per.items())},
        "seconds_by_nodes": {
            str(n): {
                "cases": len(v),
                "seconds_max": max(o.seconds for o in v),
                "cpu_seconds_max": max(o.cpu for o in v),
            }
            for n, v in sorted(by_size.items())
        },
        "healthy": {
            "windows": len(healthy),
            "false_causes": false,
            "upper95": upper_bound(false, len(healthy)),
        },
        "misses": [
            {
                "case": o.case.idx,
                "class": o.case.cls,
                "nodes": o.case.nodes,
                "planted": [
                    f"{f.cause} {f.device.strip()} x{f.magnitude:.1f}" for f in o.case.faults
                ],
                "first": (f"{o.top[0][0]} {o.top[0][1]} {o.top[0][2]:.2f}" if o.top else "nothing"),
                "error": o.error,
            }
            for o in outcomes
            if not o.top1
        ],
    }


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate seen ``k`` times in ``n`` (the
    rate the data rules out at ``confidence``); 1.0 when nothing was seen."""
    if n == 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(60):  # bisect the binomial tail P(X <= k; p) = 1 - confidence
        p = (lo + hi) / 2
        tail = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))
        lo, hi = (p, hi) if tail > 1 - confidence else (lo, p)
    return hi


def markdown(s: dict, command: str) -> str:  # type: ignore[type-arg]
    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{100 * x:.0f} %"

    h = s["healthy"]

    lines = [
        f"`{command}`, {time.strftime('%Y-%m-%d', time.gmtime())}",
        "",
        "| class | cases | top-1 | recall | localisation | false causes | s/answer (median, max) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [*s["classes"].items(), ("**all**", s["all"])]
    for name, f in rows:
        lines.append(
            f"| {name} | {f['cases']} | {pct(f['top1'])} | {pct(f['recall'])} | "
            f"{pct(f['localisation'])} | {pct(f['false_causes'])} | "
            f"{f['seconds_median']:.1f}, {f['seconds_max']:.1f} |"
        )
    lines += [
        "",
        "Seconds per answer (the slowest; explain's own CPU seconds) by job size: "
        + ", ".join(
            f"{n} nodes {v['seconds_max']:.1f} s ({v['cpu_seconds_max']:.1f} s CPU, "
            f"{v['cases']} cases)"
            for n, v in s["seconds_by_nodes"].items()
        ),
        "",
        f"Healthy windows: {h['false_causes']} of {h['windows']} with a false cause; "
        f"the rate is below {100 * h['upper95']:.1f} % (95 % one-sided Clopper-Pearson).",
        "",
        "Every miss:",
        "",
    ]
    if not s["misses"]:
        lines.append("none")
    else:
        lines += ["| case | class | nodes | planted | ranked first |", "|---:|---|---:|---|---|"]
        for m in s["misses"]:
            first = m["first"] if not m["error"] else f"error: {m['error'][:80]}"
            lines.append(
                f"| {m['case']} | {m['class']} | {m['nodes']} | {'; '.join(m['planted'])} | "
                f"{first} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cases", type=int, default=105)
    p.add_argument("--sizes", default="64,128,256,512,1024")
    p.add_argument("--classes", default="")
    p.add_argument("--largest", action="store_true", help="the last case at the largest size")
    p.add_argument("--workdir", default="")
    p.add_argument("--workers", type=int, default=2, help="processes building cases")
    p.add_argument("--template", default="", help="the node template from --dump-template")
    p.add_argument("--dump-template", default="", help="write the node template and exit")
    p.add_argument("--prometheus", default="prometheus")
    p.add_argument("--promtool", default="promtool")
    p.add_argument("--json", default="")
    p.add_argument("--markdown", default="")
    p.add_argument("--log", default="", help="append one line per answer to this file")
    p.add_argument("--min-top1", type=float, default=0.0)
    p.add_argument("--max-false", type=float, default=1.0)
    args = p.parse_args(argv)
    if args.dump_template:
        Path(args.dump_template).write_text(json.dumps(explain_lab.agent_template()))
        return 0
    outcomes = run(args)
    s = summary(outcomes)
    command = "python bench/explain_accuracy.py " + " ".join(argv or sys.argv[1:])
    md = markdown(s, command)
    print(md)
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(md)
    all_ = s["all"]
    bad = all_["top1"] < args.min_top1 or (
        not math.isnan(all_["false_causes"]) and all_["false_causes"] > args.max_false
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
