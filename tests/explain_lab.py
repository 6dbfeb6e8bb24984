"""A small scenario lab for ``fabricscope explain`` tests and its benchmark, until the shared
lab (``tests/lab``, issue 9) lands: real exposition turned into a real Prometheus TSDB.

Where the series come from:
- InfiniBand/RoCE ports and PCI: the real agent (``agent --once``) on the ``dgx-h100``
  fixture tree (8x ConnectX-7 + 4x ConnectX-6 Dx, RoCE); NVLink and GPU series: the real
  agent replaying the recorded 2x H200 NVML answers (``tests/fixtures/nvml``). Names,
  labels and the starting values are the agent's own.
- netdev (netlink and ethtool cannot be replayed from a file tree), pod attribution,
  workload, probe and throughput series: written here with the catalog's own specs
  (names and label order from ``exporter/*.py``; throughput names from CONTRACT.md).
Counters then advance step by step at the rates a scenario sets (healthy background noise
included), and the whole history is backfilled with ``promtool tsdb create-blocks-from
openmetrics`` and served by a real Prometheus.

Every scenario runs a 4-node job (``node-00``.. as ``instance``, pods ``llm-<n>`` in
namespace ``training``, job_name ``llm``) in its own 2-hour slot of one TSDB, so one
backfill and one Prometheus serve all of them.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from agent.workload.findings import PROCESS_FINDING_KINDS
from exporter.metrics import attribution, netdev, nvml, probe, ras, workload
from exporter.metrics.spec import MetricSpec

ROOT = Path(__file__).resolve().parent
DGX = ROOT / "fixtures" / "dgx-h100" / "sys"
NVML_RECORDING = ROOT / "fixtures" / "nvml" / "h200x2.recording.json"
PROMTOOL = "promtool"

GOOD_TPS = 55803.1245  # the founding story's figures (CONTRACT.md)
BAD_TPS = 36769.6582
NAMESPACE = "training"
JOB = "llm"

#: families the template keeps from the agent's output (what explain reads, plus identity)
KEEP = {
    f"fabricscope_infiniband_port_{n}"
    for n in (
        "symbol_errors_total",
        "receive_errors_total",
        "receive_remote_physical_errors_total",
        "link_error_recovery_total",
        "link_downed_total",
        "local_link_integrity_errors_total",
        "up",
        "transmit_wait_total",
        "transmitted_bytes_total",
        "received_bytes_total",
        "cnp_sent_total",
        "cnp_handled_total",
        "ecn_marked_roce_packets_total",
        "transmit_discards_total",
        "out_of_sequence_total",
        "local_ack_timeout_errors_total",
        "info",
        # the port's rate and width (constant gauges; explain's lane speed is their ratio)
        "rate_bytes_per_second",
        "link_width",
    )
} | {
    "fabricscope_infiniband_device_info",
    "fabricscope_pci_device_info",
    "fabricscope_pci_link_width",
    "fabricscope_pci_link_width_degraded",
    "fabricscope_pci_link_speed_transfers_per_second",
    "fabricscope_pci_link_speed_degraded",
    "fabricscope_nvlink_up",
    "fabricscope_nvlink_errors_total",
    "fabricscope_gpu_nvlinks_up",
    "fabricscope_gpu_nvlink_errors_total",
    "fabricscope_gpu_info",
    "fabricscope_gpu_pcie_current_link_width",
    "fabricscope_gpu_pcie_replays_total",
    "fabricscope_gpu_lost",
    "fabricscope_gpu_clocks_event_active",
}

CX7 = ("mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")


@dataclass(frozen=True, slots=True)
class Planted:
    """The cause a scenario plants, as data tests assert on."""

    cause: str  # a key of exporter.explain.checks.CAUSES
    node: str
    device: str  # the substring the finding's device names (mlx5_3/1, GPU 1, llm-2, ...)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    planted: Planted | None
    slow: bool = True  # does throughput drop at the change?


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("healthy", None, slow=False),
        Scenario("ib_link_bad", Planted("ib_link", "node-02", "mlx5_3/1")),
        Scenario("roce_incast", Planted("roce_congestion", "node-01", "mlx5_0/1")),
        Scenario("nvlink_errors", Planted("nvlink", "node-03", "GPU 1")),
        Scenario("pcie_x8_nic", Planted("pcie", "node-01", "0000:4d:00.0")),
        Scenario("wrong_numa", Planted("misplacement", "node-02", "llm-2"), slow=False),
        # the founding story: one pod's NCCL settings differ from the others' (Kubernetes)
        Scenario("nccl_env_differs", Planted("nccl_config", "node-01", "NCCL_IB_HCA")),
        # NCCL's RAS names a rank on node-02 GPU 1 unresponsive; that GPU logged an XID
        Scenario("nccl_rank_stuck", Planted("nccl_rank", "node-02", "GPU 1")),
    )
}


@dataclass(slots=True)
class Line:
    name: str  # sample name (counters with _total)
    family: str
    kind: str  # counter | gauge
    labels: dict[str, str]
    value: float
    rate: Callable[[float], float] | None = None  # counters: per second at t
    gauge: Callable[[float], float] | None = None  # gauges: value at t
    slot: tuple[float, float, float] = (0.0, 0.0, 60.0)  # start, seconds, step
    active: Callable[[float], bool] | None = None  # the series exists at t (default: always)


def agent_template() -> list[tuple[str, str, str, dict[str, str], float]]:
    """(sample name, family, type, labels, value) from two real ``agent --once`` runs."""
    import shutil
    import tempfile

    from agent.snapshot import NVML_RECORDING as IN_SNAPSHOT
    from agent.snapshot import capture

    out = []
    with tempfile.TemporaryDirectory(prefix="explain-lab-") as tmp:
        # the fixture's hw_counters come from an InfiniBand-linked mlx5 without the RoCE
        # congestion counters: a copy gets them (at 0), as a RoCE ConnectX-7 has them
        sysfs = Path(tmp, "sys")
        shutil.copytree(DGX, sysfs, symlinks=True)
        for hw in sysfs.glob("class/infiniband/*/ports/*/hw_counters"):
            for counter in ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets"):
                (hw / counter).write_text("0\n")
        snap = f"{tmp}/nvml.tar.gz"
        Path(tmp, "empty").mkdir()
        capture(f"{tmp}/empty", [], snap, extra={IN_SNAPSHOT: NVML_RECORDING.read_bytes()})
        common = [
            "--no-sampler.attribution",
            "--no-sampler.workload",
            "--no-sampler.netdev",
            "--kubelet.pod-resources-socket=",
            "--log.level=error",
            # as shipped: healthy NVLinks fold into per-GPU series (a down link, or a link
            # whose error counters move, gets its own series: planted below)
            "--collector.detail=default",
        ]
        runs = [
            ["--path.sysfs", str(sysfs), "--no-sampler.nvml", *common],
            ["--snapshot", snap, "--no-sampler.infiniband", "--no-sampler.pci", *common],
        ]
        for args in runs:
            text = subprocess.run(
                [sys.executable, "-m", "exporter.cli", "agent", "--once", *args],
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            ).stdout
            every = [
                (s.name, fam.name, fam.type, dict(s.labels), s.value)
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
            ]
            samples = [row for row in every if row[0] in KEEP] + _busy_gpu_generation(every)
            # every PCI device's identity and links, as the agent exports them (54 devices,
            # 20 links with a width and speed); NVLink error reasons crc_data and ecc_data
            # left out as before
            out += [row for row in samples if row[3].get("reason") not in ("crc_data", "ecc_data")]
    return out


def _busy_gpu_generation(
    rows: list[tuple[str, str, str, dict[str, str], float]],
) -> list[tuple[str, str, str, dict[str, str], float]]:
    """``fabricscope_gpu_pcie_link_generation_degraded`` as the agent exports it for a GPU
    that runs compute processes (the lab's pods hold every GPU; the NVML recording was
    taken with none running, when the agent leaves it out): current generation below the
    maximum, both the recording's own (:func:`agent.nvml.findings.
    generation_degraded_under_load`'s rule)."""
    cur, top = nvml.PCIE_CURRENT_GENERATION.name, nvml.PCIE_MAX_GENERATION.name
    gen: dict[str, dict[str, float]] = {}
    for name, _, _, labels, value in rows:
        if name in (cur, top):
            gen.setdefault(labels["gpu"], {})[name] = value
    spec = nvml.PCIE_GENERATION_DEGRADED
    return [
        (spec.name, spec.name, "gauge", {"gpu": gpu}, float(g[cur] < g[top]))
        for gpu, g in sorted(gen.items())
        if cur in g and top in g
    ]


def _spec_labels(spec: MetricSpec, **values: str) -> dict[str, str]:
    if set(values) != set(spec.labels):
        raise ValueError(f"{spec.name}: labels {sorted(values)} != {sorted(spec.labels)}")
    return dict(values)


def _family(spec: MetricSpec) -> str:
    return spec.name.removesuffix("_total") if spec.type == "counter" else spec.name


def node_lines(
    template: list[tuple[str, str, str, dict[str, str], float]],
    scenario: Scenario,
    *,
    node: int,
    nodes: int,
    change: float,
    rng: random.Random,
) -> list[Line]:
    """One node's series; ``change`` is the fault's onset in seconds from the slot's start."""
    inst = f"node-{node:02d}"
    pod = f"{JOB}-{node}"
    after = lambda t: t >= change  # noqa: E731
    lines: list[Line] = []
    tp = lambda t: (BAD_TPS if scenario.slow and after(t) else GOOD_TPS) / GOOD_TPS  # noqa: E731
    netdevs: dict[str, str] = {}
    gpu_uuid: dict[str, str] = {}
    planted = scenario.planted
    here = planted is not None and planted.node == inst
    for name, family, kind, raw_labels, value in template:
        labels = dict(raw_labels, instance=inst)
        dev, prt, gpu = labels.get("device"), labels.get("port"), labels.get("gpu")
        line = Line(name, family, kind, labels, value)
        bare = name.removeprefix("fabricscope_infiniband_port_").removesuffix("_total")
        noise = rng.uniform(0.0, 0.3) / 60  # background error rate, well below significance
        if name == "fabricscope_infiniband_port_info" and labels.get("netdev"):
            netdevs[labels["netdev"]] = labels["device"]
        if name == "fabricscope_gpu_info":
            gpu_uuid[labels["gpu"]] = labels.get("uuid", "")
        if name.startswith("fabricscope_infiniband_port_") and kind == "counter":
            bad_port = here and planted is not None and f"{dev}/{prt}" == planted.device
            if bare in ("transmitted_bytes", "received_bytes"):
                line.rate = lambda t: 40e9 * tp(t)
            elif bare == "transmit_wait":
                line.rate = lambda t: 40e9 / 4 * 0.01 * tp(t)
            elif scenario.name == "ib_link_bad" and bad_port and bare == "symbol_errors":
                line.rate = lambda t, n=noise: 300 / 60 if after(t) else n
            elif scenario.name == "ib_link_bad" and bad_port and bare == "receive_errors":
                line.rate = lambda t, n=noise: 40 / 60 if after(t) else n
            elif scenario.name == "ib_link_bad" and bad_port and bare == "link_error_recovery":
                line.rate = lambda t: 1 / 600 if after(t) else 0.0
            elif scenario.name == "roce_incast" and bare in ("cnp_sent", "ecn_marked_roce_packets"):
                line.rate = lambda t, b=bad_port: 20000.0 if b and after(t) else 5.0
            elif scenario.name == "roce_incast" and bare == "cnp_handled":
                line.rate = lambda t, b=dev in CX7 and not here: 900.0 if after(t) and b else 5.0
            elif bare in ("symbol_errors", "receive_errors"):
                line.rate = lambda t, n=noise: n
            else:
                line.rate = lambda t: 0.0
        elif kind == "counter":
            if name == "fabricscope_gpu_nvlink_errors_total":
                bad = scenario.name == "nvlink_errors" and here and gpu == "1"
                bad = bad and labels.get("reason") == "replay"
                line.rate = lambda t, b=bad: 600 / 60 if b and after(t) else 0.0
            else:
                line.rate = lambda t: 0.0
        elif (
            name == "fabricscope_gpu_nvlinks_up"
            and scenario.name == "nvlink_errors"
            and here
            and gpu == "1"
        ):
            line.gauge = lambda t, v=value: v - 1 if after(t) else v
        elif (
            name in ("fabricscope_pci_link_width", "fabricscope_pci_link_width_degraded")
            and scenario.name == "pcie_x8_nic"
            and here
            and planted is not None
            and labels.get("pci_bus_id") == planted.device
        ):
            new = 8.0 if name.endswith("width") else 1.0
            line.gauge = lambda t, v=value, n=new: n if after(t) else v
        lines.append(line)
    if scenario.name == "nvlink_errors" and here:
        # GPU 1's link 3 goes down and counts replays: below full detail its own series
        # exist from then on (the per-GPU sums above carry the change from the start)
        link = {"gpu": "1", "link": "3", "instance": inst}
        lines.append(
            Line(
                nvml.NVLINK_UP.name,
                nvml.NVLINK_UP.name,
                "gauge",
                dict(link),
                0.0,
                gauge=lambda t: 0.0,
                active=after,
            )
        )
        lines.append(
            Line(
                nvml.NVLINK_ERRORS.name,
                _family(nvml.NVLINK_ERRORS),
                "counter",
                dict(link, reason="replay"),
                0.0,
                rate=lambda t: 600 / 60 if after(t) else 0.0,
                active=after,
            )
        )
    # netdev: the RoCE interfaces of the node (netlink/ethtool: not replayable from files)
    for nd, dev in sorted(netdevs.items()):
        incast = scenario.name == "roce_incast" and here and dev == "mlx5_0"
        for direction in ("rx", "tx"):
            for queue in ("0", "3"):
                share = 0.3 if incast and direction == "tx" and queue == "3" else 0.0005
                lines.append(
                    Line(
                        netdev.PFC_PAUSE_DURATION.name,
                        _family(netdev.PFC_PAUSE_DURATION),
                        "counter",
                        _spec_labels(
                            netdev.PFC_PAUSE_DURATION, netdev=nd, direction=direction, queue=queue
                        )
                        | {"instance": inst},
                        0.0,
                        rate=lambda t, s=share, i=incast: s if (after(t) or not i) else 0.0005,
                    )
                )
            for spec in (netdev.PHY_DISCARDS, netdev.DROPPED):
                lines.append(
                    Line(
                        spec.name,
                        _family(spec),
                        "counter",
                        _spec_labels(spec, netdev=nd, direction=direction) | {"instance": inst},
                        0.0,
                        rate=lambda t: 0.0,
                    )
                )
    # attribution: the pod holds the node's GPUs and its eight ConnectX-7 HCAs
    for gpu, uuid in sorted(gpu_uuid.items()):
        pci = f"0000:{0x19 + int(gpu):02x}:00.0"
        labels = _spec_labels(
            attribution.POD_GPU_INFO,
            namespace=NAMESPACE,
            pod=pod,
            container="trainer",
            gpu=gpu,
            uuid=uuid,
            pci_bus_id=pci,
            method="podresources",
            claim="",
            mig="",
        )
        lines.append(
            Line(
                attribution.POD_GPU_INFO.name,
                attribution.POD_GPU_INFO.name,
                "gauge",
                labels | {"instance": inst},
                1.0,
            )
        )
        misplaced = scenario.name == "wrong_numa" and here
        for spec in (workload.CPU_GPU_NUMA_MISMATCH, workload.CPU_NIC_NUMA_MISMATCH):
            labels = _spec_labels(spec, gpu=gpu, namespace=NAMESPACE, pod=pod, container="trainer")
            lines.append(
                Line(
                    spec.name,
                    spec.name,
                    "gauge",
                    labels | {"instance": inst},
                    1.0 if misplaced else 0.0,
                )
            )
        # the workload sampler's per-kind process counts (0 for every kind without one):
        # the misplaced pod's CPUs are all off its GPUs' NUMA node; no scenario's NCCL
        # settings give an NCCL finding (nccl_env_differs's =mlx5_0 names an HCA of the
        # node, on NUMA node 0 as the pod's GPUs 0000:19:00.0 and 0000:1a:00.0)
        for kind in PROCESS_FINDING_KINDS:
            labels = _spec_labels(
                workload.FINDING_PROCESSES,
                kind=kind,
                gpu=gpu,
                namespace=NAMESPACE,
                pod=pod,
                container="trainer",
            )
            off = misplaced and kind == "process_cpus_off_gpu_numa"
            lines.append(
                Line(
                    workload.FINDING_PROCESSES.name,
                    workload.FINDING_PROCESSES.name,
                    "gauge",
                    labels | {"instance": inst},
                    1.0 if off else 0.0,
                )
            )
        # nccl_env_differs: the planted pod restarts at the change with one HCA only
        restarted = scenario.name == "nccl_env_differs" and here
        env = [
            ("NCCL_IB_HCA", "=" + ",".join(CX7), (lambda t: not after(t)) if restarted else None),
            ("NCCL_SOCKET_IFNAME", "eth0", None),
        ]
        if restarted:
            env.append(("NCCL_IB_HCA", "=mlx5_0", after))
        for var, val, active in env:
            labels = _spec_labels(
                workload.NCCL_ENV_INFO,
                gpu=gpu,
                namespace=NAMESPACE,
                pod=pod,
                container="trainer",
                variable=var,
                value=val,
            )
            lines.append(
                Line(
                    workload.NCCL_ENV_INFO.name,
                    workload.NCCL_ENV_INFO.name,
                    "gauge",
                    labels | {"instance": inst},
                    1.0,
                    active=active,
                )
            )
    for dev in CX7:
        labels = _spec_labels(
            attribution.POD_RDMA_INFO,
            namespace=NAMESPACE,
            pod=pod,
            container="trainer",
            resource="rdma/ib",
            device_id=dev,
            device=dev,
            pci_bus_id="",
            claim="",
            pf_device="",
            pf_pci_bus_id="",
        )
        lines.append(
            Line(
                attribution.POD_RDMA_INFO.name,
                attribution.POD_RDMA_INFO.name,
                "gauge",
                labels | {"instance": inst},
                1.0,
            )
        )
    # probes: this node against the next one, all_reduce at 64 MiB
    peer = f"node-{(node + 1) % nodes:02d}"
    labels = _spec_labels(
        probe.BUSBW,
        collective="all_reduce",
        peer=peer,
        gpu="0",
        peer_gpu="0",
        size_bytes="67108864",
    )
    lines.append(
        Line(
            probe.BUSBW.name,
            probe.BUSBW.name,
            "gauge",
            labels | {"instance": inst},
            45e9,
            gauge=lambda t: 45e9 * (1 + rng.uniform(-0.03, 0.03)),
        )
    )
    # NCCL's RAS: every node's own address; the job's rank-0 node (node-00) asks and, from the
    # change, names rank 9 (node-02, NVML GPU 1, the recorded victim's pid) unresponsive; that
    # GPU logs one XID 79 (fallen off the bus) two minutes in
    address = f"10.0.0.{node + 1}"
    lines.append(
        Line(
            ras.NODE_ADDRESS.name,
            ras.NODE_ADDRESS.name,
            "gauge",
            _spec_labels(ras.NODE_ADDRESS, host=address, netdev="eth0") | {"instance": inst},
            1.0,
        )
    )
    if scenario.name == "nccl_rank_stuck" and node == 0:
        labels = _spec_labels(
            ras.RANK_INFO,
            namespace=NAMESPACE,
            job_name=JOB,
            ras_endpoint="127.0.0.1:28028",
            rank="9",
            state="unresponsive",
            host="10.0.0.3",
            pid="5170",
            gpu="1",
            pci_bus_id="",
            pod="",
        )
        lines.append(
            Line(
                ras.RANK_INFO.name,
                ras.RANK_INFO.name,
                "gauge",
                labels | {"instance": inst},
                1.0,
                active=after,
            )
        )
    if scenario.name == "nccl_rank_stuck" and here:
        xid = _spec_labels(nvml.XID_ERRORS, gpu="1", reason="79") | {"instance": inst}
        lines.append(
            Line(
                nvml.XID_ERRORS.name,
                _family(nvml.XID_ERRORS),
                "counter",
                xid,
                0.0,
                # one event over a minute that holds one sample, whatever float fuzz `change`
                # carries (7200 * 0.55 is not 3960 exactly)
                rate=lambda t: 1 / 60 if change + 90 <= t < change + 150 else 0.0,
            )
        )
    # throughput: every rank prints it (Composer format), with noise and checkpoint dips
    tp_labels = {
        "namespace": NAMESPACE,
        "pod": pod,
        "container": "trainer",
        "job_name": JOB,
        "format": "composer",
        "instance": inst,
    }
    base_tps = GOOD_TPS if scenario.name != "wrong_numa" else 51200.0

    def tokens(t: float) -> float:
        dip = 0.6 if int(t) % 1800 < 30 else 1.0  # a checkpoint every 30 min
        return base_tps * tp(t) * dip * (1 + rng.gauss(0, 0.01))

    lines.append(
        Line(
            "fabricscope_throughput_tokens_per_second",
            "fabricscope_throughput_tokens_per_second",
            "gauge",
            tp_labels,
            0.0,
            gauge=tokens,
        )
    )
    return lines


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def points(line: Line) -> Iterator[tuple[float, float]]:
    """The line's samples over its slot: counters advance at their rate, gauges follow
    their function (computed while written: a 64-node, 6-hour run is never in memory)."""
    t0, seconds, step = line.slot
    v = line.value
    for i in range(int(seconds // step) + 1):
        t = i * step
        if line.rate is not None:
            if i:
                v += line.rate(t) * step
        elif line.gauge is not None:
            v = line.gauge(t)
        if line.active is None or line.active(t):
            yield t0 + t, v


def openmetrics(lines: list[Line]) -> Iterator[str]:
    by_family: dict[str, list[Line]] = {}
    for line in lines:
        by_family.setdefault(line.family, []).append(line)
    for family, group in sorted(by_family.items()):
        yield f"# TYPE {family} {group[0].kind}\n"
        for line in group:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(line.labels.items()))
            head = f"{line.name}{{{lab}}} "
            yield "".join(f"{head}{v!r} {t:.3f}\n" for t, v in points(line))
    yield "# EOF\n"


@dataclass(frozen=True, slots=True)
class Slot:
    scenario: Scenario
    start: float
    end: float
    change: float  # absolute time of the planted change


def build(
    out_dir: Path,
    *,
    scenarios: tuple[str, ...] = tuple(SCENARIOS),
    nodes: int = 4,
    hours: float = 2.0,
    step: float = 60.0,
    t0: float | None = None,
    seed: int = 7,
    promtool_timeout: float | None = 600,
) -> tuple[Path, list[Slot]]:
    """Backfill a TSDB under ``out_dir``/tsdb with each scenario in its own slot.
    ``promtool_timeout``: seconds for the backfill (None: no limit, for benchmark builds of
    thousands of node-hours on a slow machine)."""
    import time

    rng = random.Random(seed)
    template = agent_template()
    seconds = hours * 3600
    slot_len = math.ceil(seconds / 3600 + 1) * 3600
    if t0 is None:
        t0 = math.floor(time.time() / 3600) * 3600 - slot_len * len(scenarios) - 3600
    out_dir.mkdir(parents=True, exist_ok=True)
    text_path = out_dir / "lab.om"
    slots = []
    # OpenMetrics wants one family's samples together: gather every slot, then write
    lines: list[Line] = []
    for k, name in enumerate(scenarios):
        sc = SCENARIOS[name]
        start = t0 + k * slot_len
        change = seconds * 0.55
        for node in range(nodes):
            node_set = node_lines(template, sc, node=node, nodes=nodes, change=change, rng=rng)
            for line in node_set:
                line.slot = (start, seconds, step)
            lines.extend(node_set)
        slots.append(Slot(sc, start, start + seconds, start + change))
    with text_path.open("w") as fh:
        fh.writelines(openmetrics(lines))
    tsdb = out_dir / "tsdb"
    subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(text_path), str(tsdb)],
        check=True,
        capture_output=True,
        timeout=promtool_timeout,
    )
    text_path.unlink()
    return tsdb, slots
