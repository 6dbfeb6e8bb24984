"""The cases of ``bench/explain_accuracy.py``: the classes, a case drawn from a seed
(``make_case``: the job's leaves and spines, its background, its faults) and its series
(``node_series``, ``write_case``: the OpenMetrics promtool backfills). What a case holds and
why is in explain_accuracy.py's opening docstring; this module only draws and writes it."""

from __future__ import annotations

import math
import random
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import explain_lab  # noqa: E402

NAMESPACE = "training"
JOB = "llm"
STEP = 60.0
WINDOW = 1440.0  # 24 minutes
SLOT = 3 * 3600.0  # one case per 3 hours of the TSDB (staleness and ranges never overlap)
TRICKLE = 0.5  # the background symbol-error trickles' highest rate, errors a minute
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
    trickle: float = 0.5  # the background trickles' highest rate, errors a minute

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
        # a failing spine errs on its links to 2 or 3 of the job's leaves (at any fabric
        # size: the hardest, two erring uplinks among 70 leaves), or to 5-30 % of them
        share = math.ceil(len(case.leaves) * rng.uniform(0.05, 0.3))
        few = rng.choice((2, 2, 3))
        k = min(len(case.leaves), few if rng.random() < 0.5 else max(few, share))
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


def make_case(seed: int, idx: int, cls: str, nodes: int, trickle: float = TRICKLE) -> Case:
    """Case ``idx`` of a run of ``seed``: ``cls`` on a job of ``nodes`` nodes, its background
    symbol-error trickles of up to ``trickle`` errors a minute (the same ports and the same
    draws whatever ``trickle`` is: a stronger background scales the default one)."""
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
        trickle=trickle,
    )
    for _ in range(max(1, nodes * 8 // 40)):
        case.trickles[(rng.randrange(nodes), rng.choice(CX7))] = rng.uniform(0, trickle) / 60
        case.far_trickles[(rng.randrange(nodes), rng.choice(CX7))] = rng.uniform(0, trickle) / 60
    for _ in range(max(1, len(leaves) * spines // 10)):
        key = (rng.randrange(len(leaves)), rng.randrange(spines))
        case.uplink_trickles[key] = rng.uniform(0, trickle) / 60
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
        elif name in (
            "fabricscope_pci_link_speed_transfers_per_second",
            "fabricscope_pci_link_speed_degraded",
        ):
            # a NIC's PCIe speed halves (Gen5 32 GT/s to Gen4 16): the agent's gauges at the
            # default detail, the speed and its below-both-ends flag
            f = kinds.get("nic_pcie")
            if (
                f is not None
                and f.get("kind") == "s"
                and labels.get("pci_bus_id") == _bus(template, f.get("dev"))
            ):
                new = value / 2 if name.endswith("second") else 1.0
                kw["val"] = lambda t, v=value, n=new: n if after(t) else v
        add(family, kind, name, labels, **kw)
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


def cases_for(
    seed: int, count: int, sizes: list[int], classes: list[str], trickle: float = TRICKLE
) -> list[Case]:
    """``count`` cases over ``classes`` in turn; sizes drawn so the largest come up rarely
    (each size about half as often as the one below it)."""
    rng = random.Random(seed)
    weights = [0.5**k for k in range(len(sizes))]
    out = []
    for i in range(count):
        cls = classes[i % len(classes)]
        nodes = rng.choices(sizes, weights)[0]
        out.append(make_case(seed, i, cls, nodes, trickle))
    return out


Template = list[tuple[str, str, str, dict[str, str], float]]
